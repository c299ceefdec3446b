"""Dataset shards, rebuilt from published specs and kept in a bounded LRU per worker process.

For each spec fingerprint the cache keeps a plan: the spec, its split (memory-mapped from the
``datasets`` on-disk cache, so not held in RAM) and the shard of every row. A shard is the
rows of one shard copied into memory; at most ``capacity`` are kept, least recently used first
out, and an evicted one is rebuilt from the cached split with the same rows. The first worker
to build a shard records the sha256 of its rows in Redis; every later build, on any machine,
must match it or its samples fail (:class:`ShardMismatchError`).

With ``verify_routing``, a ``kmeans`` spec is fitted again from its own source once per
fingerprint, before any of its rows are used; centroids that do not match refuse every sample
of that spec with a :class:`RoutingError` (permanent, so never redelivered). A spec that carries
no fit metadata cannot be verified: that is logged as a warning and the spec is used.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import redis

from evalq.shared.data.loading import load_rows, refit_routing, shard_of_rows
from evalq.shared.data.remote import DataCache
from evalq.shared.data.routing import CENTROID_TOLERANCE, KMeans, centroid_gap
from evalq.shared.data.spec import DatasetSpec, fetch_spec
from evalq.shared.errors import RoutingError, SampleIdError, ShardMismatchError
from evalq.shared.keys import shard_digests_key
from evalq.worker.lru import LRU

if TYPE_CHECKING:
    from datasets import Dataset

__all__ = ["ShardCache", "rows_digest"]

log = logging.getLogger(__name__)


def rows_digest(dataset: Dataset) -> str:
    """sha256 of a dataset's rows as canonical JSON, independent of how Arrow chunks them."""
    digest = hashlib.sha256(f"{len(dataset)}\n".encode())
    for batch in dataset.iter(batch_size=1000):
        text = json.dumps(batch, sort_keys=True, default=str, ensure_ascii=False)
        digest.update(text.encode())
    return digest.hexdigest()


def _as_rows(columns: dict[str, list[Any]]) -> list[dict[str, Any]]:
    names = list(columns)
    return [dict(zip(names, values, strict=True)) for values in zip(*columns.values(), strict=True)]


def _rows_at(shard: Dataset, local: np.ndarray) -> list[dict[str, Any]]:
    """Rows at positions ``local`` of a shard :meth:`ShardCache._build` made: taken from its
    Arrow table by pyarrow (``Table.take``, ``to_pylist``), unless a column needs decoding
    (an image, audio), which ``datasets``' own formatting does. Both give the same values
    (``datasets`` formats a batch with the same ``to_pydict`` and decodes only such columns),
    the first ten times faster. A column of more than one chunk (one that holds more than 2 GiB
    of text: a ``take`` across its chunks would overflow its offsets) also goes through
    ``datasets``, which reads it row by row."""
    from datasets.features.features import require_decoding

    table = shard.data.table
    if any(column.num_chunks > 1 for column in table.columns) or any(
        require_decoding(feature) for feature in shard.features.values()
    ):
        return _as_rows(shard[local.tolist()])
    rows: list[dict[str, Any]] = table.take(local).to_pylist()
    return rows


@dataclass(frozen=True)
class _Plan:
    """What a worker knows of one spec: its split and where each row lives."""

    spec: DatasetSpec
    split: Dataset
    members: list[np.ndarray]
    """Row ids of each shard, ascending."""
    shard_of: np.ndarray
    """Shard of each row."""
    refusal: RoutingError | None = None
    """Set when the spec's routing failed verification: every row is refused."""


