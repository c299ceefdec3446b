"""A Redis Sentinel group on loopback for the failover tests: one master and one replica (AOF,
``min-replicas-to-write 1`` as ``compose.yaml`` ships them) and three ``redis-server
--sentinel`` processes, each on a free port; the master can be SIGKILLed and the dead process
started again, as a supervisor would, to rejoin as the new master's replica."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import redis

from evalq.producer.operations.redis_server import RedisServer, find_redis_server, free_port
from tests.helpers import wait_for

__all__ = ["MASTER", "SentinelGroup"]

MASTER = "evalq"
"""The name the sentinels watch the master by (``EVALQ_REDIS_SENTINEL_MASTER``)."""

DATA_OPTIONS = ["--min-replicas-to-write", "1", "--min-replicas-max-lag", "10"]
"""What every data node runs with: a master without a replica in step refuses writes."""


def _until(probe: Callable[[], bool], timeout: float, what: str) -> None:
    """:func:`tests.helpers.wait_for` on a probe of servers still starting: a probe that
    cannot reach one yet answers False."""

    def answered() -> bool:
        try:
            return probe()
        except redis.RedisError:
            return False

    wait_for(answered, timeout, what)


class SentinelGroup:
    """One master, one replica and three sentinels; see the module."""

    def __init__(self, root: Path, down_after_ms: int = 1000) -> None:
        self.root = root
        self.down_after_ms = down_after_ms
        first = RedisServer(root / "node-a", appendonly=True, options=DATA_OPTIONS)
        second = RedisServer(
            root / "node-b",
            appendonly=True,
            options=[*DATA_OPTIONS, "--replicaof", "127.0.0.1", str(first.port)],
        )
        self.nodes = [first, second]
        self.sentinel_ports = [free_port() for _ in range(3)]
        self._sentinels: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        """The group's ``sentinel://`` URL (kombu's form, one part per sentinel)."""
        return ";".join(f"sentinel://127.0.0.1:{port}/0" for port in self.sentinel_ports)

    def start(self) -> SentinelGroup:
        for node in self.nodes:
            node.start()
        _until(lambda: self._linked(self.nodes[1]), 20, "replica in sync")
        for index, port in enumerate(self.sentinel_ports):
            folder = self.root / f"sentinel-{index}"
            folder.mkdir(parents=True, exist_ok=True)
            config = folder / "sentinel.conf"
            config.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {folder}\nlogfile {folder / 'sentinel.log'}\n"
                f"sentinel monitor {MASTER} 127.0.0.1 {self.nodes[0].port} 2\n"
                f"sentinel down-after-milliseconds {MASTER} {self.down_after_ms}\n"
                f"sentinel failover-timeout {MASTER} 5000\n"
                f"sentinel parallel-syncs {MASTER} 1\n"
            )
            self._sentinels.append(
                subprocess.Popen(
                    [find_redis_server(), str(config), "--sentinel"],
                    stdout=subprocess.DEVNULL,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
        _until(self._watched, 30, "sentinels that see each other and the replica")
        return self

    def _sentinel(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, socket_timeout=1, decode_responses=True)

    def _watched(self) -> bool:
        for port in self.sentinel_ports:
            with self._sentinel(port) as sentinel:
                state = sentinel.sentinel_master(MASTER)
                if int(state["num-other-sentinels"]) < 2 or int(state["num-slaves"]) < 1:
                    return False
        return True

    @staticmethod
    def _linked(node: RedisServer) -> bool:
        with redis.Redis(port=node.port, socket_timeout=1, decode_responses=True) as client:
            info = client.info("replication")
            return bool(info["role"] == "slave" and info["master_link_status"] == "up")

    def master_port(self) -> int:
        """The port the sentinels name as the master now."""
        for port in self.sentinel_ports:
            try:
                with self._sentinel(port) as sentinel:
                    _, found = sentinel.sentinel_get_master_addr_by_name(MASTER)
                    return int(found)
            except redis.RedisError:
                continue
        raise AssertionError("no sentinel answers")

    def node(self, port: int) -> RedisServer:
        return next(node for node in self.nodes if node.port == port)

    def master(self) -> redis.Redis:
        """A plain client of the master now (no Sentinel, no retries)."""
        return redis.Redis(port=self.master_port(), socket_timeout=2, decode_responses=True)

    def kill_master(self) -> RedisServer:
        """SIGKILL the master; return its node (still dead)."""
        dead = self.node(self.master_port())
        dead.kill()
        return dead

    def failed_over(self, dead: RedisServer, timeout: float = 60.0) -> RedisServer:
        """Wait until the sentinels name another master and it takes writes; return it."""
        _until(lambda: self.master_port() != dead.port, timeout, "failover")
        return self.node(self.master_port())

    def rejoin(self, dead: RedisServer, timeout: float = 90.0) -> None:
        """Start the dead node again as the replica of the master the sentinels name (as a
        node's start script does: a sentinel would convert it too, but only after its next
        ``INFO`` poll, up to 10 s later); wait until it is in sync."""
        master = str(self.master_port())
        dead.options = [*DATA_OPTIONS, "--replicaof", "127.0.0.1", master]
        dead.start()
        try:
            _until(self._whole, timeout, "the old master back as a replica")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; {self.describe()}") from None

    def describe(self) -> str:
        """Each node's replication role and link, and the master the sentinels name: what a
        failed wait says, for the next reader of a CI log."""
        parts = []
        for node in self.nodes:
            try:
                with redis.Redis(port=node.port, socket_timeout=1, decode_responses=True) as c:
                    info = c.info("replication")
                parts.append(
                    f"node {node.port}: {info['role']}"
                    f" link={info.get('master_link_status', '-')}"
                    f" of={info.get('master_port', '-')}"
                )
            except redis.RedisError as exc:
                parts.append(f"node {node.port}: {type(exc).__name__}")
        try:
            parts.append(f"sentinels name {self.master_port()}")
        except AssertionError:
            parts.append("no sentinel answers")
        return ", ".join(parts)

    def _whole(self) -> bool:
        """Every node but the one the sentinels name as the master is its replica, in sync.
        Not "the dead node is a replica": on a loaded machine the sentinels may fail over
        again (the master missing their pings for ``down_after_ms``) once the dead node is
        back, making it the master and the other node its replica; the group is whole then
        too."""
        master = self.master_port()
        return all(self._linked(node) for node in self.nodes if node.port != master)

    def stop(self) -> None:
        for process in self._sentinels:
            process.terminate()
        for process in self._sentinels:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._sentinels = []
        for node in self.nodes:
            node.stop()
