"""Submitting a run: gate it on the split's tier and budget, then publish and enqueue.

Order for a non-admin: resolve the tier -> :func:`evalq.shared.access.policy.admit_split` refuses
``no_access``, and :func:`evalq.shared.access.policy.admit_sample_choice` caller-chosen ids on a
``non_viewable`` split, before the data is read or the ledger touched -> read the split (fitting
its routing) and resolve the sample ids (on a ``non_viewable`` split: the whole split or a
subset the server draws) -> :func:`evalq.shared.access.policy.admit_run` applies the tier and the
k-anonymity floor to the resolved count -> reserve run and samples in one Lua script -> publish
the spec, record the run, stage the ids shard by shard in the run's backlog, from which the fair
dispatcher (:mod:`evalq.shared.queue.backlog`) hands them to the workers. If anything fails after
the reservation, it is refunded (once) and the run, if it was recorded, is cancelled. An admin
bypasses tier and budget; the bypass is audited.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated

import redis
from celery import Celery
from pydantic import BaseModel, ConfigDict, Field, model_validator

from evalq.producer.service.language import check_rows, prepare_harness, resolve, with_examples
from evalq.shared.access.ledger import Ledger
from evalq.shared.access.policy import (
    Access,
    Tier,
    admit_grader,
    admit_run,
    admit_sample_choice,
    admit_source,
    admit_split,
    read_access,
    server_draws,
)
from evalq.shared.access.priorities import PriorityStore, admit_priority
from evalq.shared.access.registry import DatasetRegistry
from evalq.shared.access.tiers import TierRegistry
from evalq.shared.connection import server_time
from evalq.shared.data.loading import Sharding, resolve_source, shard_order, spec_of
from evalq.shared.data.remote import DataCache
from evalq.shared.data.routing import RoutingKind
from evalq.shared.data.spec import Source, publish_spec
from evalq.shared.errors import InputError, SampleIdError
from evalq.shared.lm.harness import HarnessRun
from evalq.shared.lm.run import LanguageRun
from evalq.shared.models import Priority, RunMeta, RunStatus
from evalq.shared.queue.backlog import Backlog
from evalq.shared.settings import Settings
from evalq.shared.store.audit import audit_admin
from evalq.shared.store.requests import RequestStore
from evalq.shared.store.runs import RunStore

__all__ = [
    "PARAMS_CHARS",
    "SubmitRequest",
    "draw_ids",
    "parse_ids",
    "parse_params",
    "resolve_ids",
    "start",
    "submit",
]


PARAMS_CHARS = 16_384
"""Characters of a run's parameters, names and values together."""


class SubmitRequest(BaseModel):
    """What ``evalq submit`` was asked to do (also the gateway's request body)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    eval: str = Field(min_length=1, max_length=200)
    """Registered evaluation."""
    split: str = Field(min_length=1, max_length=200)
    """Split to evaluate."""
    dataset: str | None = Field(default=None, max_length=200)
    """Registered dataset name (``--dataset``): tiers and budgets are its."""
    data: str | None = Field(default=None, max_length=4096)
    """An unregistered source (``--data``): operators and admins only (it is ``no_access``)."""
    limit: int | None = Field(default=None, ge=1)
    num_fewshot: int | None = Field(default=None, ge=0, le=1024)
    """``--num-fewshot``: an lm-eval task's few-shot examples per prompt (default: its
    config's; a config that sets 0 keeps 0, as lm-eval does)."""
    ids: tuple[Annotated[int, Field(ge=0, lt=2**53)], ...] | None = Field(
        default=None, max_length=10_000_000
    )
    params: dict[
        Annotated[str, Field(min_length=1, max_length=100)],
        Annotated[str, Field(max_length=PARAMS_CHARS)],
    ] = Field(default_factory=dict, max_length=64)
    """``--param k=v``: at most 64, of :data:`PARAMS_CHARS` characters in all (they are kept
    in the run's record for as long as the run)."""
    model: str | None = Field(default=None, min_length=1, max_length=1024)
    """``--model hf/<folder or Hub id>[@revision]``: the model a registered task runs on."""
    model_args: dict[
        Annotated[str, Field(min_length=1, max_length=100)],
        Annotated[str, Field(max_length=200)],
    ] = Field(default_factory=dict, max_length=16)
    """``--model-arg k=v`` (:class:`evalq.shared.lm.spec.ModelArgs` declares them)."""
    cache: bool = False
    """``--cache``: an endpoint model's answers come from the fleet's response cache when it
    holds them (no request, no tokens), and go to it."""
    revision: str | None = Field(default=None, max_length=200)
    """Hub revision of an unregistered source."""
    config: str | None = Field(default=None, max_length=200)
    """Hub configuration of an unregistered source."""
    sharding: Sharding = Field(default_factory=Sharding)
    priority: Priority | None = None
    """``--priority``: the run's weight in the fair dispatcher; None = the policy's default."""
    sweep: str | None = Field(default=None, pattern=r"^[0-9a-f]{1,32}$")
    """The grid this run belongs to (``submit --sweep`` sets it)."""
    tags: tuple[Annotated[str, Field(pattern=r"^[\w.:/-]{1,64}$")], ...] = Field(
        default=(), max_length=20
    )
    """``--tag``: labels to find the run by (``runs --tag``)."""

    @model_validator(mode="after")
    def _bounded_params(self) -> SubmitRequest:
        size = sum(len(k) + len(v) for k, v in self.params.items())
        if size > PARAMS_CHARS:
            raise ValueError(
                f"--param values hold {size:,} characters in all; at most {PARAMS_CHARS:,} are "
                "kept with a run"
            )
        return self

    @model_validator(mode="after")
    def _one_source(self) -> SubmitRequest:
        if (self.dataset is None) == (self.data is None):
            raise ValueError(
                "give --dataset NAME (a registered dataset) or --data SOURCE (unregistered: "
                "operators and admins only), not both or neither"
            )
        if self.dataset is not None and (self.revision or self.config):
            raise ValueError("--revision and --config are pinned by the registered dataset")
        return self

    @property
    def where(self) -> str:
        """``dataset/split`` as messages and the audit show it."""
        return f"{self.dataset or self.data}/{self.split}"


