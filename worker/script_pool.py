"""A bounded pool of warm scorer subprocesses (``worker/script_host.py``) for one script.

Each subprocess imports the script once and then answers calls over a pipe, one call in flight
at a time; the pool runs up to ``size`` calls at once. A call that times out kills its
subprocess; one that crashes it, or that calls ``sys.exit``, leaves it dead: in every case the
sample gets one :class:`ScriptError` and the next call on that slot starts a fresh subprocess.
Each subprocess runs in a session of its own, so killing it kills what it started too.
"""

from __future__ import annotations

import queue
import signal
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from evalq.shared.errors import ScriptError
from evalq.shared.scorer import ScriptCall, ScriptScorer
from evalq.worker.host_process import HostProcess, ended

__all__ = ["ScriptPool"]

HOST = Path(__file__).with_name("script_host.py")
START_TIMEOUT = 120.0
"""Seconds a fresh subprocess may take to import its script."""


def _death(code: int | None, scorer: ScriptScorer) -> str:
    if code == -signal.SIGXCPU:
        return f"the scorer went over its CPU limit ({scorer.cpu_seconds}s) and was stopped"
    return ended("the scorer process", code)


class _Slot:
    """One scorer subprocess (a :class:`HostProcess`), started on first use and replaced
    after it dies or is killed."""

    def __init__(self, scorer: ScriptScorer) -> None:
        self._scorer = scorer
        command = [sys.executable, str(HOST), scorer.path]  # by path: the host is stdlib only
        self._host = HostProcess(
            [*command, str(scorer.cpu_seconds), str(scorer.memory_mb)],
            name="the scorer",
            error=ScriptError,
            death=lambda code: _death(code, scorer),
            start_timeout=START_TIMEOUT,
        )

    @property
    def started(self) -> int:
        """Subprocesses started by this slot so far."""
        return self._host.started

    def call(self, call: ScriptCall) -> str:
        reply = self._host.request({"argv": call.argv, "env": call.env}, self._scorer.timeout)
        if "ok" in reply:
            return str(reply["ok"])
        if reply.get("exit"):
            self.close()
        raise ScriptError(str(reply.get("error", "the scorer answered nothing")))

    def close(self) -> None:
        """Kill the subprocess and everything it started, and reap it."""
        self._host.close()


class ScriptPool:
    """At most ``size`` warm subprocesses of one scorer script."""

    def __init__(self, scorer: ScriptScorer, size: int) -> None:
        self._slots = [_Slot(scorer) for _ in range(size)]
        self._idle: queue.SimpleQueue[_Slot] = queue.SimpleQueue()
        for slot in self._slots:
            self._idle.put(slot)
        self._executor = ThreadPoolExecutor(size, thread_name_prefix="scorer")

    @property
    def started(self) -> int:
        """Subprocesses started so far (respawns included)."""
        return sum(slot.started for slot in self._slots)

    def call(self, call: ScriptCall) -> str:
        """Run one call on a free subprocess; a failure is a :class:`ScriptError`."""
        slot = self._idle.get()
        try:
            return slot.call(call)
        finally:
            self._idle.put(slot)

    def map(self, calls: list[ScriptCall]) -> list[str | ScriptError]:
        """Run ``calls`` on the pool at once; each answer, or the error of that call."""

        def one(call: ScriptCall) -> str | ScriptError:
            try:
                return self.call(call)
            except ScriptError as exc:
                return exc

        return list(self._executor.map(one, calls))

    def close(self) -> None:
        """Stop every subprocess."""
        self._executor.shutdown(wait=True)
        for slot in self._slots:
            slot.close()
