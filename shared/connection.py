"""Redis clients: made here, from a URL, and handed to whoever needs one.

A command Redis refuses for the client's ACL user raises redis-py's ``NoPermissionError`` as
usual, with a message that says which user was refused which command on which keys
(:func:`refusal`): Redis's own answer names neither.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from shared.errors import InputError, first_line

__all__ = ["connect", "connect_async", "redact", "refusal", "server_time"]

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


def connect(url: str, *, retries: int = 8) -> redis.Redis:
    """A client that decodes replies to ``str`` and rides out short connection drops
    (``retries`` tries with exponential back-off from 50 ms, capped at 2 s). A malformed URL
    is an :class:`InputError` (its message never holds the URL, which may hold a password)."""
    try:
        return _from_url(url, retries)
    except ValueError as exc:
        raise InputError(
            f"the Redis URL (EVALQ_REDIS_URL) is malformed: {first_line(exc)}"
        ) from None


def _from_url(url: str, retries: int) -> redis.Redis:
    return _Client.from_url(
        url,
        decode_responses=True,
        health_check_interval=30,
        retry=Retry(ExponentialBackoff(cap=2.0, base=0.05), retries=retries),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError],
    )


def connect_async(url: str, *, max_connections: int, retries: int = 8) -> redis.asyncio.Redis:
    """:func:`connect`'s asyncio twin (``redis.asyncio``), for code on an event loop: the
    gateway's token look-ups and its results streams' waits. It holds at most
    ``max_connections`` connections; a command that finds them all taken waits for one."""
    try:
        pool = redis.asyncio.BlockingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            decode_responses=True,
            health_check_interval=30,
            retry=AsyncRetry(ExponentialBackoff(cap=2.0, base=0.05), retries=retries),
            retry_on_error=[redis.ConnectionError, redis.TimeoutError],
        )
    except ValueError as exc:
        raise InputError(
            f"the Redis URL (EVALQ_REDIS_URL) is malformed: {first_line(exc)}"
        ) from None
    return redis.asyncio.Redis.from_pool(pool)


def redact(url: str) -> str:
    """``url`` with its password (``user:password@`` or ``?password=``) replaced by ``***``, for
    messages and logs."""
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
