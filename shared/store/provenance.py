"""Which code, packages, hosts and devices produced a run's outputs.

Each worker process that stores outputs of a run records, once per run, what it ran with: its
host and device, Python and the versions of evalq, torch, transformers and datasets, and the
evaluation's module with a sha256 of its source file as the process loaded it, and the file's
sha256 now when it differs (the file was edited after the process started: stale code).
Records of the same (host, device, code) are one entry (``HSETNX`` in
``evalq:{run}:provenance``). ``status`` and the report show them with the run's dataset spec
fingerprint.
"""

from __future__ import annotations

import hashlib
import json
import platform
import socket
from functools import cache
from importlib import metadata

import redis

from evalq.shared.evaluation import Evaluation, source
from evalq.shared.keys import RunKeys
from evalq.shared.kinds import runner_of
from evalq.shared.models import RunProvenance, WorkerProvenance

__all__ = ["PACKAGES", "ProvenanceStore", "of_worker"]

PACKAGES = ("evalq", "torch", "transformers", "datasets")


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


@cache
def _packages() -> tuple[tuple[str, str], ...]:
    return tuple((p, _version(p)) for p in PACKAGES)


def of_worker(evaluation: Evaluation, device: str) -> WorkerProvenance:
    """This process's provenance for ``evaluation`` on ``device``."""
    runner = runner_of(evaluation)
    found = source(evaluation.name)
    defined = runner.definition()
    return WorkerProvenance(
        host=socket.gethostname(),
        device=device,
        python=platform.python_version(),
        packages=dict(_packages()),
        evaluation=runner.described(),
        source_sha256=defined or ("unknown" if found is None else found.loaded),
        source_now=None if found is None or defined else found.changed(),
        weights=runner.weights(),
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
