"""The fleet-wide rate limit of one endpoint, and its per-minute counts.

Every worker process calling an endpoint asks :meth:`RateLimit.take` before each request: one
Lua script (``rate.lua``, GCRA) admits it under the operator's requests-per-minute and
tokens-per-minute (:class:`evalq.shared.lm.limits.EndpointLimits`, read again for each batch:
:meth:`RateLimit.refresh`) and after the server's last ``Retry-After`` (:meth:`RateLimit.pause`),
or says how long to wait, so the limit holds across any number of workers. A request's tokens
are not known until it returns: it is admitted on an estimate and the estimate corrected
(:meth:`RateLimit.adjust`).

The counts (requests, 429s, retries, tokens, failures, cache answers) are what ``status`` and
``evalq metrics`` show for an endpoint over the last minute; they are kept in a hash per ten
seconds, for an hour.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import redis

from evalq.shared.keys import rate_key, rate_minute_key
from evalq.shared.lm.limits import EndpointLimits
from evalq.shared.lm.spec import ModelArgs
from evalq.shared.store.endpoints import EndpointRegistry
from evalq.shared.store.scripts import register

__all__ = ["COUNTS", "RateLimit", "minute_counts"]

COUNTS = ("requests", "rate_limited", "retries", "tokens", "failed", "cached")
"""What is counted per endpoint and minute."""
_BUCKET = 10
"""Seconds counted in one hash."""
_KEEP = 3600


def _bucket(at: float | None = None) -> int:
    return int((time.time() if at is None else at) // _BUCKET)


class RateLimit:
    """One endpoint's limiter; owns ``rate.lua``."""

    def __init__(self, client: redis.Redis, endpoint: str, limits: EndpointLimits) -> None:
        self._client = client
        self.endpoint = endpoint
        self.limits = limits
        self._key = rate_key(endpoint)
        self._script = register(client, "evalq.shared.store", "rate")

    def _args(self) -> list[str]:
        rpm, tpm = self.limits.requests_per_minute, self.limits.tokens_per_minute
        return ["" if rpm is None else str(rpm), "" if tpm is None else str(tpm)]

    def refresh(self, args: ModelArgs) -> str | None:
        """Read the endpoint's listing again (a policy may have changed its limits, its key
        variable, or delisted it): None when it is still listed and allows a run with ``args``
        (:meth:`EndpointLimits.refusal`), else why no request may go to it. :attr:`limits` is
        then the entry, whose ``api_key_env`` says which key to send."""
        listed = EndpointRegistry(self._client).get(self.endpoint)
        if listed is None:
            return f"endpoint {self.endpoint} is not listed in the policy's endpoints: any more"
        refused = listed.refusal(self.endpoint, args)
        if refused is not None:
            return f"{refused} now"
        self.limits = listed
        return None

    def take(self, tokens: int) -> float:
        """Admit one request of about ``tokens`` tokens now (0.0), or the seconds to wait
        before asking again (nothing taken)."""
        waited = int(self._script(keys=[self._key], args=[*self._args(), tokens, "take"]))
        return waited / 1000.0

    def pause(self, seconds: float) -> None:
        """Admit no request for ``seconds`` from now, from any worker (a ``Retry-After``)."""
        millis = max(1, int(seconds * 1000))
        self._script(keys=[self._key], args=[*self._args(), millis, "pause"])

    def adjust(self, tokens: int) -> None:
        """Correct an admitted request's token estimate by ``tokens`` (negative: it used
        fewer)."""
        if self.limits.tokens_per_minute is not None and tokens:
            self._script(keys=[self._key], args=[*self._args(), tokens, "adjust"])

    def count(self, **counts: int) -> None:
        """Add ``counts`` (names from :data:`COUNTS`) to the current ten seconds'."""
        key = rate_minute_key(self.endpoint, _bucket())
        with self._client.pipeline(transaction=False) as pipe:
            for name, value in counts.items():
                if value:
                    pipe.hincrby(key, name, value)
            pipe.expire(key, _KEEP)
            pipe.execute()


def minute_counts(client: redis.Redis, endpoints: Iterable[str]) -> dict[str, dict[str, int]]:
    """Each endpoint's counts over the last minute (to ten seconds)."""
    now = _bucket()
    found: dict[str, dict[str, int]] = {}
    for endpoint in endpoints:
        keys = [rate_minute_key(endpoint, b) for b in range(now - 60 // _BUCKET + 1, now + 1)]
        with client.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.hgetall(key)
            rows = pipe.execute()
        totals = dict.fromkeys(COUNTS, 0)
        for row in rows:
            for name, value in row.items():
                if name in totals:
                    totals[name] += int(value)
        found[endpoint] = totals
    return found
