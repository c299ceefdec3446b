"""Materialized dataset shards, rebuilt from published specs and kept in a bounded LRU."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import redis

from shared.data import load_rows
from shared.errors import SampleIdError
from shared.spec import fetch_spec
from worker.lru import LRU

if TYPE_CHECKING:
    from datasets import Dataset

__all__ = ["ShardCache"]


class ShardCache:
    """Rows by spec fingerprint; at most ``capacity`` materialized shards per process."""

    def __init__(self, client: redis.Redis, capacity: int) -> None:
        self._client = client
        self._shards: LRU[str, Dataset] = LRU(capacity)

    def rows(self, fingerprint: str, sample_ids: list[int]) -> list[dict[str, Any]]:
        """Full rows (labels included) of ``sample_ids``, in that order."""
        dataset = self._shards.get_or_create(fingerprint, lambda: self._materialize(fingerprint))
        bad = [i for i in sample_ids if not 0 <= i < len(dataset)]
        if bad:
            raise SampleIdError(f"sample id {bad[0]} is outside the split (0..{len(dataset) - 1})")
        columns = dataset[sample_ids]
        return [
            dict(zip(columns, values, strict=True))
            for values in zip(*columns.values(), strict=True)
        ]

    def _materialize(self, fingerprint: str) -> Dataset:
        return load_rows(fetch_spec(self._client, fingerprint))