class ShardCache:
    """Rows by spec fingerprint, from at most ``capacity`` materialized shards; an
    object-store source is read through ``data_cache``."""

    def __init__(
        self,
        client: redis.Redis,
        capacity: int,
        verify_routing: bool = False,
        data_cache: DataCache | None = None,
    ) -> None:
        self._client = client
        self._verify = verify_routing
        self._data_cache = data_cache
        self._plans: LRU[str, _Plan] = LRU(capacity)
        self._shards: LRU[tuple[str, int], Dataset] = LRU(capacity)
        self.builds = 0
        """Shards materialized so far (rebuilds after eviction included); logged with each
        build, so an operator sees a cache that is too small for its runs' shards."""

    def rows(self, fingerprint: str, sample_ids: list[int]) -> list[dict[str, Any]]:
        """Full rows (labels included) of ``sample_ids``, in that order."""
        plan = self._plan(fingerprint)
        bad = [i for i in sample_ids if not 0 <= i < plan.spec.n_rows]
        if bad:
            last = plan.spec.n_rows - 1
            raise SampleIdError(f"sample id {bad[0]} is outside the split (0..{last})")
        ids = np.asarray(sample_ids, dtype=np.int64)
        where = plan.shard_of[ids]
        found: list[dict[str, Any]] = [{} for _ in sample_ids]
        for index in np.unique(where).tolist():
            positions = np.nonzero(where == index)[0]
            local = np.searchsorted(plan.members[index], ids[positions])
            shard = self.shard(fingerprint, index)
            for position, row in zip(positions, _rows_at(shard, local), strict=True):
                found[position] = row
        return found

    def shard(self, fingerprint: str, index: int) -> Dataset:
        """Shard ``index`` of the spec, built (or rebuilt after eviction) on a miss."""
        plan = self._plan(fingerprint)
        return self._shards.get_or_create(
            (fingerprint, index), lambda: self._build(fingerprint, plan, index)
        )

    def _plan(self, fingerprint: str) -> _Plan:
        plan = self._plans.get_or_create(fingerprint, lambda: self._make_plan(fingerprint))
        if plan.refusal is not None:
            raise plan.refusal
        return plan

    def _make_plan(self, fingerprint: str) -> _Plan:
        spec = fetch_spec(self._client, fingerprint)
        split = load_rows(spec, self._data_cache)
        refusal = self._check_routing(fingerprint, spec) if self._verify else None
        if refusal is not None:
            empty = np.empty(0, dtype=np.int64)
            return _Plan(spec, split, [], empty, refusal)
        shard_of = shard_of_rows(spec, split)
        members = [np.nonzero(shard_of == k)[0] for k in range(spec.shards)]
        return _Plan(spec, split, members, shard_of)

    def _check_routing(self, fingerprint: str, spec: DatasetSpec) -> RoutingError | None:
        if not isinstance(spec.routing, KMeans):
            return None
        refit = refit_routing(spec, self._data_cache)
        if refit is None:
            log.warning(
                "cannot verify the kmeans routing of spec %s: it carries no fit metadata; "
                "using it unverified",
                fingerprint[:12],
            )
            return None
        gap = centroid_gap(spec.routing, refit) if isinstance(refit, KMeans) else float("inf")
        if gap <= CENTROID_TOLERANCE:
            log.info("kmeans routing of spec %s verified (gap %.2g)", fingerprint[:12], gap)
            return None
        return RoutingError(
            f"spec {fingerprint[:12]} refused: its kmeans routing does not verify (fitting it "
            f"again from its source with featurizer seed {spec.routing.featurizer.seed} moves a "
            f"centroid by {gap:.3g}, more than {CENTROID_TOLERANCE}); the spec was altered or "
            "its source changed"
        )

    def _build(self, fingerprint: str, plan: _Plan, index: int) -> Dataset:
        """The shard's rows in memory, each column one Arrow chunk where it fits (a ``take``
        across the thousand-row chunks ``flatten_indices`` writes costs five times more),
        named by its spec and index (``datasets`` would otherwise hash every row to name it)."""
        from datasets import Dataset
        from datasets.table import InMemoryTable

        rows = plan.split.select(plan.members[index]).flatten_indices(keep_in_memory=True)
        try:
            table = InMemoryTable(rows.data.table.combine_chunks())
        except pa.ArrowInvalid:  # a nested column too large for one chunk: kept as it is
            table = rows.data
        name = hashlib.sha256(f"{fingerprint}:{index}".encode()).hexdigest()[:16]
        shard = Dataset(table, info=rows.info, split=rows.split, fingerprint=name)
        digest = rows_digest(shard)
        key = shard_digests_key(fingerprint)
        self._client.hsetnx(key, str(index), digest)
        recorded = self._client.hget(key, str(index))
        if recorded != digest:
            raise ShardMismatchError(
                f"shard {index} of spec {fingerprint[:12]} rebuilt here with other rows "
                f"(sha256 {digest[:12]}) than the first worker recorded ({str(recorded)[:12]})"
            )
        self.builds += 1
        log.info(
            "built shard %d of spec %s: %d rows (%d builds in this process)",
            index,
            fingerprint[:12],
            len(shard),
            self.builds,
        )
        return shard
