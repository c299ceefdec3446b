"""Redis clients: made here, from a URL, and handed to whoever needs one."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from shared.errors import InputError, first_line

__all__ = ["connect", "redact", "server_time"]


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
    return redis.Redis.from_url(
        url,
        decode_responses=True,
        health_check_interval=30,
        retry=Retry(ExponentialBackoff(cap=2.0, base=0.05), retries=retries),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError],
    )


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