def parse_ids(text: str) -> list[int]:
    """``"3,7,9"`` -> ``[3, 7, 9]``; anything else is a :class:`SampleIdError`."""
    ids: list[int] = []
    for part in text.split(","):
        token = part.strip()
        if not token.isdigit():
            raise SampleIdError(f"--ids takes comma-separated non-negative integers, got {token!r}")
        ids.append(int(token))
    return ids


def parse_params(pairs: Sequence[str], option: str = "--param") -> dict[str, str]:
    """``["k=v", ...]`` -> ``{"k": "v"}``."""
    params: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InputError(f"{option} takes key=value, got {pair!r}")
        params[key.strip()] = value
    return params


def draw_ids(n_rows: int, limit: int | None) -> list[int]:
    """Every row, or ``limit`` of them drawn uniformly by the operating system's random source
    (a fresh draw per run; the caller never learns which), in row order."""
    if n_rows < 1:
        raise InputError("the run would have no samples: the split is empty")
    if limit is None or limit >= n_rows:
        return list(range(n_rows))
    return sorted(secrets.SystemRandom().sample(range(n_rows), limit))


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


def _locate(
    client: redis.Redis,
    request: SubmitRequest,
    admin: bool,
    suggest: bool,
    data_cache: DataCache | None,
) -> tuple[Source, Tier]:
    """The source to read and the tier that applies: a registered dataset's pinned split and
    its tier, or an unregistered source (``no_access``: refused here to a non-admin before
    anything is read). An unknown dataset name is :class:`UnknownDatasetError` (exit 2), with
    the closest registered name when ``suggest``
    (:func:`evalq.shared.access.policy.suggests_datasets`)."""
    if request.data is not None:
        admit_source(request.where, registered=False, admin=admin)
        source = resolve_source(
            request.data, request.split, request.revision, request.config, data_cache
        )
        return source, Tier.NO_ACCESS
    name = str(request.dataset)
    source = DatasetRegistry(client).named(name, suggest=suggest).source(request.split)
    return source, TierRegistry(client).resolve(name, request.split)


