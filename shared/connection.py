"""Redis clients: made here, from a URL, and handed to whoever needs one.

The URL names one Redis (``redis://``, ``rediss://``, ``unix://``) or a Sentinel group
(``sentinel://h1:26379;sentinel://h2:26379;sentinel://h3:26379``, kombu's form, with the master's
name from ``EVALQ_REDIS_SENTINEL_MASTER``; user, password and database go in the first part,
``sentinel://user:password@h1:26379/0``, and are the master's). A Sentinel client asks the
sentinels for the master at each new connection (redis-py's ``redis.sentinel``), so after a
failover it reconnects to the new master by itself: the old master's connections fail, and
the client's retries (backing off from 50 ms to 2 s) open new ones; a command refused because
the master has no replica to write to (``NOREPLICAS``, see ``min-replicas-to-write``) or is
still loading is retried the same way. A Sentinel group's client retries for at least
:data:`FAILOVER_SECONDS`, however few tries its caller asked for: a failover takes that long to
agree, promote and have a replica back, and a command sent meanwhile (a person's submit
included) waits for it rather than failing half-way.

Replication is asynchronous: a write the master acknowledged can be lost if it dies before a
replica has it. Writes that must survive a failover (reservations, refunds, settles,
finalization, registry, tier and token changes) go through :func:`confirmed`, which waits
(``WAIT``) until ``replicas`` replicas hold them before they are reported done.

A command Redis refuses for the client's ACL user raises redis-py's ``NoPermissionError`` as
usual, with a message that says which user was refused which command on which keys
(:func:`refusal`): Redis's own answer names neither.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

import redis
import redis.asyncio
import redis.asyncio.sentinel
import redis.sentinel
from redis._parsers.base import BaseParser
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.retry import Retry

from evalq.shared.errors import InputError, UnconfirmedWriteError, first_line
from evalq.shared.target import Target, is_sentinel

__all__ = [
    "FAILOVER_SECONDS",
    "Target",
    "confirmed",
    "connect",
    "connect_async",
    "is_sentinel",
    "redact",
    "refusal",
    "server_time",
]

log = logging.getLogger(__name__)

T = TypeVar("T")


class NoReplicasError(redis.ResponseError):
    """``NOREPLICAS``: the master has fewer good replicas than ``min-replicas-to-write`` (one
    is being promoted or resynchronized); the write did nothing and may be tried again."""


BaseParser.EXCEPTION_CLASSES.setdefault("NOREPLICAS", NoReplicasError)
_TRANSIENT: list[type[Exception]] = [
    redis.ConnectionError,
    redis.TimeoutError,
    redis.exceptions.BusyLoadingError,
    NoReplicasError,
]
"""Errors after which the command is sent again (a new connection for the first two)."""


@dataclass(frozen=True)
class _Group:
    sentinels: list[tuple[str, int]]
    master: dict[str, Any]
    """The master's connection arguments: username, password, db."""


def _group(url: str) -> _Group:
    sentinels: list[tuple[str, int]] = []
    master: dict[str, Any] = {}
    for part in (p.strip() for p in url.split(";")):
        if not part:
            continue
        parsed = urlsplit(part)
        if parsed.scheme.lower() != "sentinel" or not parsed.hostname:
            raise ValueError("each part must be sentinel://[user:password@]host:port[/db]")
        sentinels.append((parsed.hostname, parsed.port or 26379))
        if parsed.username and "username" not in master:
            master["username"] = unquote(parsed.username)
        if parsed.password and "password" not in master:
            master["password"] = unquote(parsed.password)
        db = parsed.path.strip("/")
        if db and "db" not in master:
            master["db"] = int(db)
    if not sentinels:
        raise ValueError("no sentinel named")
    return _Group(sentinels, master)


def _target(target: str | Target) -> Target:
    return target if isinstance(target, Target) else Target(target)


def _master_name(target: Target) -> str:
    if not target.master:
        raise InputError(
            "the Redis URL names sentinels: set EVALQ_REDIS_SENTINEL_MASTER to the name of "
            "the master they watch"
        )
    return target.master


