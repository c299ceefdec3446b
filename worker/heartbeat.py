"""A worker's presence thread: publishes its heartbeat every ``EVALQ_HEARTBEAT_INTERVAL``
seconds (the evaluations and queues it serves, the messages it holds), refills the stage queues
it consumes (``infer``, ``score``) from the runs' backlogs (batches refill them as they finish;
this beat refills a queue that drained while no batch was running, after a Redis restart say)
and, while it holds the janitor's lease, sweeps every ``stall_after / 4`` seconds (at most
every 15 s).

It runs in the worker's main process from ``worker_ready`` to ``worker_shutdown``, on its own
Redis connections, so a long batch in the pool never delays a heartbeat. A worker whose main
process dies stops beating; after ``HEARTBEAT_MISSES`` intervals its heartbeat expires, and the
janitor puts the messages it held back in their queue.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from celery import Celery

from evalq.shared.connection import connect
from evalq.shared.evaluation import registered, source
from evalq.shared.guard import Guard
from evalq.shared.lm.providers import registered_providers
from evalq.shared.queue.backlog import Backlog
from evalq.shared.queue.broker import Broker
from evalq.shared.settings import Settings
from evalq.shared.store.presence import HEARTBEAT_MISSES, Presence, WorkerBeat, sweep_every
from evalq.worker.janitor import Janitor

__all__ = ["PresenceThread"]

log = logging.getLogger(__name__)


class PresenceThread(threading.Thread):
    """Heartbeat and janitor of one worker (a daemon thread of its main process)."""

    def __init__(
        self,
        app: Celery,
        settings: Settings,
        *,
        hostname: str,
        queues: list[str],
        held: Callable[[], list[str]],
        holding: Callable[[], list[str]] = list,
        prefetch: int = 2,
    ) -> None:
        super().__init__(name="evalq-presence", daemon=True)
        self._app = app
        self._settings = settings
        self._hostname = hostname
        self._queues = queues
        self._held = held
        self._holding = holding
        self._prefetch = prefetch
        self._stopping = threading.Event()
        self._guard = Guard(log, "presence").run

    def stop(self) -> None:
        """Stop beating and leave (the heartbeat is removed at once)."""
        self._stopping.set()
        self.join(timeout=10)

    def run(self) -> None:
        settings = self._settings
        client = connect(settings.redis)
        presence = Presence(client)
        backlog = Backlog(client)
        broker = Broker(self._app, connect(settings.broker_target))
        janitor = Janitor(client, broker, self._app, settings)
        every = sweep_every(settings)
        lease = max(3 * every, settings.heartbeat_interval * HEARTBEAT_MISSES)
        next_sweep = time.monotonic() + settings.heartbeat_interval
        interval = settings.heartbeat_interval

        def sweep() -> None:
            if presence.lead(self._hostname, lease):
                janitor.sweep()

        try:
            while True:
                self._guard("heartbeat", lambda: presence.beat(self._beat(), interval))
                self._guard("refill", lambda: backlog.refill(self._prefetch // 2, self._queues))
                if time.monotonic() >= next_sweep:
                    next_sweep = time.monotonic() + every
                    self._guard("janitor", sweep)
                if self._stopping.wait(interval):
                    break
        finally:
            self._guard("leave", lambda: presence.leave(self._hostname))
            broker.close()
            client.close()

    def _beat(self) -> WorkerBeat:
        code = {}
        for name in registered():
            found = source(name)
            if found is not None:
                found.stale()  # says so in the log, once per change of the file
                code[name] = found.loaded
        return WorkerBeat(
            hostname=self._hostname,
            pid=os.getpid(),
            evaluations=registered(),
            providers=registered_providers(),
            code=code,
            queues=self._queues,
            held=self._held(),
            runs=self._holding(),
            prefetch=self._prefetch,
        )
