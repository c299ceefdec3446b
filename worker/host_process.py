"""One warm helper subprocess that answers a JSON line for each JSON line it is sent: started on
first use, killed on a timeout, replaced after it dies. Scorer scripts (``script_pool.py``)
and isolated models (``model_proxy.py``) each run in one.

The subprocess runs in a session of its own, so killing it kills what it started too, in an
empty folder of its own (its working folder, ``HOME`` and ``TMPDIR``; deleted when it is
closed), with the environment of :func:`evalq.shared.isolation.child_env.child_env`: never the
worker's own, which holds the Redis URL and its password. It says ``{"ready": true}`` (or
``{"error": ...}``) once it has started, after the optional ``hello`` line; every failure here
is the caller's ``error`` type with a one-line message that names the subprocess (``name``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from evalq.shared.isolation.child_env import child_env

__all__ = ["HostProcess", "ended"]

log = logging.getLogger(__name__)


def ended(what: str, code: int | None) -> str:
    """How a subprocess ended, from its return code: ``WHAT died (SIGKILL)`` or ``WHAT exited
    (code 3)``."""
    if code is not None and code < 0:
        return f"{what} died ({signal.Signals(-code).name})"
    return f"{what} exited (code {code})"


class HostProcess:
    """A subprocess speaking JSON lines over its stdin and stdout."""

    def __init__(
        self,
        command: list[str],
        *,
        name: str,
        error: type[Exception],
        death: Callable[[int | None], str],
        start_timeout: float,
        hello: Mapping[str, Any] | None = None,
        on_ready: Callable[[int, dict[str, Any]], None] | None = None,
    ) -> None:
        """``on_ready`` is called with each started subprocess's pid and its ready reply."""
        self._command = command
        self._name = name
        self._error = error
        self._death = death
        self._start_timeout = start_timeout
        self._hello = hello
        self._on_ready = on_ready
        self._proc: subprocess.Popen[bytes] | None = None
        self._home: Path | None = None
        self._buffer = b""
        self.started = 0
        """Subprocesses started so far."""

    def start(self) -> subprocess.Popen[bytes]:
        """The live subprocess, started (and greeted) now if there is none."""
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        return self._start()

    def request(self, message: Mapping[str, Any], timeout: float) -> dict[str, Any]:
        """Send ``message``, return the reply (starting a subprocess if none is alive)."""
        line = json.dumps(message).encode() + b"\n"  # a message that is not JSON sends nothing
        proc = self.start()
        self._write(proc, line)
        return self._read(proc, timeout)

    def _start(self) -> subprocess.Popen[bytes]:
        self.close()
        self._home = Path(tempfile.mkdtemp(prefix="evalq-host-"))
        proc = subprocess.Popen(
            self._command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            cwd=self._home,
            env=child_env(self._home),
        )
        threading.Thread(target=_relay, args=(proc, self._name), daemon=True).start()
        self._proc, self._buffer = proc, b""
        self.started += 1
        if self._hello is not None:
            self._write(proc, json.dumps(self._hello).encode() + b"\n")
        reply = self._read(proc, self._start_timeout)
        if not reply.get("ready"):
            self.close()
            raise self._error(str(reply.get("error", f"{self._name} did not start")))
        if self._on_ready is not None:
            self._on_ready(proc.pid, reply)
        return proc

    def _write(self, proc: subprocess.Popen[bytes], line: bytes) -> None:
        assert proc.stdin is not None
        try:
            proc.stdin.write(line)
            proc.stdin.flush()
        except BrokenPipeError:
            self.close()
            raise self._error(self._death(proc.wait())) from None

    def _read(self, proc: subprocess.Popen[bytes], timeout: float) -> dict[str, Any]:
        """The next reply line; kills the subprocess on timeout, reports it if it died."""
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                self.close()
                raise self._error(f"{self._name} timed out after {timeout:g}s and was killed")
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                code = proc.wait()
                self.close()
                raise self._error(self._death(code))
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            reply = json.loads(line)
        except ValueError:
            reply = None
        if not isinstance(reply, dict):
            self.close()
            raise self._error(f"{self._name} answered something that is not a reply")
        return reply

    def close(self) -> None:
        """Kill the subprocess and everything it started, reap it and delete its folder."""
        proc, self._proc = self._proc, None
        home, self._home = self._home, None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        if home is not None:
            shutil.rmtree(home, ignore_errors=True)


STDERR_LINE = 1000
"""Characters of a subprocess's stderr line that reach the worker's log."""


def _relay(proc: subprocess.Popen[bytes], name: str) -> None:
    """Log what a subprocess writes to stderr, a line at a time, quoted and marked as its own:
    code in it (a caller's, in an isolated model host) never writes the worker's log itself,
    so it cannot forge a line of it."""
    assert proc.stderr is not None
    with contextlib.suppress(OSError, ValueError):
        for raw in proc.stderr:
            text = raw.decode("utf-8", "replace").rstrip("\n")[:STDERR_LINE]
            log.warning("%s (pid %d) wrote: %r", name, proc.pid, text)
