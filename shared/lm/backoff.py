"""Pacing requests to a server that pushes back: how long to wait before a retry (exponential
backoff with full jitter, or the server's ``Retry-After``), and how many requests one worker
process keeps in flight (:class:`Gate`: additive increase, multiplicative decrease on each
429). The fleet-wide limit is :mod:`evalq.shared.store.rate`'s."""

from __future__ import annotations

import asyncio
import email.utils
import math
import random
import time

__all__ = ["BACKOFF_BASE", "BACKOFF_CAP", "Gate", "backoff", "retry_after"]

BACKOFF_BASE = 0.5
"""Seconds before the first retry (doubled each time, then drawn uniformly below that)."""
BACKOFF_CAP = 30.0
"""The longest wait between two tries, ``Retry-After`` included."""


class Gate:
    """How many requests one worker process has in flight to an endpoint: at most ``limit``,
    which grows by ``1 / limit`` with each success (one more per round of successes) and halves
    with each 429 (additive increase, multiplicative decrease), between 1 and ``ceiling``. The
    limit outlives a batch; the waiting is per batch (:meth:`opened`, in its event loop)."""

    def __init__(self, ceiling: int) -> None:
        self.ceiling = ceiling
        self.limit = float(ceiling)
        self._busy = 0
        self._changed: asyncio.Condition | None = None

    def opened(self) -> Gate:
        """Ready for a new batch's event loop (nothing in flight)."""
        self._busy = 0
        self._changed = asyncio.Condition()
        return self

    @property
    def _condition(self) -> asyncio.Condition:
        if self._changed is None:
            raise RuntimeError("a gate is entered only after opened(), in the batch's loop")
        return self._changed

    async def __aenter__(self) -> Gate:
        async with self._condition:
            await self._condition.wait_for(lambda: self._busy < max(1, math.floor(self.limit)))
            self._busy += 1
        return self

    async def __aexit__(self, *_: object) -> None:
        async with self._condition:
            self._busy -= 1
            self._condition.notify_all()

    def succeeded(self) -> None:
        self.limit = min(float(self.ceiling), self.limit + 1.0 / self.limit)

    def throttled(self) -> None:
        self.limit = max(1.0, self.limit / 2.0)


def retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds a ``Retry-After`` header asks for (delta-seconds or an HTTP date), capped at
    :data:`BACKOFF_CAP`; None when absent or unreadable."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value).timestamp()
        except (TypeError, ValueError):
            return None
        seconds = when - (time.time() if now is None else now)
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), BACKOFF_CAP)


def backoff(attempt: int, rng: random.Random) -> float:
    """Full jitter: uniform in ``[0, min(cap, base * 2**attempt)]``."""
    return rng.uniform(0.0, min(BACKOFF_CAP, BACKOFF_BASE * 2.0**attempt))
