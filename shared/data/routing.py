"""Routing: which of a spec's shards each row of the split lives in.

- ``contiguous`` (default): shard ``k`` holds rows ``k*n//K .. (k+1)*n//K - 1``.
- ``round_robin``: row ``i`` lives in shard ``i % K``.
- ``kmeans``: row ``i`` lives in the shard whose centroid is nearest to its features, a seeded
  bag-of-tokens count vector. Similar texts share a shard, so a worker's batches are more alike.

A k-means fit reads a bounded sample (the first ``sample_size`` texts of a stream) and is
deterministic in (texts, sample size, featurizer seed, fit seed). Distances are taken in
float64, element by element, so every machine assigns a row to the same shard; centroids are
rounded to six decimals before they enter a spec, and a re-fit is compared with a tolerance.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from evalq.shared.choices import RoutingKind

if TYPE_CHECKING:
    import numpy as np
    import torch

__all__ = [
    "CENTROID_TOLERANCE",
    "Contiguous",
    "Featurizer",
    "KMeans",
    "KMeansFit",
    "RoundRobin",
    "Routing",
    "RoutingKind",
    "assign",
    "centroid_gap",
    "fit_kmeans",
]

CENTROID_TOLERANCE = 1e-3
"""Largest per-coordinate difference between a spec's centroids and a re-fit that still
verifies (k-means is not bit-identical across BLAS builds)."""
_TOKEN = re.compile(r"[a-z0-9]+")
_CHUNK = 1024


class Contiguous(BaseModel):
    """Consecutive rows share a shard."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["contiguous"] = "contiguous"


class RoundRobin(BaseModel):
    """Row ``i`` goes to shard ``i % shards``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["round_robin"] = "round_robin"


class Featurizer(BaseModel):
    """Bag of tokens: lower-cased alphanumeric tokens counted into ``dim`` seeded hash buckets."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    seed: int = Field(ge=0, lt=2**63)
    """Keys the token hash: another seed puts tokens in other buckets."""
    dim: int = Field(default=128, ge=2, le=4096)
    """Number of buckets (feature dimensions)."""

    def features(self, texts: Sequence[str]) -> torch.Tensor:
        """A ``(len(texts), dim)`` float64 tensor of bucket counts."""
        import torch

        key = self.seed.to_bytes(8, "little")
        buckets: dict[str, int] = {}
        rows: list[int] = []
        cols: list[int] = []
        for row, text in enumerate(texts):
            for token in _TOKEN.findall(text.lower()):
                bucket = buckets.get(token)
                if bucket is None:
                    digest = hashlib.blake2b(token.encode(), digest_size=8, key=key).digest()
                    bucket = buckets[token] = int.from_bytes(digest, "little") % self.dim
                rows.append(row)
                cols.append(bucket)
        counts = torch.zeros(len(texts), self.dim, dtype=torch.float64)
        ones = torch.ones(len(rows), dtype=torch.float64)
        counts.index_put_((torch.tensor(rows), torch.tensor(cols)), ones, accumulate=True)
        return counts


class KMeansFit(BaseModel):
    """How the centroids were fitted: what a worker needs to fit them again and compare."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sample_size: int = Field(ge=1)
    """The fit read the first ``sample_size`` texts of the split."""
    seed: int = Field(ge=0, lt=2**63)
    """Seeds the k-means++ initialisation."""
    iterations: int = Field(ge=1)
    """Most Lloyd iterations run."""


class KMeans(BaseModel):
    """Nearest-centroid routing over :class:`Featurizer` vectors."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["kmeans"] = "kmeans"
    featurizer: Featurizer
    """The featurizer every row is embedded with, seed included."""
    centroids: tuple[tuple[float, ...], ...] = Field(min_length=1)
    """One centroid per shard, ``featurizer.dim`` coordinates each."""
    fit: KMeansFit | None = None
    """How the centroids were fitted; without it a worker cannot verify them."""


Routing = Annotated[Contiguous | RoundRobin | KMeans, Field(discriminator="kind")]


