"""Redis clients: made here, from a URL, and handed to whoever needs one."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

__all__ = ["connect", "redact"]


def connect(url: str, *, retries: int = 8) -> redis.Redis:
    """A client that decodes replies to ``str`` and rides out short connection drops
    (``retries`` tries with exponential back-off from 50 ms, capped at 2 s)."""
    return redis.Redis.from_url(
        url,
        decode_responses=True,
        health_check_interval=30,
        retry=Retry(ExponentialBackoff(cap=2.0, base=0.05), retries=retries),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError],
    )


def redact(url: str) -> str:
    """``url`` with its password replaced by ``***``, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))
