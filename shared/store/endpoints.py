"""Endpoints: the OpenAI-compatible servers endpoint models may call, with the fleet-wide
limits the operator sets for each (``endpoints:`` in ``evalq policy apply``; audited).

An endpoint model calls only a listed URL, with the API key from the one worker environment
variable its entry names: a caller cannot make the workers send a key to a server of its
choosing, nor read another variable into a request
(:func:`evalq.shared.access.policy.admit_endpoint`). The workers read this store; ``evalq policy
apply`` writes it.
"""

from __future__ import annotations

import json

import redis
from pydantic import ValidationError

from evalq.shared.keys import ENDPOINTS
from evalq.shared.lm.limits import EndpointLimits
from evalq.shared.store.audit import record

__all__ = ["EndpointRegistry", "normal_url"]


def normal_url(url: str) -> str:
    """The form a base URL is listed and looked up in (no trailing slash)."""
    return url.strip().rstrip("/")


class EndpointRegistry:
    """The listed endpoints in ``evalq:endpoints`` (base URL -> :class:`EndpointLimits`)."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client

    def get(self, url: str) -> EndpointLimits | None:
        """``url``'s entry; None when it is not listed (or its entry is unreadable: it then
        admits nothing)."""
        raw = self._client.hget(ENDPOINTS, normal_url(url))
        return None if raw is None else _read(raw)

    def all(self) -> dict[str, EndpointLimits]:
        """Every readable entry, by URL."""
        found = {str(url): _read(raw) for url, raw in self._client.hgetall(ENDPOINTS).items()}
        return {url: limits for url, limits in sorted(found.items()) if limits is not None}

    def set(self, url: str, limits: EndpointLimits, *, who: str) -> None:
        """List ``url`` with ``limits`` (replacing its entry; audited)."""
        key = normal_url(url)
        before = self._client.hget(ENDPOINTS, key)
        with self._client.pipeline(transaction=True) as pipe:
            pipe.hset(ENDPOINTS, key, limits.model_dump_json())
            record(pipe, "endpoint_set", who, before=before, after=limits.model_dump(), url=key)
            pipe.execute()

    def remove(self, url: str, *, who: str) -> None:
        """Delist ``url`` (audited): no endpoint model calls it from its next batch on."""
        key = normal_url(url)
        before = self._client.hget(ENDPOINTS, key)
        with self._client.pipeline(transaction=True) as pipe:
            pipe.hdel(ENDPOINTS, key)
            record(pipe, "endpoint_removed", who, before=before, url=key)
            pipe.execute()


def _read(raw: object) -> EndpointLimits | None:
    try:
        return EndpointLimits.model_validate(json.loads(str(raw)))
    except (ValueError, ValidationError):
        return None
