"""``evalq up``: a one-machine deployment in one command, without Docker.

It checks for a ``redis-server`` of 7.0 or newer (the ACL file needs it), generates the three
ACL users' passwords, writes the ACL file (:mod:`evalq.producer.operations.acl`) and each user's
Redis URL into a file of its own (mode 600, so no password is in any process's environment or
command line), starts Redis (AOF, ``noeviction``, the ACL file), creates an admin token once (kept
in ``secrets/admin.token``, the same at every start on the folder), then starts the gateway (user
``gateway``), the workers (user ``worker``), Flower (basic auth, its password in a file of mode
600) and ``evalq metrics`` (user ``monitor``, both on loopback), and prints where each listens
and the admin token. It supervises them (:mod:`evalq.producer.operations.supervise`): one that
exits on its own is started again after a back-off (Redis from its AOF, with the same passwords),
one that keeps exiting is left down; only Ctrl-C (or SIGTERM) stops them all.

Everything lives under one folder (``--dir``): ``redis/`` (data, AOF, ``redis.log``),
``users.acl``, ``secrets/`` (mode 700: the URL files, ``flower.auth``, ``admin.token``),
``archive/`` (unless ``EVALQ_ARCHIVE_URL`` is set), and ``logs/`` (one file per process).
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import FrameType

from rich.console import Console

from evalq.producer.operations.acl import ROLES, password_variable, write_acl
from evalq.producer.operations.redis_server import (
    RedisServer,
    find_acl_redis_server,
    refuse_taken,
    version,
)
from evalq.producer.operations.supervise import Supervisor, Unit, kill_group
from evalq.producer.operations.workers import LocalWorkers, WorkerProcess
from evalq.producer.service.client import Client
from evalq.shared.access.roles import Role
from evalq.shared.access.tokens import TokenStore
from evalq.shared.cli import python
from evalq.shared.connection import connect
from evalq.shared.errors import EvalqError
from evalq.shared.settings import Settings

__all__ = ["ADMIN", "FLOWER_USER", "Stack", "StackPorts"]

ADMIN = "admin"
"""The principal of the admin token ``evalq up`` creates."""

_EVALQ = tuple(python("-c", "from evalq.shared.cli import main; main()"))
_FLOWER = tuple(
    python("-c", "import evalq.worker.celery; from celery.__main__ import main; main()")
)
"""Celery's command line with evalq's app (and so its plugins) imported first: loading the
``-A`` app, Celery puts the working directory first on ``sys.path`` (``cwd_in_path``), where
a folder named ``evalq`` (a clone) would stand in for evalq and fail every plugin's ``from
evalq import ...``; imported before, the app is found in ``sys.modules``."""
_STOP_WAIT = 30.0
_READY_WAIT = 90.0
_CREDENTIALS = (
    "EVALQ_REDIS_URL",
    "EVALQ_REDIS_URL_FILE",
    "EVALQ_BROKER_URL",
    "EVALQ_API_URL",
    "EVALQ_TOKEN",
    "FLOWER_BASIC_AUTH",
    *(password_variable(role) for role in ROLES),
)
"""Variables of ``evalq up``'s own environment that it drops before it starts anything: each
child gets its own URL file, and none a token or an ACL password."""
FLOWER_USER = "evalq"
"""Flower's basic-auth user; its password is in ``secrets/flower.auth`` (``user:password``)."""


@dataclass(frozen=True)
class StackPorts:
    """Where the processes listen (Redis on 0: a free port)."""

    gateway: int
    flower: int
    metrics: int
    redis: int


class _Stopped(Exception):
    """SIGTERM, taken as Ctrl-C."""


def _stopped(_signal: int, _frame: FrameType | None) -> None:
    raise _Stopped


