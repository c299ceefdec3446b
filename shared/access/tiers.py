"""The split-tier registry: tiers stored in ``evalq:tiers:{dataset}``, changes audited.

It stores and reads; what a tier allows is :mod:`evalq.shared.access.policy`'s, and so is how a
missing or unreadable entry reads (``no_access``).
"""

from __future__ import annotations

import time

import redis

from evalq.shared.access.policy import Tier, stored_tier
from evalq.shared.keys import AUDIT, tiers_key
from evalq.shared.names import check_name
from evalq.shared.store.scripts import register

__all__ = ["TierRegistry"]


class TierRegistry:
    """Tiers in ``evalq:tiers:{dataset}``; owns ``set_tier.lua``."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._set_tier = register(client, "evalq.shared.access", "set_tier", confirmed=True)

    def lookup(self, dataset: str, split: str) -> Tier | None:
        """The split's listed tier, or None when it is not listed (an unreadable entry reads as
        ``no_access``)."""
        raw = self._client.hget(tiers_key(dataset), split)
        return None if raw is None else stored_tier(raw)

    def resolve(self, dataset: str, split: str) -> Tier:
        """The split's tier as every path must see it: unlisted means ``no_access``."""
        return stored_tier(self._client.hget(tiers_key(dataset), split))

    def set(self, dataset: str, split: str, tier: Tier, *, who: str) -> Tier | None:
        """Set a split's tier (audited); return the previous one (None if unlisted). Names
        must follow :mod:`evalq.shared.names`' rule (no two share a key)."""
        check_name("dataset name", dataset)
        check_name("split", split)
        before = self._set_tier(
            keys=[tiers_key(dataset), AUDIT], args=[split, tier.value, who, dataset, time.time()]
        )
        return None if before is None else stored_tier(before)

    def listed(self) -> dict[str, dict[str, Tier]]:
        """Every listed split's tier, by dataset."""
        prefix = tiers_key("")
        found: dict[str, dict[str, Tier]] = {}
        for key in self._client.scan_iter(match=f"{prefix}*", count=500):
            entries = self._client.hgetall(key)
            found[str(key)[len(prefix) :]] = {str(s): stored_tier(t) for s, t in entries.items()}
        return dict(sorted(found.items()))
