"""The fleet's response cache for endpoint models (``submit --cache``): one answer per distinct
request, shared by every worker.

A request's key is the digest of what decides its answer
(:func:`evalq.shared.lm.endpoint.request_digest`): the endpoint, the model name and the whole
request body (prompt or messages, generation settings, the seed when it samples), so another model
or another prompt never gets a hit, and the run's principal, so no principal's hit tells it what
another asked. Identical requests in flight at once share
one call: the first takes ``<key>:lock`` (``SET NX`` with an expiry) and the others wait for
its answer, or for the lock to lapse (its worker died) and then ask themselves. Entries are
bounded by age (``EVALQ_CACHE_TTL``) and size (``EVALQ_CACHE_MAX_BYTES``: a longer answer is
not kept).
"""

from __future__ import annotations

import json
from typing import Any

import redis

from evalq.shared.keys import cache_key

__all__ = ["ResponseCache"]


class ResponseCache:
    """Cached answers in ``evalq:cache:<digest>``."""

    def __init__(self, client: redis.Redis, ttl: int, max_bytes: int) -> None:
        self._client = client
        self._ttl = ttl
        self._max_bytes = max_bytes

    def get(self, digest: str) -> dict[str, Any] | None:
        """The cached answer, if any (an unreadable entry is no answer)."""
        raw = self._client.get(cache_key(digest))
        if raw is None:
            return None
        try:
            found = json.loads(str(raw))
        except ValueError:
            return None
        return found if isinstance(found, dict) else None

    def claim(self, digest: str, seconds: float) -> bool:
        """Whether this caller is the one to ask (for at most ``seconds``): False while another
        request for the same answer is in flight."""
        lock = f"{cache_key(digest)}:lock"
        return bool(self._client.set(lock, "1", nx=True, px=max(1, int(seconds * 1000))))

    def put(self, digest: str, answer: dict[str, Any]) -> None:
        """Keep ``answer`` (unless it is too big) and let the waiting requests have it."""
        text = json.dumps(answer, separators=(",", ":"))
        with self._client.pipeline(transaction=True) as pipe:
            if len(text.encode()) <= self._max_bytes:
                pipe.set(cache_key(digest), text, ex=self._ttl)
            pipe.delete(f"{cache_key(digest)}:lock")
            pipe.execute()

    def release(self, digest: str) -> None:
        """Give up the claim without an answer (the request failed): a waiter asks itself."""
        self._client.delete(f"{cache_key(digest)}:lock")
