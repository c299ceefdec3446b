"""Split tiers: who may evaluate a split and what they may read back.

There is one resolver, :meth:`TierRegistry.resolve`, and every path (submit, status, results,
export, the Python API) goes through it: a split that is not listed is ``no_access``.
"""

from __future__ import annotations

from enum import StrEnum

import redis

from shared.keys import tiers_key
from shared.scripts import Scripts

__all__ = ["MIN_AGGREGATE_SAMPLES", "Access", "Tier", "TierRegistry", "access"]

MIN_AGGREGATE_SAMPLES = 5
"""k-anonymity floor: a non-admin never sees an aggregate over fewer samples of a
``non_viewable`` split (single-sample evals would reveal labels)."""


class Tier(StrEnum):
    """Visibility of a (dataset, split)."""

    VIEWABLE = "viewable"
    NON_VIEWABLE = "non_viewable"
    NO_ACCESS = "no_access"


class Access(StrEnum):
    """What a reader may see of a run."""

    FULL = "full"
    AGGREGATE = "aggregate"
    NONE = "none"


def access(tier: Tier, admin: bool, samples: int) -> Access:
    """What a reader gets of a run of ``samples`` samples on a split of ``tier``."""
    if admin or tier is Tier.VIEWABLE:
        return Access.FULL
    if tier is Tier.NON_VIEWABLE and samples >= MIN_AGGREGATE_SAMPLES:
        return Access.AGGREGATE
    return Access.NONE


class TierRegistry:
    """Tiers in ``evalq:tiers:{dataset}``; changes are audited in ``evalq:audit``."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._scripts = Scripts(client)

    def lookup(self, dataset: str, split: str) -> Tier | None:
        """The split's listed tier, or None when it is not listed (an unreadable entry reads as
        ``no_access``)."""
        raw = self._client.hget(tiers_key(dataset), split)
        return None if raw is None else _parse(raw)

    def resolve(self, dataset: str, split: str) -> Tier:
        """The split's tier as every path must see it: unlisted means ``no_access``."""
        return self.lookup(dataset, split) or Tier.NO_ACCESS

    def set(self, dataset: str, split: str, tier: Tier, who: str) -> Tier | None:
        """Set a split's tier (audited); return the previous one (None if unlisted)."""
        before = self._scripts.set_tier(tiers_key(dataset), dataset, split, tier.value, who)
        return None if before is None else _parse(before)

    def listed(self) -> dict[str, dict[str, Tier]]:
        """Every listed split's tier, by dataset."""
        prefix = tiers_key("")
        found: dict[str, dict[str, Tier]] = {}
        for key in self._client.scan_iter(match=f"{prefix}*", count=500):
            entries = self._client.hgetall(key)
            found[str(key)[len(prefix) :]] = {str(s): _parse(t) for s, t in entries.items()}
        return dict(sorted(found.items()))


def _parse(raw: object) -> Tier:
    """A stored tier; anything unrecognised is ``no_access`` (fail closed)."""
    try:
        return Tier(str(raw))
    except ValueError:
        return Tier.NO_ACCESS
