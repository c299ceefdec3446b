"""The endpoint lane: threads of a worker's main process for the messages of runs on endpoint
models, shared between principals.

An endpoint model's batch spends its time waiting on the model's server. In the pool it holds a
pool process (a GPU's, in a fleet) for as long as that server takes: the attack review's server
answered after 120 s, and its user's runs held every process while another user's 5-sample run
waited 120 s instead of 0.6 s. So a worker runs such messages here instead, one message per job,
on threads of its main process, each thread with its own Redis client and runtimes
(:class:`evalq.worker.state.WorkerState` is per thread); its pool processes stay with local models.
One lane per worker (consumer), for inference and scoring alike.

The lane is shared by principals (:meth:`EndpointLane.take`): one takes a second place only
while less than half the lane is taken, so it runs at most half of the threads (rounded down)
at once, and the other half goes one place a principal. So
a principal that runs nothing here finds a thread whoever else is stalled, until ``threads -
threads // 2 + 1`` principals hold places at once (3 with 4 threads, 5 with the default 8; the
first review filled 4 threads with two principals, the second with three). A message that
finds no place is not kept waiting here, where it would take one of the
worker's prefetch places and so keep another principal's message from reaching the worker: the
caller gives it back to its run's backlog (:mod:`evalq.shared.queue.backlog`), where the fair
dispatcher orders it behind the other principals' work. A message taken here is lent a prefetch
place of its own (:meth:`evalq.worker.prefetch.Reserve.lend`): what the lane holds never delays
the pool's batches.

A thread cannot be killed as a pool process is past ``EVALQ_TASK_TIME_LIMIT``; a job ends when
its requests do, each bounded by its endpoint's ``timeout`` (at most the policy's
``max_timeout``) and its tries. A warm shutdown waits for the running jobs (:meth:`close`), as
it waits for the pool's, at most that time limit.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable
from typing import Any

__all__ = ["EndpointLane"]

log = logging.getLogger(__name__)

Job = Callable[[], None]

_LANES: weakref.WeakKeyDictionary[Any, EndpointLane] = weakref.WeakKeyDictionary()


class EndpointLane:
    """``threads`` threads running jobs as a pool does (:meth:`apply_async`), started on first
    use; ``on_exit`` runs in each thread as it stops (it frees that thread's resources)."""

    def __init__(self, threads: int, on_exit: Callable[[], None]) -> None:
        self.threads = threads
        self._on_exit = on_exit
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._running: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._started: list[threading.Thread] = []
        self._closed = False

    @classmethod
    def of(cls, consumer: Any, threads: int, on_exit: Callable[[], None]) -> EndpointLane:
        """The lane of ``consumer`` (Celery's worker consumer), made on first use."""
        lane = _LANES.get(consumer)
        if lane is None:
            lane = _LANES[consumer] = cls(threads, on_exit)
        return lane

    def take(self, principal: str) -> bool:
        """Hold a place for a message of ``principal``; False (the message goes back to its
        run's backlog) when the lane is closing or full, or when ``principal`` holds a place
        already and half the lane is taken: a second place only in the first half, the other
        half one place a principal (so no principal holds more than half)."""
        with self._lock:
            held, total = self._running[principal], self._running.total()
            if self._closed or total >= self.threads or (held and total >= self.threads // 2):
                return False
            self._running[principal] += 1
            return True

    def release(self, principal: str) -> None:
        """Free a place :meth:`take` held for ``principal``."""
        with self._lock:
            self._running[principal] -= 1
            if self._running[principal] <= 0:
                del self._running[principal]

    def apply_async(
        self,
        target: Callable[..., Any],
        args: tuple[Any, ...],
        *,
        principal: str,
        accept_callback: Callable[[int, float], None],
        callback: Callable[[Any], None],
        error_callback: Callable[[Any], None],
    ) -> None:
        """Run ``target(*args)`` on a thread of the lane, in a place :meth:`take` held for
        ``principal``, with the callbacks of a pool job (in that thread); the place is free
        before ``callback`` or ``error_callback`` runs."""

        def job() -> None:
            try:
                accept_callback(os.getpid(), time.monotonic())
                result = target(*args)
            except BaseException as exc:
                self.release(principal)
                log.exception("an endpoint job raised")
                error_callback(exc)
                if not isinstance(exc, Exception):
                    raise
            else:
                self.release(principal)
                callback(result)

        self._start()
        self._jobs.put(job)

    def _start(self) -> None:
        with self._lock:
            self._started = [thread for thread in self._started if thread.is_alive()]
            while len(self._started) < self.threads:
                thread = threading.Thread(
                    target=self._serve, name=f"evalq-endpoint-{len(self._started)}", daemon=True
                )
                thread.start()
                self._started.append(thread)

    def _serve(self) -> None:
        try:
            while (job := self._jobs.get()) is not None:
                try:
                    job()
                except Exception:
                    log.exception("an endpoint job's callback raised")
        finally:
            try:
                self._on_exit()
            except Exception:
                log.exception("could not free an endpoint thread's resources")

    def close(self, timeout: float) -> int:
        """Take no more messages, and wait at most ``timeout`` seconds for the jobs already
        taken to run (a warm shutdown, before the connection closes: their messages are
        acknowledged as they end); return how many threads were still running one. A message
        whose job did not end goes back to its queue with the connection."""
        with self._lock:
            self._closed = True
            started = list(self._started)
        for _ in started:
            self._jobs.put(None)
        deadline = time.monotonic() + timeout
        for thread in started:
            thread.join(max(0.0, deadline - time.monotonic()))
        return sum(1 for thread in started if thread.is_alive())
