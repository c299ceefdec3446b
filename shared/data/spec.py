"""Dataset specs: the small, fingerprinted description a worker rebuilds its rows from.

A spec names where the rows come from, which split, and how the split is cut into shards
(``shards``, ``routing``, ``route_field``), never the rows themselves. Its
fingerprint is the sha256 of its canonical JSON, so a worker can check that what it fetched is
what the producer published. A spec carries no worker-local knob.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from evalq.shared.choices import MAX_SPEC_SHARDS
from evalq.shared.data.routing import Contiguous, KMeans, Routing
from evalq.shared.errors import SpecError
from evalq.shared.keys import spec_key

if TYPE_CHECKING:
    import redis

__all__ = [
    "MAX_SPEC_SHARDS",
    "DatasetSpec",
    "HubSource",
    "LocalFile",
    "LocalSource",
    "RemoteFile",
    "RemoteSource",
    "Source",
    "fetch_spec",
    "publish_spec",
]

LocalFormat = Literal["parquet", "json", "csv", "arrow"]


class LocalFile(BaseModel):
    """One data file, pinned by content."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    """Absolute path; workers must see the same file at the same path."""
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    """Hex digest of the file's bytes."""


class LocalSource(BaseModel):
    """Rows read from local files of one format."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["local"] = "local"
    format: LocalFormat
    """The ``datasets`` builder that reads the files."""
    files: tuple[LocalFile, ...] = Field(min_length=1)
    """The split's files, in order."""


class HubSource(BaseModel):
    """Rows read from a Hugging Face Hub dataset."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["hub"] = "hub"
    repo_id: str = Field(min_length=1)
    """Hub dataset id, e.g. ``org/name``."""
    revision: str | None = None
    """Git revision; pin it for reproducible rows."""
    config: str | None = None
    """Dataset configuration name."""


class RemoteFile(BaseModel):
    """One object on object storage, pinned by its stamp and its content."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str
    """Its fsspec URL (``s3://bucket/prefix/test.jsonl``), without credentials."""
    etag: str = Field(min_length=1)
    """What the store says identifies this content (S3's ETag; a store without one: fsspec's
    key of the object's details)."""
    version: str | None = None
    """The object's version id, where the store versions objects."""
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    """Hex digest of the object's bytes."""


class RemoteSource(BaseModel):
    """Rows read from objects of one format on object storage (any fsspec URL)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["remote"] = "remote"
    format: LocalFormat
    """The ``datasets`` builder that reads the objects."""
    files: tuple[RemoteFile, ...] = Field(min_length=1)
    """The split's objects, in order."""


Source = Annotated[LocalSource | HubSource | RemoteSource, Field(discriminator="kind")]


class DatasetSpec(BaseModel):
    """Everything a worker needs to rebuild a split's rows, and nothing machine-local."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: Literal[2] = 2
    """Schema version of the spec (2 added shards and routing)."""
    source: Source
    """Where the rows come from."""
    split: str = Field(min_length=1)
    """Split name."""
    n_rows: int = Field(ge=0)
    """Rows in the split; sample ids are ``0 .. n_rows - 1``."""
    shards: int = Field(default=1, ge=1, le=MAX_SPEC_SHARDS)
    """How many shards the split is cut into."""
    routing: Routing = Contiguous()
    """Which shard each row lives in."""
    route_field: str | None = None
    """The text field content-based routing reads (required by ``kmeans``)."""

    @model_validator(mode="after")
    def _routing_fits(self) -> DatasetSpec:
        if isinstance(self.routing, KMeans):
            if self.route_field is None:
                raise ValueError("kmeans routing needs a route_field")
            if len(self.routing.centroids) != self.shards:
                raise ValueError(
                    f"kmeans routing has {len(self.routing.centroids)} centroids "
                    f"for {self.shards} shards"
                )
            dim = self.routing.featurizer.dim
            if any(len(centroid) != dim for centroid in self.routing.centroids):
                raise ValueError(f"every kmeans centroid needs {dim} coordinates")
        return self

    def canonical_json(self) -> str:
        """Sorted-key, whitespace-free JSON: the bytes the fingerprint is taken over."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))

    @property
    def fingerprint(self) -> str:
        """sha256 of the canonical JSON."""
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()


def publish_spec(client: redis.Redis, spec: DatasetSpec) -> str:
    """Store the spec under its fingerprint (idempotent) and return the fingerprint."""
    fingerprint = spec.fingerprint
    client.set(spec_key(fingerprint), spec.canonical_json(), nx=True)
    return fingerprint


def fetch_spec(client: redis.Redis, fingerprint: str) -> DatasetSpec:
    """Read a published spec and check that it hashes to ``fingerprint``."""
    raw = client.get(spec_key(fingerprint))
    if raw is None:
        raise SpecError(f"no spec is published under fingerprint {fingerprint[:12]}")
    try:
        spec = DatasetSpec.model_validate_json(raw)
    except ValidationError as exc:
        raise SpecError(f"spec {fingerprint[:12]} is malformed: {exc.errors()[0]['msg']}") from exc
    if spec.fingerprint != fingerprint:
        raise SpecError(f"spec {fingerprint[:12]} does not match its fingerprint")
    return spec
