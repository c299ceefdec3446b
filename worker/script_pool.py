"""A bounded pool of warm scorer subprocesses (``worker/script_host.py``) for one script.

Each subprocess imports the script once and then answers calls over a pipe, one call in flight
at a time; the pool runs up to ``size`` calls at once. A call that times out kills its
subprocess; one that crashes it, or that calls ``sys.exit``, leaves it dead: in every case the
sample gets one :class:`ScriptError` and the next call on that slot starts a fresh subprocess.
Each subprocess runs in a session of its own, so killing it kills what it started too.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import select
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from shared.errors import ScriptError
from shared.scorer import ScriptCall, ScriptScorer

__all__ = ["ScriptPool"]

HOST = Path(__file__).with_name("script_host.py")
START_TIMEOUT = 120.0
"""Seconds a fresh subprocess may take to import its script."""


def _death(code: int | None, scorer: ScriptScorer) -> str:
    if code is not None and code < 0:
        signum = -code
        if signum == signal.SIGXCPU:
            return f"the scorer went over its CPU limit ({scorer.cpu_seconds}s) and was stopped"
        return f"the scorer process died ({signal.Signals(signum).name})"
    return f"the scorer process exited (code {code})"


class _Slot:
    """One subprocess, started on first use and replaced after it dies or is killed."""

    def __init__(self, scorer: ScriptScorer) -> None:
        self._scorer = scorer
        self._proc: subprocess.Popen[bytes] | None = None
        self._buffer = b""
        self.started = 0
        """Subprocesses started by this slot so far."""

    def call(self, call: ScriptCall) -> str:
        proc = self._proc if self._proc is not None and self._proc.poll() is None else None
        if proc is None:
            proc = self._start()
        assert proc.stdin is not None
        request = json.dumps({"argv": call.argv, "env": call.env}) + "\n"
        try:
            proc.stdin.write(request.encode())
            proc.stdin.flush()
        except BrokenPipeError:
            self.close()
            raise ScriptError(_death(proc.wait(), self._scorer)) from None
        reply = self._read(proc, self._scorer.timeout)
        if "ok" in reply:
            return str(reply["ok"])
        if reply.get("exit"):
            self.close()
        raise ScriptError(str(reply.get("error", "the scorer answered nothing")))

    def _start(self) -> subprocess.Popen[bytes]:
        self.close()
        scorer = self._scorer
        command = [sys.executable, str(HOST), scorer.path]  # by path: the host is stdlib only
        proc = subprocess.Popen(
            [*command, str(scorer.cpu_seconds), str(scorer.memory_mb)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        self._proc, self._buffer = proc, b""
        self.started += 1
        reply = self._read(proc, START_TIMEOUT)
        if not reply.get("ready"):
            self.close()
            raise ScriptError(str(reply.get("error", "the scorer did not start")))
        return proc

    def _read(self, proc: subprocess.Popen[bytes], timeout: float) -> dict[str, Any]:
        """The next reply line; kills the subprocess on timeout, reports it if it died."""
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                self.close()
                raise ScriptError(f"the scorer timed out after {timeout:g}s and was killed")
            chunk = os.read(fd, 65536)
            if not chunk:
                code = proc.wait()
                self.close()
                raise ScriptError(_death(code, self._scorer))
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            reply = json.loads(line)
        except ValueError:
            reply = None
        if not isinstance(reply, dict):
            self.close()
            raise ScriptError("the scorer answered something that is not a reply")
        return reply

    def close(self) -> None:
        """Kill the subprocess and everything it started, and reap it."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()


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
