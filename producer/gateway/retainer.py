"""The gateway's retainer: a background thread of ``evalq serve`` that applies the retention
policy (:func:`evalq.shared.store.retention.retain`: the audit trim and the purge of runs past
``EVALQ_KEEP_RUNS_DAYS``) every janitor interval (:func:`evalq.shared.store.presence.sweep_every`).

It runs where the rights are: the gateway holds the ``gateway`` ACL user, which may trim
``evalq:audit`` and delete runs' facts; the workers' user may do neither. Several gateways
share one Redis: the one holding the ``evalq:retention`` lease does the work, the others wait
for it to lapse. A purge deletes runs' archive folders, so the gateway must see the archive
store (``EVALQ_ARCHIVE_URL``), as it does to read archived runs.
"""

from __future__ import annotations

import logging
import os
import socket
import threading

import redis

from evalq.shared.guard import Guard
from evalq.shared.keys import RETENTION
from evalq.shared.settings import Settings
from evalq.shared.store.presence import Lease, sweep_every
from evalq.shared.store.retention import retain

__all__ = ["Retainer"]

log = logging.getLogger("evalq.retainer")


class Retainer(threading.Thread):
    """Applies the retention policy while it holds the ``evalq:retention`` lease (a daemon
    thread; :meth:`stop` ends it)."""

    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        super().__init__(name="evalq-retainer", daemon=True)
        self._client = client
        self._settings = settings
        self._lease = Lease(client, RETENTION)
        self._holder = f"gateway-{os.getpid()}@{socket.gethostname()}"
        self._every = sweep_every(settings)
        self._stopping = threading.Event()
        self._guard = Guard(log, "retention")

    def stop(self) -> None:
        """Stop after the pass in progress."""
        self._stopping.set()
        self.join(timeout=30)

    def run(self) -> None:
        while not self._stopping.wait(self._every):
            self._guard.run("pass", self.run_once)

    def run_once(self) -> None:
        """One pass, if this gateway holds (or takes) the lease."""
        if self._lease.hold(self._holder, 3 * self._every):
            retain(self._client, self._settings, who="retention")
