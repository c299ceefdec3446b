"""A fork server for the tests' worker and gateway processes: one Python process per pytest
process and program that has imported what the program imports, and forks one from that state
on request.

A worker started as ``python -m evalq.worker`` spends about 1.5 s of CPU importing Celery,
kombu, ``datasets``, pyarrow and evalq before it does anything, and the suite starts close to
200 of them on a 2-core machine (a gateway, ``evalq serve``, 2.3 s, and it starts about 50). A
forked one starts from the imports already made. Only processes whose environment differs from
the server's in ``EVALQ_*`` variables alone are forked: those
are read when the worker starts (from one :class:`~evalq.shared.settings.Settings`), while
others (``HF_*`` read by ``datasets`` at import, ``MALLOC_*`` read by the C library when a
process starts, ``PYTHONPATH``) may be read at import, so a worker with any of them different
is a real subprocess (:meth:`Zygote.spawn` returns ``None`` and the caller starts one).

``python -m tests.zygote PROGRAM`` serves one of :data:`PROGRAMS`. Protocol, one JSON object per
line: the server writes ``{"ready": true}`` once imported; to each request
``{"argv": [...], "env": {...}, "log": PATH}`` on its stdin it answers ``{"pid": N}``
on its stdout, and when a child exits ``{"exit": N, "code": C}`` (``C`` as
:attr:`subprocess.Popen.returncode` has it: ``-signal`` for a signal). It exits at the end of
its stdin; its children, each in a session of its own, are not its to stop.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import runpy
import select
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

WORKER = "evalq.worker"
"""``python -m evalq.worker ARGV``."""
CLI = "evalq.shared.cli:main"
"""The ``evalq`` command, ``evalq ARGV`` (``serve`` for a gateway)."""

PROGRAMS: dict[str, tuple[str, ...]] = {
    WORKER: (
        "evalq.worker.bootstrap",
        "evalq.worker.commands",
        "evalq.shared.cli",
        "datasets",
        "celery.apps.worker",
        "celery.worker.consumer",
        "celery.concurrency.prefork",
        "kombu.transport.redis",
        "celery.backends.redis",
        "pyarrow.parquet",
    ),
    CLI: ("evalq.shared.cli", "evalq.producer.gateway.app", "uvicorn", "celery", "pyarrow.parquet"),
}
"""Each program the server runs, and what it imports on its way to work (those that cost)."""

REPO = Path(__file__).resolve().parent.parent


def base_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` but for what a process reads only once it runs: evalq's settings, and the name
    of the test pytest is running (``PYTEST_CURRENT_TEST``, which changes with every test)."""
    return {
        k: v for k, v in env.items() if not k.startswith("EVALQ_") and k != "PYTEST_CURRENT_TEST"
    }


class ForkedProcess:
    """A forked worker as :class:`subprocess.Popen` shows one: ``pid``, ``args``, ``poll``,
    ``wait`` and ``returncode`` (its exit is reported by the server, whose child it is)."""

    def __init__(self, zygote: Zygote, pid: int, args: list[str]) -> None:
        self.zygote = zygote
        self.pid = pid
        self.args = args

    @property
    def returncode(self) -> int | None:
        return self.zygote.exits.get(self.pid)

    def poll(self) -> int | None:
        return self.returncode

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def send_signal(self, sig: int) -> None:
        """As :meth:`subprocess.Popen.send_signal`: nothing once it has exited (its exit may
        not be reported yet)."""
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def wait(self, timeout: float | None = None) -> int:
        with self.zygote.changed:
            if not self.zygote.changed.wait_for(
                lambda: self.pid in self.zygote.exits or self.zygote.gone, timeout
            ):
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        if self.pid not in self.zygote.exits:
            raise RuntimeError(f"the fork server exited before worker {self.pid} did")
        return self.zygote.exits[self.pid]


Started = subprocess.Popen[bytes] | ForkedProcess
"""A process a test started, forked or not."""


class Zygote:
    """The client side: starts the server of ``program`` with ``env`` (a process's environment
    but for its ``EVALQ_*`` variables) and forks processes through it."""

    def __init__(self, program: str, env: Mapping[str, str]) -> None:
        self.program = program
        self.base = base_env(env)
        self.exits: dict[int, int] = {}
        self.gone = False
        self.refused: str | None = None
        """Why the last process it did not fork was not forked."""
        self.changed = threading.Condition()
        self._pids: list[int] = []
        self._lock = threading.Lock()
        self._server = subprocess.Popen(
            [sys.executable, "-m", "tests.zygote", program],
            env=self.base,
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._ready = threading.Event()
        self._reader.start()

    def _read(self) -> None:
        assert self._server.stdout is not None
        for line in self._server.stdout:
            message = json.loads(line)
            with self.changed:
                if "ready" in message:
                    self._ready.set()
                elif "pid" in message:
                    self._pids.append(message["pid"])
                else:
                    self.exits[message["exit"]] = message["code"]
                self.changed.notify_all()
        with self.changed:
            self.gone = True
            self._ready.set()
            self.changed.notify_all()

    def spawn(
        self, argv: Sequence[str], env: Mapping[str, str], log: Path | None
    ) -> ForkedProcess | None:
        """The program with ``ARGV``, forked with ``env`` and its output appended to ``log``
        (none: discarded); ``None`` when ``env`` differs from the server's in more than
        ``EVALQ_*`` variables, or the server is gone."""
        asked = base_env(env)
        differ = sorted(
            k for k in asked.keys() | self.base.keys() if asked.get(k) != self.base.get(k)
        )
        if differ:
            self.refused = f"its environment differs in {', '.join(differ)}"
            return None
        request = {"argv": [self.program, *argv], "env": dict(env), "log": str(log or os.devnull)}
        with self._lock:
            self._ready.wait(60)
            if self.gone:
                self.refused = f"the fork server exited ({self._server.poll()})"
                return None
            assert self._server.stdin is not None
            self._server.stdin.write(json.dumps(request).encode() + b"\n")
            self._server.stdin.flush()
            with self.changed:
                self.changed.wait_for(lambda: self._pids or self.gone, 60)
                if not self._pids:
                    self.refused = "the fork server did not answer"
                    return None
                pid = self._pids.pop(0)
        return ForkedProcess(self, pid, [self.program, *argv])

    def close(self) -> None:
        if self._server.stdin is not None:
            self._server.stdin.close()
        self._server.wait(10)


def _child(program: str, request: dict[str, Any]) -> None:
    """In the forked child: a session of its own, the request's environment and output, then
    the program (a module as ``python -m`` runs it, or a function); never returns."""
    code: int = 1
    try:
        os.setsid()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = list(request["argv"])
        module, _, function = program.partition(":")
        if function:
            getattr(importlib.import_module(module), function)()
        else:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a closed stream: nothing left to write
                stream.flush()
        os._exit(code)


def _reply(message: dict[str, Any]) -> None:
    os.write(1, json.dumps(message).encode() + b"\n")


def _reap() -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _reply({"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def main() -> None:
    program = sys.argv[1]
    for name in PROGRAMS[program]:
        importlib.import_module(name)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    _reply({"ready": True})
    pending = b""
    while True:
        try:
            readable, _, _ = select.select([0, wake_read], [], [])
        except InterruptedError:
            continue
        if wake_read in readable:
            os.read(wake_read, 4096)
            _reap()
        if 0 not in readable:
            continue
        chunk = os.read(0, 65536)
        if not chunk:
            return
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child(program, request)
            _reply({"pid": pid})


if __name__ == "__main__":
    main()
