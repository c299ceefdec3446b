"""Redis clients: made here, from a URL, and handed to whoever needs one."""

from __future__ import annotations

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

__all__ = ["connect"]


def connect(url: str) -> redis.Redis:
    """A client that decodes replies to ``str`` and rides out short connection drops."""
    return redis.Redis.from_url(
        url,
        decode_responses=True,
        health_check_interval=30,
        retry=Retry(ExponentialBackoff(cap=2.0, base=0.05), retries=8),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError],
    )
