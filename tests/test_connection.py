"""Redis clients as :mod:`evalq.shared.connection` makes them (nothing connects here)."""

from __future__ import annotations

import pytest

from evalq.shared.connection import (
    FAILOVER_SECONDS,
    _AsyncSentinelConnection,
    _backoff,
    _SentinelConnection,
    connect,
    connect_async,
)
from evalq.shared.errors import InputError
from evalq.shared.target import Target

SENTINELS = "sentinel://127.0.0.1:1;sentinel://127.0.0.1:2"


def _waited(tries: int) -> float:
    backoff = _backoff()
    return sum(backoff.compute(n) for n in range(1, tries + 1))


def test_a_sentinel_groups_client_rides_out_a_failover_whatever_its_caller_asked() -> None:
    """A person's command (3 tries, about 0.35 s) would fail in the middle of a promotion: a
    Sentinel group's client keeps trying for at least FAILOVER_SECONDS."""
    client = connect(Target(SENTINELS, master="evalq"), retries=3)
    tries = client.get_retry()._retries  # type: ignore[union-attr]
    assert _waited(tries) >= FAILOVER_SECONDS
    assert _waited(tries - 1) < FAILOVER_SECONDS


def test_a_single_redis_keeps_the_tries_its_caller_asked_for() -> None:
    client = connect("redis://127.0.0.1:1", retries=3)
    assert client.get_retry()._retries == 3  # type: ignore[union-attr]


def test_a_sentinel_url_without_its_masters_name_is_one_line() -> None:
    with pytest.raises(InputError, match="set EVALQ_REDIS_SENTINEL_MASTER"):
        connect(SENTINELS)


def test_a_sentinel_groups_connections_ask_the_sentinels_at_each_reconnection() -> None:
    """redis-py reconnected a dropped connection to the address it had (redis/redis-py#3874):
    the old master, back as a replica, refused every retry ``READONLY``."""
    client = connect(Target(SENTINELS, master="evalq"))
    pool = client.connection_pool
    assert issubclass(pool.connection_class, _SentinelConnection)
    waits = connect_async(Target(SENTINELS, master="evalq"), max_connections=4)
    assert issubclass(waits.connection_pool.connection_class, _AsyncSentinelConnection)