_SCRIPTS = frozenset({"EVAL", "EVALSHA", "EVAL_RO", "EVALSHA_RO", "FCALL", "FCALL_RO"})
_ALL_KEYS = frozenset({"DEL", "UNLINK", "EXISTS", "MGET", "TOUCH", "WATCH"})


def refusal(user: str, command: Sequence[Any], answer: str) -> str:
    """One line for a command Redis refused to ``user``: the command's name and keys (never its
    values: they may be results or secrets) and Redis's ``answer``."""
    name = str(command[0]).upper() if command else "?"
    if name in _SCRIPTS and len(command) > 2:
        keys = command[3 : 3 + int(command[2])]
    elif name in _ALL_KEYS:
        keys = command[1:]
    else:
        keys = command[1:2]
    shown = " ".join(str(k) for k in keys) or "(no key)"
    return f"NOPERM: Redis user {user!r} may not {name} {shown}: {answer}"


class _Pipeline(redis.client.Pipeline):
    """A pipeline whose refused command names its keys and user (see :func:`refusal`)."""

    def annotate_exception(self, exception: Exception, number: int, command: Any) -> None:
        if not isinstance(exception, redis.exceptions.NoPermissionError):
            super().annotate_exception(exception, number, command)  # type: ignore[no-untyped-call]
            return
        user = _user(self.connection_pool)
        exception.args = (refusal(user, command, str(exception.args[0])),)


class _Client(redis.Redis):
    """``redis.Redis`` whose refused commands name their keys and user (see :func:`refusal`)."""

    confirming: tuple[int, int] = (0, 0)
    """(replicas, milliseconds): what :func:`confirm` waits for."""

    def execute_command(self, *args: Any, **options: Any) -> Any:
        try:
            return super().execute_command(*args, **options)  # type: ignore[no-untyped-call]
        except redis.exceptions.NoPermissionError as exc:
            answer = first_line(exc)
            raise redis.exceptions.NoPermissionError(
                refusal(_user(self.connection_pool), args, answer)
            ) from None

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> _Pipeline:
        return _Pipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint)


def _user(pool: redis.ConnectionPool) -> str:
    return str(pool.connection_kwargs.get("username") or "default")


class _SentinelConnection(redis.sentinel.SentinelManagedConnection):
    """redis-py's Sentinel connection, except that every (re)connection of a master's asks the
    sentinels where the master is. redis-py reconnects a connection that a retry dropped to the
    address it had (redis/redis-py#3874, open): after a failover that is the old master, which
    a supervisor starts again as the new master's replica, so each retry was refused
    ``READONLY`` until the retries ran out (seen in ``tests/test_failover.py``). A connection
    made by :meth:`connect_to` (redis-py's own path, which has just asked) is not asked for
    again."""

    _addressed = False

    def connect_to(self, address: tuple[str, int]) -> None:
        self._addressed = True
        try:
            super().connect_to(address)  # type: ignore[no-untyped-call]
        finally:
            self._addressed = False

    def connect_check_health(
        self, check_health: bool = True, retry_socket_connect: bool = True
    ) -> None:
        if self._sock is None and self.connection_pool.is_master and not self._addressed:
            self.host, self.port = self.connection_pool.get_master_address()
        super().connect_check_health(check_health, retry_socket_connect)


class _AsyncSentinelConnection(redis.asyncio.sentinel.SentinelManagedConnection):
    """:class:`_SentinelConnection`'s asyncio twin."""

    _addressed = False

    async def connect_to(self, address: tuple[str, int]) -> None:
        self._addressed = True
        try:
            await super().connect_to(address)  # type: ignore[no-untyped-call]
        finally:
            self._addressed = False

    async def connect_check_health(
        self, check_health: bool = True, retry_socket_connect: bool = True
    ) -> None:
        if not self.is_connected and self.connection_pool.is_master and not self._addressed:
            self.host, self.port = await self.connection_pool.get_master_address()
        await super().connect_check_health(check_health, retry_socket_connect)


