"""Where a Redis client connects (:class:`Target`), named without loading a Redis client: the
settings and the HTTP client's imports stay light; :mod:`evalq.shared.connection` makes clients."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Target", "is_sentinel"]


@dataclass(frozen=True)
class Target:
    """Where a client connects: a URL, and for a Sentinel group the master's name."""

    url: str
    master: str | None = None
    """The Sentinel master's name (``EVALQ_REDIS_SENTINEL_MASTER``): needed by ``sentinel://``."""
    replicas: int = 0
    """How many replicas :func:`confirm` waits for (0: it does nothing)."""
    wait_ms: int = 2000
    """How long :func:`confirm` waits for them."""


def is_sentinel(url: str) -> bool:
    """Whether ``url`` names a Sentinel group (kombu's ``sentinel://…;sentinel://…``)."""
    return url.lstrip().lower().startswith("sentinel://")
