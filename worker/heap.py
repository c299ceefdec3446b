"""The C heap of a worker process: keep memory freed between batches for the next batch.

glibc's malloc hands memory at the top of its heap back to the kernel once more than
``M_TRIM_THRESHOLD`` of it is free, and serves every allocation above ``M_MMAP_THRESHOLD`` with
its own ``mmap``, unmapped again on free. Both start at 128 KiB and rise only when the process
happens to free a large mapped block. In a worker's pool process they stayed low: each batch's
activations were given back to the kernel when the batch ended and faulted in page by page by
the next one (over a million minor page faults and about 14 heap shrinks and regrowths per
batch of 64 MiniLM rows), which made inference about 10% slower than the same model in a
plain loop. :func:`keep_freed_memory` fixes both thresholds high instead, so a batch reuses
the pages the last batch freed.
"""

from __future__ import annotations

import ctypes
import logging
import os

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "keep_freed_memory"]

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

TRIM_THRESHOLD = 256 << 20
"""Free memory at the top of the heap kept for reuse before any is given back."""
MMAP_THRESHOLD = 32 << 20
"""Allocations below this come from the heap (32 MiB is glibc's largest allowed value)."""


def keep_freed_memory() -> bool:
    """Set glibc malloc's trim and mmap thresholds for a long-running batch process.

    Does nothing (returns False) where the C library has no ``mallopt`` (not glibc) or where
    the operator set glibc's own ``MALLOC_*_`` tuning variables, which then stay in charge.
    """
    if any(name.startswith("MALLOC_") and name.endswith("_") for name in os.environ):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    done = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
    if not done:
        log.warning("mallopt refused the heap thresholds; freed memory goes back per batch")
    return done
