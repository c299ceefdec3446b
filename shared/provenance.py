"""Which code, packages, hosts and devices produced a run's outputs.

Each worker process that stores outputs of a run records, once per run, what it ran with: its
host and device, Python and the versions of evalq, torch, transformers and datasets, and the
evaluation's module with a sha256 of its source file. Records of the same (host, device, code)
are one entry (``HSETNX`` in ``evalq:{run}:provenance``). ``status --json`` and the report
show them with the run's dataset spec fingerprint.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import platform
import socket
from functools import cache
from importlib import metadata

import redis
from pydantic import BaseModel, ConfigDict

from shared.evaluation import Evaluation
from shared.keys import RunKeys

__all__ = ["PACKAGES", "ProvenanceStore", "RunProvenance", "WorkerProvenance", "of_worker"]

PACKAGES = ("evalq", "torch", "transformers", "datasets")


class WorkerProvenance(BaseModel):
    """What one worker ran a run's inference with."""

    model_config = ConfigDict(frozen=True)

    host: str
    device: str
    python: str
    packages: dict[str, str]
    """Package -> version (``not installed`` when absent)."""
    evaluation: str
    """The evaluation class's module and name."""
    source_sha256: str
    """sha256 of the evaluation's source file (``unknown`` when it has none)."""


class RunProvenance(BaseModel):
    """A run's provenance, as ``status --json`` carries it."""

    spec: str
    """The dataset spec fingerprint (which rows the sample ids are)."""
    workers: list[WorkerProvenance]


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


@cache
def _source_sha256(cls: type[Evaluation]) -> str:
    try:
        path = inspect.getsourcefile(cls)
        if path is None:
            return "unknown"
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()
    except (OSError, TypeError):
        return "unknown"


@cache
def _packages() -> tuple[tuple[str, str], ...]:
    return tuple((p, _version(p)) for p in PACKAGES)


def of_worker(evaluation: Evaluation, device: str) -> WorkerProvenance:
    """This process's provenance for ``evaluation`` on ``device``."""
    cls = type(evaluation)
    return WorkerProvenance(
        host=socket.gethostname(),
        device=device,
        python=platform.python_version(),
        packages=dict(_packages()),
        evaluation=f"{cls.__module__}.{cls.__qualname__}",
        source_sha256=_source_sha256(cls),
    )


class ProvenanceStore:
    """``evalq:{run}:provenance``: one entry per distinct (host, device, code)."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client

    def record(self, run_id: str, found: WorkerProvenance) -> None:
        """Record ``found`` for the run, unless the same is recorded already."""
        encoded = found.model_dump_json()
        field = hashlib.sha256(encoded.encode()).hexdigest()[:16]
        self._client.hsetnx(RunKeys(run_id).provenance, field, encoded)

    def of_run(self, run_id: str, spec: str) -> RunProvenance:
        """The run's provenance: its spec and every worker record, sorted by host."""
        raw = self._client.hvals(RunKeys(run_id).provenance)
        workers = [WorkerProvenance.model_validate(json.loads(v)) for v in raw]
        return RunProvenance(spec=spec, workers=sorted(workers, key=lambda w: (w.host, w.device)))
