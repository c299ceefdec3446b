"""The C heap of a worker process: keep memory freed between batches for the next batch.

glibc's malloc hands memory at the top of its heap back to the kernel once more than
``M_TRIM_THRESHOLD`` of it is free, and serves every allocation above ``M_MMAP_THRESHOLD`` with
its own ``mmap``, unmapped again on free. Both start at 128 KiB and rise (to at most 64 and 32
MiB) only when the process happens to free a large mapped block, so where they end up depends
on the process's history. In a worker's pool process they stayed low enough that each batch's
memory went back to the kernel when the batch ended and the next batch faulted it in again
page by page: 1.1-1.3 million minor page faults over 8,000 MiniLM rows (about 14 ``brk``
calls per batch of 64), and end to end 0.85-0.89 of a plain loop's rate where it is 0.92-0.97
with these settings. :func:`keep_freed_memory` sets both thresholds high instead, so a batch
reuses the pages the last batch freed.
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