_SENTINEL_TIMEOUTS = {"socket_timeout": 2.0, "socket_connect_timeout": 2.0}
"""How long a sentinel may take to connect and answer (it is asked at each new connection)."""


def _options(retry: Retry | AsyncRetry) -> dict[str, Any]:
    """What every client is made with, sync or async: ``str`` replies, health checks, and
    ``retry`` on the :data:`_TRANSIENT` errors."""
    return {
        "decode_responses": True,
        "health_check_interval": 30,
        "retry": retry,
        "retry_on_error": _TRANSIENT,
    }


def _backoff() -> ExponentialBackoff:
    return ExponentialBackoff(cap=2.0, base=0.05)


FAILOVER_SECONDS = 30.0
"""How long a client of a Sentinel group keeps trying through a failover: the sentinels agreeing
that the master is down (``down-after-milliseconds``), the promotion, and, with
``min-replicas-to-write``, a replica back in sync before the new master takes writes."""


def _tries_within(seconds: float) -> int:
    """The number of retries whose back-off (:func:`_backoff`) adds up to ``seconds``."""
    backoff, waited, tries = _backoff(), 0.0, 0
    while waited < seconds:
        tries += 1
        waited += backoff.compute(tries)
    return tries


def _retries(where: Target, retries: int) -> int:
    """``retries``, or for a Sentinel group at least :data:`FAILOVER_SECONDS` of them."""
    if is_sentinel(where.url):
        return max(retries, _tries_within(FAILOVER_SECONDS))
    return retries


def _malformed(exc: ValueError) -> InputError:
    """The one-line error for a URL the client cannot parse (never the URL: it may hold a
    password)."""
    return InputError(f"the Redis URL (EVALQ_REDIS_URL) is malformed: {first_line(exc)}")


def connect(target: str | Target, *, retries: int = 8) -> redis.Redis:
    """A client that decodes replies to ``str`` and rides out short connection drops and
    failovers (``retries`` tries with exponential back-off from 50 ms, capped at 2 s; a
    Sentinel group's at least :data:`FAILOVER_SECONDS` of them). A malformed URL is an
    :class:`InputError` (its message never holds the URL, which may hold a password)."""
    where = _target(target)
    options = _options(Retry(_backoff(), retries=_retries(where, retries)))
    try:
        if is_sentinel(where.url):
            group = _group(where.url)
            sentinel = redis.sentinel.Sentinel(  # type: ignore[no-untyped-call]
                group.sentinels, sentinel_kwargs=_SENTINEL_TIMEOUTS
            )
            client: _Client = sentinel.master_for(  # type: ignore[no-untyped-call]
                _master_name(where),
                redis_class=_Client,
                connection_class=_SentinelConnection,
                **group.master,
                **options,
            )
        else:
            client = cast(_Client, _Client.from_url(where.url, **options))
    except ValueError as exc:
        raise _malformed(exc) from None
    client.confirming = (where.replicas, where.wait_ms)
    return client


def connect_async(
    target: str | Target, *, max_connections: int, retries: int = 8
) -> redis.asyncio.Redis:
    """:func:`connect`'s asyncio twin (``redis.asyncio``), for code on an event loop: the
    gateway's token look-ups and its results streams' waits. It holds at most
    ``max_connections`` connections; a command that finds them all taken waits for one (with
    Sentinel: fails, as redis-py's Sentinel pool does not wait)."""
    where = _target(target)
    options = _options(AsyncRetry(_backoff(), retries=_retries(where, retries)))
    try:
        if is_sentinel(where.url):
            group = _group(where.url)
            watch = redis.asyncio.sentinel.Sentinel(  # type: ignore[no-untyped-call]
                group.sentinels, sentinel_kwargs=_SENTINEL_TIMEOUTS
            )
            master: redis.asyncio.Redis = watch.master_for(
                _master_name(where),
                max_connections=max_connections,
                connection_class=_AsyncSentinelConnection,
                **group.master,
                **options,
            )
            return master
        pool = redis.asyncio.BlockingConnectionPool.from_url(
            where.url, max_connections=max_connections, **options
        )
    except ValueError as exc:
        raise _malformed(exc) from None
    return redis.asyncio.Redis.from_pool(pool)


