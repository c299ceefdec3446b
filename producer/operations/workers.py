"""Local worker processes: what ``evalq demo`` (and the tests and benchmarks) start and stop."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Protocol

from celery import Celery
from kombu.exceptions import OperationalError
from redis import RedisError

from evalq.producer.operations.supervise import kill_group
from evalq.shared.cli import python
from evalq.shared.errors import EvalqError
from evalq.shared.settings import Settings

__all__ = ["LocalWorkers", "WorkerProcess"]


class WorkerProcess(Protocol):
    """What :class:`LocalWorkers` needs of a started worker: a :class:`subprocess.Popen` is one
    (the tests' fork server hands out another)."""

    pid: int
    args: Any

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def send_signal(self, sig: int) -> None: ...

    def wait(self, timeout: float | None = None) -> int: ...


class LocalWorkers:
    """``count`` ``evalq worker`` subprocesses against ``redis_url``, each in its own session.

    With ``EVALQ_REDIS_URL_FILE`` in ``env`` they read the URL from that file and get no
    ``EVALQ_REDIS_URL``. ``launcher`` is put before each worker's command line, and runs it
    (the tests drop every capability in one, so that a worker run as root behaves as one run
    by an ordinary user); ``cwd`` is their working directory (default: this process's)."""

    def __init__(
        self,
        redis_url: str,
        *,
        count: int = 1,
        concurrency: int = 1,
        queues: str = "infer,score",
        env: Mapping[str, str] | None = None,
        log_dir: Path | None = None,
        launcher: Sequence[str] = (),
        cwd: Path | None = None,
    ) -> None:
        self.redis_url = redis_url
        self.count = count
        self.concurrency = concurrency
        self.queues = queues
        self.env = dict(env or {})
        self.log_dir = log_dir
        self.launcher = list(launcher)
        self.cwd = cwd
        self.processes: list[WorkerProcess] = []
        self._env: dict[str, str] = {}

    def start(self, app: Celery, timeout: float = 60.0) -> LocalWorkers:
        """Start the processes and wait until each answers a ping."""
        env = {**os.environ, **self.env, "EVALQ_REDIS_URL": self.redis_url}
        env.pop("EVALQ_BROKER_URL", None)
        if env.get("EVALQ_REDIS_URL_FILE"):
            del env["EVALQ_REDIS_URL"]
        # processes sharing this machine split its cores for torch rather than oversubscribe
        share = Settings(redis_url=self.redis_url).for_processes(self.count * self.concurrency)
        if share.torch_threads is not None:
            env.setdefault("EVALQ_TORCH_THREADS", str(share.torch_threads))
        self._env = env
        for index in range(self.count):
            self.processes.append(self._spawn(index))
        try:
            self.wait_ready(app, timeout)
        except BaseException:
            self.stop()  # none is left running when start-up fails, however it fails
            raise
        return self

    def arguments(self) -> list[str]:
        """What follows ``python -m evalq.worker`` on each worker's command line."""
        return ["--queues", self.queues, "--concurrency", str(self.concurrency)]

    def _spawn(self, index: int) -> WorkerProcess:
        command = [*self.launcher, *python("-m", "evalq.worker"), *self.arguments()]
        with self._log(index) as log:
            return subprocess.Popen(
                command,
                env=self._env,
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def restart(self, index: int) -> WorkerProcess:
        """Start worker ``index`` again, as :meth:`start` started it, once its process has
        exited (what it left of its session, its pool processes, is killed first); it is not
        waited for."""
        old = self.processes[index]
        if old.poll() is None:
            raise EvalqError(f"worker {index} (pid {old.pid}) is still running")
        kill_group(old.pid)
        self.processes[index] = self._spawn(index)
        return self.processes[index]

    def log_path(self, index: int) -> Path | None:
        """Where worker ``index``'s output is appended (None: discarded)."""
        return None if self.log_dir is None else self.log_dir / f"worker-{index}.log"

    def _log(self, index: int) -> IO[bytes]:
        path = self.log_path(index)
        return open(os.devnull, "wb") if path is None else path.open("ab")

    def wait_ready(self, app: Celery, timeout: float) -> None:
        """Block until every started process answers a control ping (a broker connection
        that fails meanwhile is replaced at the next ping)."""
        deadline = time.monotonic() + timeout
        while True:
            dead = [p.args for p in self.processes if p.poll() is not None]
            if dead:
                self.stop()
                raise EvalqError(f"a worker exited during start-up: {dead[0]!r}")
            try:  # answered as soon as every process has replied, else after the timeout
                replies = app.control.ping(timeout=0.2, limit=len(self.processes)) or []
            except (OSError, RedisError, OperationalError):
                replies = []  # a pooled connection that died with a Redis restart: next one
            if len(replies) >= len(self.processes):
                return
            if time.monotonic() > deadline:
                self.stop()
                raise EvalqError(f"workers did not answer within {timeout:.0f}s")

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM every process (warm shutdown), then SIGKILL what is left after ``timeout``."""
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for process in self.processes:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self.processes = []