def _nearest(features: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """Index of the nearest centroid per row (first one on a tie)."""
    distances = ((features[:, None, :] - centroids[None, :, :]) ** 2).sum(dim=-1)
    return distances.argmin(dim=1)


def _kmeans_pp(features: torch.Tensor, k: int, generator: torch.Generator) -> torch.Tensor:
    import torch

    n = features.shape[0]
    first = int(torch.randint(n, (1,), generator=generator))
    centroids = [features[first]]
    closest = ((features - centroids[0]) ** 2).sum(dim=1)
    for _ in range(1, k):
        total = float(closest.sum())
        if total > 0:
            index = int(torch.multinomial(closest / total, 1, generator=generator))
        else:
            index = int(torch.randint(n, (1,), generator=generator))
        centroids.append(features[index])
        closest = torch.minimum(closest, ((features - features[index]) ** 2).sum(dim=1))
    return torch.stack(centroids)


def fit_kmeans(
    texts: Iterable[str], shards: int, featurizer: Featurizer, fit: KMeansFit
) -> KMeans | RoundRobin:
    """Fit ``shards`` centroids on the first ``fit.sample_size`` of ``texts``.

    Reads no further than the sample. Fewer texts than shards cannot be clustered: the
    routing falls back to :class:`RoundRobin`.
    """
    import torch

    sample = list(itertools.islice(texts, fit.sample_size))
    if len(sample) < shards:
        return RoundRobin()
    features = featurizer.features(sample)
    generator = torch.Generator().manual_seed(fit.seed)
    centroids = _kmeans_pp(features, shards, generator)
    for _ in range(fit.iterations):
        labels = _nearest(features, centroids)
        sums = torch.zeros_like(centroids).index_add_(0, labels, features)
        counts = torch.bincount(labels, minlength=shards).to(torch.float64)[:, None]
        moved = torch.where(counts > 0, sums / counts.clamp(min=1), centroids)
        if torch.equal(moved, centroids):
            break
        centroids = moved
    rounded = tuple(tuple(round(float(v), 6) for v in row) for row in centroids)
    return KMeans(featurizer=featurizer, centroids=rounded, fit=fit)


def centroid_gap(shipped: KMeans, refit: KMeans) -> float:
    """Largest coordinate difference between two sets of centroids (inf if shapes differ)."""
    if len(shipped.centroids) != len(refit.centroids):
        return float("inf")
    gap = 0.0
    for a, b in zip(shipped.centroids, refit.centroids, strict=True):
        if len(a) != len(b):
            return float("inf")
        gap = max(gap, *(abs(x - y) for x, y in zip(a, b, strict=True)))
    return gap


def assign(
    routing: Contiguous | RoundRobin | KMeans,
    shards: int,
    n_rows: int,
    texts: Iterator[list[str]] | None = None,
) -> np.ndarray:
    """The shard of every row, as an int array of length ``n_rows``.

    ``kmeans`` needs ``texts``: the split's routing field in row order, in chunks.
    """
    import numpy as np

    rows = np.arange(n_rows, dtype=np.int64)
    if isinstance(routing, Contiguous):
        starts = (np.arange(shards + 1, dtype=np.int64) * n_rows) // shards
        return np.searchsorted(starts, rows, side="right") - 1
    if isinstance(routing, RoundRobin):
        return rows % shards
    if texts is None:
        raise ValueError("kmeans routing needs the split's texts")
    import torch

    centroids = torch.tensor(routing.centroids, dtype=torch.float64)
    out = np.empty(n_rows, dtype=np.int64)
    done = 0
    for chunk in texts:
        for start in range(0, len(chunk), _CHUNK):
            part = chunk[start : start + _CHUNK]
            nearest = _nearest(routing.featurizer.features(part), centroids).numpy()
            out[done : done + len(part)] = nearest
            done += len(part)
    if done != n_rows:
        raise ValueError(f"routing read {done} texts for a split of {n_rows} rows")
    return out