def confirmed(client: redis.Redis, write: Callable[[redis.Redis], T]) -> T:
    """``write(one)``'s result, once the client's replicas (:attr:`Target.replicas`) hold what
    it wrote: ``one`` is a client of one connection, which then waits for them (``WAIT``, at
    most :attr:`Target.wait_ms`). With no replica to wait for, ``write(client)``. If that
    connection is lost before the replicas answer (the master died: the write may be gone with
    it), the write is made again on the new master, backing off as the client's retries do,
    for up to :data:`FAILOVER_SECONDS`, then :class:`UnconfirmedWriteError`: ``write`` must be
    safe to make again. A replica that does not answer in time is logged, not raised: the
    write stands on the master, and ``min-replicas-to-write`` keeps a master without replicas
    from taking more."""
    replicas, wait_ms = getattr(client, "confirming", (0, 0))
    if replicas <= 0:
        return write(client)
    backoff, deadline, tries = _backoff(), time.monotonic() + FAILOVER_SECONDS, 0
    while True:
        with client.client() as one:  # type: ignore[no-untyped-call]
            result = write(one)
            acked = _wait(one, replicas, wait_ms)
        if acked is not None:
            break
        tries += 1
        if time.monotonic() > deadline:
            raise UnconfirmedWriteError(
                f"Redis's master was lost before a replica confirmed a write, {tries} times in "
                f"{FAILOVER_SECONDS:.0f} s: it may be lost; try again"
            )
        log.warning("Redis's master was lost before a replica confirmed a write: made again")
        time.sleep(backoff.compute(tries))
    if acked < replicas:
        log.warning(
            "Redis confirmed a write on %d of %d replicas within %d ms: it is lost if the "
            "master fails before a replica has it",
            acked,
            replicas,
            wait_ms,
        )
    return result


def _wait(one: redis.Redis, replicas: int, wait_ms: int) -> int | None:
    """``WAIT`` on ``one``'s connection, never retried on another (only the server that took
    the write can answer for it): the replicas that hold it; None when the connection died, or
    when it reached a replica (a sentinel that had not yet heard of a failover named the old
    master, back as a replica: a write that changes something is refused there, a write that
    found nothing to do went through, and neither is confirmed; the connection is dropped, so
    the next one asks the sentinels again)."""
    connection = one.connection
    if connection is None:
        return None
    kept = connection.retry
    connection.retry = Retry(NoBackoff(), 0)
    try:
        return int(one.wait(replicas, wait_ms))
    except (redis.ConnectionError, redis.TimeoutError):
        return None
    except redis.ResponseError as exc:
        if "replica" not in str(exc):
            raise
        connection.disconnect()  # type: ignore[no-untyped-call]
        return None
    finally:
        connection.retry = kept


def redact(url: str) -> str:
    """``url`` with its password (``user:password@`` or ``?password=``) replaced by ``***``, for
    messages and logs (each part of a Sentinel group's)."""
    if ";" in url:
        return ";".join(redact(part) for part in url.split(";"))
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        credentials, host = netloc.rsplit("@", 1)
        user = credentials.split(":", 1)[0]
        netloc = f"{user}:***@{host}" if ":" in credentials else netloc
    query = [
        (key, "***" if key.lower() == "password" else value)
        for key, value in parse_qsl(parts.query, keep_blank_values=True)
    ]
    return urlunsplit(parts._replace(netloc=netloc, query=urlencode(query, safe="*")))


def server_time(client: redis.Redis) -> float:
    """Redis's clock, in seconds: the one clock every age is measured by (a run's creation,
    the janitor's and ``status``'s idle times), whatever the producers' and workers' clocks
    say."""
    seconds, micros = client.time()
    return float(seconds) + float(micros) / 1e6