class _Child:
    """One started process (in a session of its own) and its log."""

    def __init__(self, name: str, command: list[str], env: Mapping[str, str], log: Path) -> None:
        self.name = name
        self.log = log
        self._command = command
        self._env = dict(env)
        self.process = self._spawn()

    def _spawn(self) -> subprocess.Popen[bytes]:
        with self.log.open("ab") as out:
            return subprocess.Popen(
                self._command,
                env=self._env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def exited(self) -> int | None:
        """Its exit status once it has exited (:func:`_ended`)."""
        return _ended(self.process)

    def restart(self) -> None:
        """Start it again, once it has exited."""
        self.process = self._spawn()

    def stop(self) -> None:
        """SIGTERM its process group; SIGKILL what is left after a while."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(_STOP_WAIT)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def _ended(process: WorkerProcess) -> int | None:
    """``process``'s exit status once it has exited, what is left of its session killed then
    (a worker's pool processes outlive a SIGKILLed worker); None while it runs."""
    code = process.poll()
    if code is not None:
        kill_group(process.pid)
    return code


def _worker_exited(pool: LocalWorkers, index: int) -> int | None:
    return _ended(pool.processes[index])


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


class Stack:
    """The processes of one ``evalq up``; :meth:`run` starts them and stops them."""

    def __init__(
        self, root: Path, ports: StackPorts, *, workers: int, concurrency: int, host: str
    ) -> None:
        self.root = root
        self.ports = ports
        self.workers = workers
        self.concurrency = concurrency
        self.host = host
        self._children: list[_Child] = []
        self._pool: LocalWorkers | None = None
        self._server: RedisServer | None = None

    def run(self, redis_server: str | None, console: Console) -> int:
        """Start everything, print where it listens, and supervise it until Ctrl-C; everything
        started is stopped then. Exit status 0, or 1 when a process was left down (or the
        start failed)."""
        try:
            binary = find_acl_redis_server(redis_server)
        except EvalqError as exc:
            raise EvalqError(f"{exc} (give another with --redis-server PATH)") from None
        self._refuse_taken()
        previous = signal.signal(signal.SIGTERM, _stopped)
        try:
            self._start(binary, console)
            console.print("Ctrl-C stops everything.", highlight=False)
            return self._watch(console)
        except (KeyboardInterrupt, _Stopped):
            return 0
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C cannot cut the stop
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            console.print("stopping flower, metrics, the gateway, workers and redis...")
            self._stop()
            signal.signal(signal.SIGTERM, previous)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            console.print("stopped")

    def _refuse_taken(self) -> None:
        """:class:`PortInUseError` (exit 2) before anything starts when a port is taken."""
        refuse_taken(self.ports.gateway, "the gateway, --port", self.host)
        refuse_taken(self.ports.flower, "flower, --flower-port")
        refuse_taken(self.ports.metrics, "metrics, --metrics-port")
        if self.ports.redis:
            refuse_taken(self.ports.redis, "redis, --redis-port")

    def _start(self, binary: str, console: Console) -> None:
        for folder in ("redis", "logs", "secrets"):
            (self.root / folder).mkdir(parents=True, exist_ok=True)
        (self.root / "secrets").chmod(0o700)
        passwords = {password_variable(role): secrets.token_urlsafe(24) for role in ROLES}
        write_acl(self.root / "users.acl", passwords)
        self._server = server = RedisServer(
            self.root / "redis",
            port=self.ports.redis or None,
            appendonly=True,
            aclfile=self.root / "users.acl",
            binary=binary,
        )
        server.start()
        files = {
            role: self._secret(
                f"{role}.url",
                f"redis://{role}:{passwords[password_variable(role)]}@127.0.0.1:{server.port}/0",
            )
            for role in ROLES
        }
        flower_auth = f"{FLOWER_USER}:{secrets.token_urlsafe(18)}"
        self._secret("flower.auth", flower_auth)
        shown = ".".join(map(str, version(binary)))
        console.print(
            f"redis     redis://127.0.0.1:{server.port}/0  redis-server {shown} ({binary}), "
            f"AOF in {server.data_dir}, ACL file {self.root / 'users.acl'}",
            highlight=False,
            soft_wrap=True,
        )
        base = self._env()
        operator = Settings(redis_url_file=files["gateway"], redis_url="", principal="evalq-up")
        client = Client(operator)
        try:
            token = self._admin_token(client, TokenStore(connect(operator.redis)))
            self._start_services(base, files, client, flower_auth)
        finally:
            client.close()
        self._print(console, files, token)

    def _admin_token(self, client: Client, tokens: TokenStore) -> str:
        """The admin token kept in ``secrets/admin.token`` while Redis knows it; otherwise a
        new one, kept there, the principal's earlier tokens revoked (they were in no file)."""
        kept = self.root / "secrets" / "admin.token"
        if kept.exists():
            token = kept.read_text(encoding="utf-8").strip()
            caller = tokens.caller(token)
            if caller is not None and caller.principal == ADMIN and caller.role is Role.ADMIN:
                return token
        client.revoke_tokens(ADMIN)
        token = client.create_token(ADMIN, Role.ADMIN)
        self._secret("admin.token", token)
        return token

    def _start_services(
        self, base: Mapping[str, str], files: Mapping[str, Path], client: Client, flower_auth: str
    ) -> None:
        logs = self.root / "logs"
        as_user = {
            role: {**base, "EVALQ_REDIS_URL_FILE": str(path)} for role, path in files.items()
        }
        gateway = [*_EVALQ, "serve", "--host", self.host, "--port", str(self.ports.gateway)]
        self._children.append(
            _Child("the gateway", gateway, as_user["gateway"], logs / "gateway.log")
        )
        metrics = [*_EVALQ, "metrics", "--port", str(self.ports.metrics)]
        self._children.append(_Child("metrics", metrics, as_user["monitor"], logs / "metrics.log"))
        self._pool = LocalWorkers(
            "",
            count=self.workers,
            concurrency=self.concurrency,
            env=as_user["worker"],
            log_dir=logs,
        )
        self._pool.start(client.app, timeout=_READY_WAIT)
        # after the workers: its first inspection finds them
        flower = [
            *_FLOWER,
            "-A",
            "evalq.worker.celery",
            "flower",
            f"--port={self.ports.flower}",
            "--address=127.0.0.1",
            "--persistent=False",
        ]
        flower_env = {**as_user["monitor"], "FLOWER_BASIC_AUTH": flower_auth}
        self._children.append(_Child("flower", flower, flower_env, logs / "flower.log"))
        gateway_host = "127.0.0.1" if self.host in {"0.0.0.0", "::"} else self.host
        for child, url in zip(
            self._children,
            (
                f"http://{gateway_host}:{self.ports.gateway}/openapi.json",
                f"http://127.0.0.1:{self.ports.metrics}/metrics",
                f"http://127.0.0.1:{self.ports.flower}/healthcheck",
            ),
            strict=True,
        ):
            self._wait_ready(child, url)

    def _wait_ready(self, child: _Child, url: str) -> None:
        deadline = time.monotonic() + _READY_WAIT
        while not _answers(url):
            code = child.process.poll()
            if code is not None:
                raise EvalqError(f"{child.name} exited with status {code} (its log: {child.log})")
            if time.monotonic() > deadline:
                raise EvalqError(
                    f"{child.name} did not answer {url} within {_READY_WAIT:.0f}s "
                    f"(its log: {child.log})"
                )
            time.sleep(0.1)

    def _secret(self, name: str, text: str) -> Path:
        """``text`` in ``secrets/<name>``, created with mode 600 (never readable by others,
        not even for a moment)."""
        path = self.root / "secrets" / name
        path.unlink(missing_ok=True)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as out:
            out.write(text + "\n")
        return path

    def _env(self) -> dict[str, str]:
        """The children's environment: this one's, without credentials (also dropped from
        this process's own, which :class:`LocalWorkers` passes on), the archive under the
        folder unless ``EVALQ_ARCHIVE_URL`` says otherwise."""
        for variable in _CREDENTIALS:
            os.environ.pop(variable, None)
        env = dict(os.environ)
        env.setdefault("EVALQ_ARCHIVE_URL", str(self.root / "archive"))
        return env

    def _print(self, console: Console, files: Mapping[str, Path], token: str) -> None:
        gateway = f"http://{self.host}:{self.ports.gateway}"
        lines = [
            f"gateway   {gateway}  (user gateway; OpenAPI schema at /openapi.json; "
            "applies the retention policy)",
            f"workers   {self.workers} x evalq worker --concurrency {self.concurrency}  "
            "(user worker)",
            f"flower    http://127.0.0.1:{self.ports.flower}  (user monitor; loopback; basic auth "
            f"{FLOWER_USER}:<password in {self.root / 'secrets' / 'flower.auth'}>)",
            f"metrics   http://127.0.0.1:{self.ports.metrics}/metrics  (user monitor; loopback)",
            f"logs      {self.root / 'logs'}",
            f"operator  EVALQ_REDIS_URL_FILE={files['gateway']} evalq ...  (direct mode)",
            f"admin token: {token}  (kept in {self.root / 'secrets' / 'admin.token'})",
            f"  EVALQ_API_URL={gateway} EVALQ_TOKEN=<token> evalq tokens create alice --role user",
        ]
        for line in lines:
            console.print(line, highlight=False, soft_wrap=True)

    def _watch(self, console: Console) -> int:
        """Supervise until Ctrl-C: a process that exits is started again (1 if one was left
        down by then, else 0)."""
        supervisor = Supervisor(self._units(), time.monotonic())
        pause = threading.Event()
        try:
            while True:
                for line in supervisor.check(time.monotonic()):
                    console.print(line, highlight=False, soft_wrap=True)
                pause.wait(0.5)
        except (KeyboardInterrupt, _Stopped):
            return 1 if supervisor.left_down else 0

    def _units(self) -> list[Unit]:
        """Redis, the gateway, metrics, Flower and each worker, as the supervisor sees them."""
        server, pool = self._server, self._pool
        assert server is not None  # both set by _start
        assert pool is not None
        units = [Unit("redis-server", server.data_dir / "redis.log", server.exited, server.start)]
        units += [Unit(c.name, c.log, c.exited, c.restart) for c in self._children]
        units += [
            Unit(
                f"worker {index}",
                self.root / "logs" / f"worker-{index}.log",
                partial(_worker_exited, pool, index),
                partial(pool.restart, index),
            )
            for index in range(len(pool.processes))
        ]
        return units

    def _stop(self) -> None:
        for child in reversed(self._children):
            child.stop()
        if self._pool is not None:
            self._pool.stop(_STOP_WAIT)
        if self._server is not None:
            self._server.stop(_STOP_WAIT)