def submit(  # noqa: PLR0913 - the client's handles and settings, each named
    client: redis.Redis,
    app: Celery,
    request: SubmitRequest,
    *,
    principal: str,
    admin: bool = False,
    archive: str,
    suggest: bool = False,
    model_roots: Sequence[Path] = (),
    data_cache: DataCache | None = None,
    sizes: tuple[int, int] | None = None,
) -> RunMeta:
    """Gate, publish and enqueue ``request`` (its results to be archived under ``archive``);
    return the new run's record. ``suggest``: an unknown dataset name's error may name the
    closest registered one; ``data_cache``: where an object-store source's copies are kept;
    ``sizes``: the most bytes a sample's output and a run's may take (an lm-eval task's
    requests, which its outputs repeat, are held to them before anything is stored; None:
    the settings' defaults)."""
    evaluation, language = resolve(
        client,
        request.eval,
        request.params,
        request.model,
        request.model_args,
        admin=admin,
        model_roots=model_roots,
    )
    if request.num_fewshot is not None and not isinstance(language, HarnessRun):
        raise InputError("--num-fewshot is for lm-eval tasks (a YAML task sets its few-shot)")
    if request.cache:
        if language is None or language.model.endpoint is None:
            raise InputError(
                "--cache is for endpoint models (--model openai/…): local models are not cached"
            )
        language = language.model_copy(update={"cache": True})
    sharding = request.sharding
    if sharding.routing is RoutingKind.KMEANS and sharding.route_field in evaluation.label_fields:
        raise InputError(
            f"--route-field '{sharding.route_field}' is a label field of '{request.eval}': "
            "shards cut by it would reveal labels"
        )
    where = request.where
    source, tier = _locate(client, request, admin, suggest, data_cache)
    admit_split(where, tier, admin)
    admit_sample_choice(where, tier, admin, request.ids is not None)
    graded = isinstance(language, LanguageRun) and language.task.grader is not None
    admit_grader(where, tier, admin, graded)
    defaults = PriorityStore(client).defaults(principal, request.dataset or "", request.split)
    priority = admit_priority(
        request.priority,
        principal_default=defaults.principal,
        split_default=defaults.split,
        admin=admin,
    )
    spec, rows = spec_of(source, request.split, sharding, data_cache)
    if server_draws(tier, admin):
        sample_ids = draw_ids(spec.n_rows, request.limit)
    else:
        sample_ids = resolve_ids(spec.n_rows, request.limit, request.ids)
    admit_run(where, tier, admin, len(sample_ids))
    dataset = request.dataset or str(request.data)
    requests: dict[str, bytes] = {}
    if isinstance(language, HarnessRun):
        language, requests = prepare_harness(
            client,
            language,
            dataset=dataset,
            registered=request.dataset is not None,
            split=request.split,
            rows=rows,
            sample_ids=sample_ids,
            num_fewshot=request.num_fewshot,
            data_cache=data_cache,
        )
        _check_sizes(requests, *(sizes or _DEFAULT_SIZES))
    elif language is not None:
        shown = read_access(where, tier, admin, len(sample_ids)).access is Access.FULL
        check_rows(language.task, rows, sample_ids, shown=shown)
        language = with_examples(
            client,
            language,
            dataset=dataset,
            split=request.split,
            registered=request.dataset is not None,
            data_cache=data_cache,
        )
    meta = RunMeta(
        run_id=uuid.uuid4().hex[:16],
        eval=request.eval,
        params=dict(request.params),
        model=None if language is None else str(language.model),
        task=None if language is None else language.model_dump_json(),
        spec=spec.fingerprint,
        dataset_id=dataset,
        registered=request.dataset is not None,
        split=request.split,
        n=len(sample_ids),
        status=RunStatus.QUEUED,
        created=server_time(client),
        principal=principal,
        admin=admin,
        charged=not admin,
        priority=priority,
        sweep=request.sweep,
        tags=request.tags,
    )
    publish_spec(client, spec)
    backlog = Backlog(client)

    def enqueue() -> None:
        if requests:  # an lm-eval task's: where its workers read them, before any message
            RequestStore(client).put(meta.run_id, requests)
        backlog.enqueue(app, meta, shard_order(spec, rows, sample_ids))

    start(client, meta, sample_ids, enqueue, archive=archive)
    return meta


_DEFAULT_SIZES = (
    Settings.model_fields["max_output_bytes"].default,
    Settings.model_fields["max_run_bytes"].default,
)
"""``EVALQ_MAX_OUTPUT_BYTES`` and ``EVALQ_MAX_RUN_BYTES`` unset."""


def _check_sizes(requests: Mapping[str, bytes], per_sample: int, per_run: int) -> None:
    """An lm-eval run's requests within what its outputs may take: :class:`InputError` (exit
    2, nothing stored or charged) for a sample's over ``per_sample`` bytes or all over
    ``per_run``."""
    largest = max(map(len, requests.values()), default=0)
    if largest > per_sample:
        raise InputError(
            f"a sample's lm-eval requests take {largest:,} bytes, over the {per_sample:,} its "
            "output may (EVALQ_MAX_OUTPUT_BYTES): use fewer few-shot examples"
        )
    total = sum(map(len, requests.values()))
    if total > per_run:
        raise InputError(
            f"the run's lm-eval requests take {total:,} bytes, over the {per_run:,} a run may "
            "(EVALQ_MAX_RUN_BYTES): use --limit or fewer few-shot examples"
        )


def start(
    client: redis.Redis,
    meta: RunMeta,
    sample_ids: list[int],
    enqueue: Callable[[], object],
    *,
    archive: str,
) -> None:
    """Record a new run (its results to go under ``archive``), open it and charge it (or, for
    an admin, audit it) in one script, then ``enqueue`` its work; if enqueueing fails, the run
    is cancelled and its charge refunded, once. Killed anywhere, a producer leaves a run and
    its charge, or neither."""
    ledger = Ledger(client)
    who = meta.principal
    if meta.admin:
        audit_admin(client, "admin_submit", who, meta, {"bypassed": ["tier", "budget"]})
    runs = RunStore(client)
    runs.create(meta, sample_ids, archive)
    try:
        ledger.reserve(meta)
    except BaseException:
        runs.discard(meta.run_id)
        raise
    try:
        enqueue()
    except BaseException:
        runs.cancel(meta.run_id)
        Backlog(client).withdraw(meta.run_id)
        if meta.charged:
            ledger.refund(
                meta.dataset_id,
                meta.split,
                meta.run_id,
                runs=1,
                samples=meta.n,
                who=who,
                submitter=who,
                reason="enqueue failed",
            )
        raise
