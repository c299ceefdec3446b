"""Pacing requests to a server that pushes back: how long to wait before a retry (exponential
backoff with full jitter, or the server's ``Retry-After``), and how many requests one worker
process keeps in flight for one principal (:class:`Gate`: additive increase, multiplicative
decrease on each 429). The fleet-wide limit is :mod:`evalq.shared.store.rate`'s."""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import math
import os
import random
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import ClassVar

__all__ = ["BACKOFF_BASE", "BACKOFF_CAP", "Gate", "backoff", "retry_after"]

BACKOFF_BASE = 0.5
"""Seconds before the first retry (doubled each time, then drawn uniformly below that)."""
BACKOFF_CAP = 30.0
"""The longest wait between two tries, ``Retry-After`` included."""


class Gate:
    """How many requests one worker process has in flight to an endpoint for one principal: at
    most ``limit``, which grows by ``1 / limit`` with each success (one more per round of
    successes) and halves with each 429 (additive increase, multiplicative decrease), between
    1 and the highest ``concurrency`` among the requests asking now (waiting or in flight), so
    that a principal's runs asking 4 and 3 hold 4 in flight between them, not 7, and a run
    asking 1 after one that asked 8 has ended holds 1 (the attack reviews'). Each run's own
    requests stay within its own ``concurrency`` besides (its job's connection limit).

    One gate per endpoint and principal in a process (:meth:`of`), shared by its threads (the
    endpoint lane's run their batches at once, each in an event loop of its own): counted under
    a lock, a request at the limit waits in its own loop until one in flight ends anywhere in
    the process. A process keeps one gate per endpoint and principal it has served, each a few
    hundred bytes."""

    _gates: ClassVar[dict[tuple[str, str], Gate]] = {}
    _made = threading.Lock()

    def __init__(self) -> None:
        self.limit: float | None = None
        """The adaptive limit; None until a request sets it to its ``concurrency``."""
        self._busy = 0
        self._asking: Counter[int] = Counter()
        """The ``concurrency`` of each request waiting or in flight."""
        self._lock = threading.Lock()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    @classmethod
    def of(cls, endpoint: str, principal: str) -> Gate:
        """The process's gate for ``principal``'s requests to ``endpoint``."""
        with cls._made:
            return cls._gates.setdefault((endpoint, principal), cls())

    @classmethod
    def forget_all(cls) -> None:
        """Drop every gate (in a child right after fork: what the parent's threads had in
        flight is not the child's)."""
        cls._gates = {}
        cls._made = threading.Lock()

    def _effective(self) -> float:
        """The limit now (under the lock, with a request asking): the adaptive one, at most the
        highest ``concurrency`` asking."""
        ceiling = float(max(self._asking))
        return ceiling if self.limit is None else min(self.limit, ceiling)

    def _open(self) -> bool:
        """Whether one more may go now (under the lock)."""
        return self._busy < max(1, math.floor(self._effective()))

    @contextlib.asynccontextmanager
    async def entered(self, concurrency: int) -> AsyncIterator[Gate]:
        """In flight as one request of a run asking ``concurrency``, once the gate lets it."""
        with self._lock:
            self._asking[concurrency] += 1
        try:
            while True:
                with self._lock:
                    if self._open():
                        self._busy += 1
                        break
                    woken = asyncio.Event()
                    self._waiters.append((asyncio.get_running_loop(), woken))
                await woken.wait()
            try:
                yield self
            finally:
                with self._lock:
                    self._busy -= 1
        finally:
            with self._lock:
                self._asking[concurrency] -= 1
                if self._asking[concurrency] <= 0:
                    del self._asking[concurrency]
                waiters, self._waiters = self._waiters, []
            for loop, woken in waiters:
                with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits there now
                    loop.call_soon_threadsafe(woken.set)

    def succeeded(self) -> None:
        """A request in flight (inside :meth:`entered`) was answered: one more per round."""
        with self._lock:
            limit = self._effective()
            self.limit = min(float(max(self._asking)), limit + 1.0 / limit)

    def throttled(self) -> None:
        """A request in flight (inside :meth:`entered`) was answered 429: half as many."""
        with self._lock:  # half of what is in force, not of a bound a higher run left
            self.limit = max(1.0, self._effective() / 2.0)


os.register_at_fork(after_in_child=Gate.forget_all)


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
