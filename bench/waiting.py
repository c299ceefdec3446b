"""Waiting on runs in a benchmark: a probe polled until it holds, and a run to its end."""

from __future__ import annotations

import time
from collections.abc import Callable

from evalq.shared.models import RunMeta, RunStatus
from evalq.shared.store.runs import RunStore

__all__ = ["completed", "wait"]

POLL = 0.01
"""Seconds between two looks."""


def wait(probe: Callable[[], bool], timeout: float = 900) -> None:
    """Poll ``probe`` until it holds; :class:`TimeoutError` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise TimeoutError("a benchmark run did not finish")
        time.sleep(POLL)


def completed(runs: RunStore, meta: RunMeta) -> RunMeta:
    """The record of ``meta``'s run once it has ended; :class:`RuntimeError` unless it
    completed."""
    wait(lambda: not runs.get(meta.run_id).status.active)
    final = runs.get(meta.run_id)
    if final.status is not RunStatus.COMPLETED or final.finished is None:
        raise RuntimeError(f"run {meta.run_id} ended {final.status}")
    return final
