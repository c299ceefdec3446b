"""How much work a worker reserves: two batches' worth while its batches are short, one while
they are long.

A worker reserves (prefetches) messages so that its pool process starts the next batch the
moment it finishes one: with batches of a few milliseconds (a small model), fetching the next
message only then would leave the process idle for a round trip per batch. But every message a
worker reserves is one that a newly dispatched run waits behind (see *Fair share* in the
README): with batches of half a second, the second batch held doubled a small run's wait. So a
worker holds Celery's prefetch (two batches' worth, ``evalq.shared.queue.celery_app``) while its
recent batches all took under :data:`LONG_BATCH` seconds, and half of it (one batch's worth) once
one of its last :data:`RECENT` batches took longer. The target is set, not stepped, on the
consumer's prefetch (kombu's ``QoS``, under its lock, as Celery's own prefetch updates do), so
it cannot drift from Celery's value; Celery's event loop applies it. A message the endpoint lane
holds (:mod:`evalq.worker.lane`) is lent a place on top of that target (:meth:`Reserve.lend`)
until it is acknowledged: the lane's messages never take the places of the pool's batches.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections import deque
from typing import Any

__all__ = ["LONG_BATCH", "RECENT", "Reserve"]

log = logging.getLogger(__name__)

LONG_BATCH = 0.1
"""Seconds of a batch beyond which a worker reserves one batch's worth instead of two: the
round trip to fetch the next message then costs a few percent of a batch, at most."""
RECENT = 4
"""Batches looked back on: one long batch among them keeps the reserve at one batch's worth
(several pool processes, or a short solo or scoring batch, do not flip it back at once)."""

_RESERVES: weakref.WeakKeyDictionary[Any, Reserve] = weakref.WeakKeyDictionary()


class Reserve:
    """One worker consumer's reservation, shared by its tasks (``infer`` and ``score``)."""

    def __init__(self, consumer: Any) -> None:
        self._consumer = consumer
        self._qos: Any = None
        self._recent: deque[float] = deque(maxlen=RECENT)
        self._lent = 0
        """Places lent to the endpoint lane on the current connection's QoS."""
        self._lock = threading.Lock()

    @classmethod
    def of(cls, consumer: Any) -> Reserve:
        """The reservation of ``consumer`` (Celery's worker consumer)."""
        reserve = _RESERVES.get(consumer)
        if reserve is None:
            reserve = _RESERVES[consumer] = cls(consumer)
        return reserve

    @property
    def short(self) -> bool:
        """Whether the recent batches were all short: two batches' worth is held."""
        return all(seconds < LONG_BATCH for seconds in self._recent)

    def target(self) -> int:
        """The prefetch to hold now."""
        full = max(1, int(self._consumer.initial_prefetch_count))
        return full if self.short else max(1, full // 2)

    def finished(self, seconds: float) -> None:
        """A batch ran for ``seconds``: set the prefetch it calls for. Called in the worker's
        main process, as the pool returns the batch."""
        qos = self._current()
        with self._lock:  # the loans counted and the value set in one step (repay does both)
            self._recent.append(seconds)
            target = self.target() + self._lent
            if qos.value != target:
                with qos._mutex:
                    qos.value = target

    def _current(self) -> Any:
        """The consumer's QoS; on a new connection, Celery's prefetch again: no history and
        no loans."""
        qos = self._consumer.qos
        with self._lock:
            if qos is not self._qos:
                self._qos = qos
                self._recent.clear()
                self._lent = 0
        return qos

    def lend(self) -> Any:
        """One more place, for a message the endpoint lane holds; return the QoS it was lent
        on, for :meth:`repay`. Called in the worker's main process as the message arrives."""
        qos = self._current()
        with self._lock:
            self._lent += 1
            qos.increment_eventually()
        return qos

    def repay(self, qos: Any) -> None:
        """Give back a place :meth:`lend` lent on ``qos`` (from a lane thread); a place lent on
        a connection since closed was never counted in the new one's prefetch."""
        with self._lock:
            if qos is not self._qos or self._lent <= 0:
                return
            self._lent -= 1
            qos.decrement_eventually()
