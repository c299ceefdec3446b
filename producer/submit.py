"""Submitting a run: validate, publish the spec, record the run, enqueue its samples."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import redis
from celery import Celery

from shared.celery_app import INFER_TASK
from shared.data import build_spec
from shared.dispatch import publish, split
from shared.errors import InputError, SampleIdError
from shared.evaluation import create
from shared.models import RunMeta, RunStatus
from shared.runs import RunStore
from shared.spec import publish_spec

__all__ = ["SubmitRequest", "parse_ids", "parse_params", "resolve_ids", "submit"]


@dataclass(frozen=True)
class SubmitRequest:
    """What ``evalq submit`` was asked to do."""

    eval: str
    data: str
    split: str
    limit: int | None = None
    ids: Sequence[int] | None = None
    params: Mapping[str, str] = field(default_factory=dict)
    revision: str | None = None
    config: str | None = None
    dataset_id: str | None = None


def parse_ids(text: str) -> list[int]:
    """``"3,7,9"`` -> ``[3, 7, 9]``; anything else is a :class:`SampleIdError`."""
    ids: list[int] = []
    for part in text.split(","):
        token = part.strip()
        if not token.isdigit():
            raise SampleIdError(f"--ids takes comma-separated non-negative integers, got {token!r}")
        ids.append(int(token))
    return ids


def parse_params(pairs: Sequence[str]) -> dict[str, str]:
    """``["k=v", ...]`` -> ``{"k": "v"}``."""
    params: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InputError(f"--param takes key=value, got {pair!r}")
        params[key.strip()] = value
    return params


def resolve_ids(n_rows: int, limit: int | None, ids: Sequence[int] | None) -> list[int]:
    """The sample ids of a run: explicit ``ids``, the first ``limit`` rows, or every row."""
    if limit is not None and ids is not None:
        raise InputError("give --limit or --ids, not both")
    if ids is not None:
        seen: set[int] = set()
        for sample_id in ids:
            if not 0 <= sample_id < n_rows:
                raise SampleIdError(
                    f"sample id {sample_id} is out of range: the split has {n_rows} rows"
                )
            if sample_id in seen:
                raise SampleIdError(f"sample id {sample_id} is given twice")
            seen.add(sample_id)
        resolved = list(ids)
    elif limit is not None:
        if limit < 1:
            raise InputError(f"--limit must be at least 1, got {limit}")
        resolved = list(range(min(limit, n_rows)))
    else:
        resolved = list(range(n_rows))
    if not resolved:
        raise InputError("the run would have no samples: the split is empty")
    return resolved


def submit(client: redis.Redis, app: Celery, request: SubmitRequest) -> RunMeta:
    """Validate ``request``, publish its spec, record the run and enqueue its samples."""
    create(request.eval, request.params)
    spec, _ = build_spec(request.data, request.split, request.revision, request.config)
    sample_ids = resolve_ids(spec.n_rows, request.limit, request.ids)
    fingerprint = publish_spec(client, spec)
    meta = RunMeta(
        run_id=uuid.uuid4().hex[:16],
        eval=request.eval,
        params=dict(request.params),
        spec=fingerprint,
        dataset_id=request.dataset_id or request.data,
        split=request.split,
        n=len(sample_ids),
        status=RunStatus.QUEUED,
        created=time.time(),
    )
    RunStore(client).create(meta, sample_ids)
    publish(app, INFER_TASK, split(meta.run_id, meta.eval, fingerprint, sample_ids))
    return meta
