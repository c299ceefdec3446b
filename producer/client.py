"""evalq's Python API: what the CLI uses, with the policy applied to every read.

from producer.client import Client
from producer.submit import SubmitRequest

evalq = Client()                      # settings from EVALQ_*; admin=False
run = evalq.submit(SubmitRequest(eval="topic", dataset="demo", split="validation"))
evalq.status(run.run_id).aggregate    # None until completed, or when withheld
list(evalq.results(run.run_id))       # per-sample rows: viewable splits only

The stores are private: every read goes through a method that asks :mod:`shared.access.policy` what
this reader may see.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import redis
from celery import Celery
from pydantic import BaseModel, Field, computed_field

if TYPE_CHECKING:
    import pyarrow as pa
    from datasets import Dataset

from producer.comparison import Comparison, check_pairable, compare
from producer.follower import Follower
from producer.policy_file import PolicyFile, apply_policy
from producer.rescore import RescoreRequest, rescore
from producer.submit import SubmitRequest, submit
from shared.access.ledger import Budget, Ledger
from shared.access.policy import (
    Mechanism,
    Reader,
    ReleaseRule,
    Role,
    Tier,
    coarse_timing,
    read_access,
    release,
    release_rule,
    released_stats,
    run_tier,
    suggests_datasets,
)
from shared.access.registry import DatasetRegistry, RegisteredDataset
from shared.access.release import Released, ReleaseStore
from shared.access.tiers import TierRegistry
from shared.access.tokens import TokenRecord, TokenStore
from shared.connection import connect, server_time
from shared.data.spec import DatasetSpec, fetch_spec
from shared.errors import EvalqError, InputError, RunNotCompletedError, TierRefusedError
from shared.evaluation import create, failure_rule, load_plugins, lower_is_better, source
from shared.models import Progress, RunMeta, RunStatus, SampleResult, SampleState
from shared.queue.backlog import Backlog, Standing
from shared.queue.broker import Broker, carried
from shared.queue.celery_app import INFER_QUEUE, SCORE_QUEUE, SCORE_TASK, create_app
from shared.queue.sizing import enqueue
from shared.settings import Settings, get_settings
from shared.stats import Stat
from shared.store.archive import PART_ROWS, table_of
from shared.store.audit import audit_admin, recent, record
from shared.store.presence import Presence, WorkerBeat, absence, stale_code
from shared.store.provenance import ProvenanceStore, RunProvenance
from shared.store.reader import ResultReader
from shared.store.retention import expired, purge
from shared.store.runs import RunFilter, RunStore
from shared.store.wire import chunk_lines
from shared.store.writer import ResultWriter

__all__ = ["Cancellation", "Client", "Resumption", "RunView", "check_ended"]

LINE_ROWS = 10_000
"""Samples read from the store at a time for ``result_lines``."""

RELEASE_RETRIES = 20
"""Tries at committing a run's release while other reads of the same caller's runs move its
Ladder (each read retries only when another one committed)."""

CLI_RETRIES = 3
"""Connection retries of a client (about 0.35 s of back-off): a person waiting on a command
learns quickly that Redis is down; workers ride out longer drops."""


class RunView(BaseModel):
    """A run as a reader may see it."""

    meta: RunMeta
    """The run's record."""
    progress: Progress
    """Its counters."""
    tier: Tier
    """Its split's tier."""
    aggregate: dict[str, float] | None
    """The aggregate, when the run has one and the reader may see it: exact, or as the split's
    release rule releases it (see ``release``)."""
    withheld: str | None
    """Why the aggregate is not shown, when it is not."""
    release: Released | None = None
    """How the aggregate was released when not exactly (a non_viewable split, not an admin)."""
    stats: dict[str, Stat] | None = None
    """Each metric's mean, standard error, 95% interval and count, with the aggregate (as the
    release releases them: no exact error bar under a rounded release)."""
    provenance: RunProvenance | None = None
    """The dataset spec fingerprint and what each worker that stored outputs ran with."""
    errors: dict[str, int]
    """Terminal errors by ``stage/kind`` (by ``stage`` only for a reader without per-sample
    access: an exception's class name is whatever the code that raised it chose)."""
    stalled: str | None = None
    """Why nothing moves the run, while it is going and nothing does (no live worker serves
    it, or no progress for ``EVALQ_STALL_AFTER`` seconds); None otherwise."""
    waiting: Standing | None = None
    """Where the run stands in the fair dispatcher while samples of it wait in its backlog."""
    stale_code: str | None = None
    """While the run is going: why it would not run its evaluation's file as it is now (a live
    worker serving it loaded the file before it was edited); None otherwise."""
    timed: bool = True
    """The reader sees the run's timing (:attr:`shared.access.policy.Reader.sees_timing`): else
    ``meta`` and ``progress`` are coarse and there is no throughput nor ETA."""
    now: float = Field(default_factory=time.time, exclude=True)
    """When it was read (Redis's clock)."""

    @computed_field  # type: ignore[prop-decorator]
    @property
    def throughput(self) -> float | None:
        """Samples settled per second since submission (until it finished); None for a
        reader who does not see the run's timing."""
        if not self.timed:
            return None
        elapsed = (self.meta.finished or self.now) - self.meta.created
        return round(self.progress.done / elapsed, 3) if elapsed > 0 else 0.0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def eta_seconds(self) -> float | None:
        """Seconds left at the current throughput, while the run is going."""
        if not self.meta.status.active or not self.throughput or self.stalled:
            return None
        return round(max(0, self.meta.n - self.progress.done) / self.throughput, 1)

    def as_dict(self) -> dict[str, object]:
        """The run's record fields with the view's beside them (``status --json``)."""
        return {
            **self.meta.model_dump(mode="json"),
            **self.model_dump(mode="json", exclude={"meta"}),
        }


@dataclass(frozen=True)
class Resumption:
    """What ``resume`` re-enqueued."""

    run_id: str
    inference: int
    """Samples sent back to inference (no output stored)."""
    scoring: int
    """Samples sent back to scoring (output stored, no score or error)."""
    finalized: bool
    """Every sample was settled and the aggregate was (re)computed."""


@dataclass(frozen=True)
class Cancellation:
    """What ``cancel`` did."""

    run_id: str
    cancelled_now: bool
    refunded_samples: int


def _untimed(stalled: str) -> str:
    """Why a run is stalled, without the exact idle time (a time of its last write)."""
    return "no progress lately" if stalled.startswith("no progress for") else stalled


def _by_stage(errors: dict[str, int]) -> dict[str, int]:
    """``stage/kind`` counts summed by stage."""
    stages: dict[str, int] = {}
    for key, count in errors.items():
        stage = key.split("/", 1)[0]
        stages[stage] = stages.get(stage, 0) + count
    return stages


def check_ended(meta: RunMeta) -> RunMeta:
    """``meta`` if its run did not end ``failed`` or ``cancelled``; :class:`RunNotCompletedError`
    (exit code 4) if it did."""
    if meta.status in (RunStatus.FAILED, RunStatus.CANCELLED):
        why = f": {meta.reason}" if meta.reason else ""
        raise RunNotCompletedError(f"run {meta.run_id} ended {meta.status}{why}")
    return meta


class Client:
    """Submit, watch, read and cancel runs as one principal, admin or not."""

    def __init__(
        self,
        settings: Settings | None = None,
        admin: bool = False,
        *,
        principal: str | None = None,
        client: redis.Redis | None = None,
        app: Celery | None = None,
        sees_sources: bool = True,
    ) -> None:
        """Direct mode (an operator holding the Redis URL) reads ``settings``; the gateway
        passes the token's ``principal`` and its own shared Redis ``client`` and Celery
        ``app``, and whether the caller may see data sources (``sees_sources``: a run's spec
        fingerprint hashes its data file's digest, so a user sees it blank)."""
        self.settings = settings or get_settings()
        self.admin = admin
        self._sees_sources = sees_sources
        self._principal = principal or self.settings.principal
        self._redis = client or connect(self.settings.redis_url, retries=CLI_RETRIES)
        self._app = app
        self._runs = RunStore(self._redis)
        self._results = ResultReader(self._redis)
        self._writer = ResultWriter(self._redis)
        self._tiers = TierRegistry(self._redis)
        self._ledger = Ledger(self._redis)
        self._presence = Presence(self._redis)
        self._registry = DatasetRegistry(self._redis)
        self._tokens = TokenStore(self._redis)
        self._releases = ReleaseStore(self._redis)
        self._backlog = Backlog(self._redis)
        self._provenance = ProvenanceStore(self._redis)

    @property
    def app(self) -> Celery:
        """The Celery app used to publish (made on first use)."""
        if self._app is None:
            self._app = create_app(self.settings)
        return self._app

    @property
    def principal(self) -> str:
        """Who this client acts for."""
        return self._principal

    def submit(self, request: SubmitRequest) -> RunMeta:
        """Gate on tier and budget, then enqueue; see :func:`producer.submit.submit`."""
        load_plugins(self.settings.plugins)
        meta = submit(
            self._redis, self.app, request, principal=self.principal, admin=self.admin,
            archive=self.settings.archive_url,
            suggest=suggests_datasets(self.admin, self._sees_sources),
        )  # fmt: skip
        return self._outward(meta)

    def check_params(self, points: Sequence[SubmitRequest]) -> None:
        """Refuse (:class:`shared.errors.ParamError`, nothing charged) the first point whose
        params its evaluation does not declare as given: a sweep checks every point before
        it submits one."""
        load_plugins(self.settings.plugins)
        for point in points:
            create(point.eval, point.params)

    def _outward(self, meta: RunMeta) -> RunMeta:
        """``meta`` as this caller may see it: without the spec fingerprint unless it sees data
        sources (a hash over the data file's digest and path: with the path, an oracle for
        guessed labels of a small held-out file)."""
        return meta if self._sees_sources else meta.model_copy(update={"spec": ""})

    def rescore(self, request: RescoreRequest) -> RunMeta:
        """A new run scoring ``request.run``'s stored outputs with another evaluation; see
        :func:`producer.rescore.rescore`."""
        load_plugins(self.settings.plugins)
        meta = rescore(
            self._redis, self.app, request.run, request.eval, request.params,
            principal=self.principal, admin=self.admin, archive=self.settings.archive_url,
        )  # fmt: skip
        return self._outward(meta)

    def _reader(self, meta: RunMeta, aggregated: int | None = None) -> Reader:
        """What this reader may see of the run; the floor applies to the samples an aggregate
        is computed from (the scored ones), not to those submitted."""
        tier = run_tier(self._tiers.resolve(meta.dataset_id, meta.split), meta.registered)
        samples = meta.n if aggregated is None else aggregated
        return read_access(f"{meta.dataset_id}/{meta.split}", tier, self.admin, samples)

    def status(self, run_id: str) -> RunView:
        """The run's record and counters, and its aggregate where the policy allows it."""
        return self._view(self._runs.get(run_id), self._presence.live())

    def stalled(self, meta: RunMeta, progress: Progress) -> str | None:
        """Why nothing moves a going run: no live worker serves its evaluation (or consumes
        the queue its samples wait in), or it made no progress for ``stall_after`` seconds;
        None when it is moving or has ended."""
        waiting = self._backlog.standing(meta.run_id) if meta.status.active else None
        return self._stalled(meta, progress, self._presence.live(), waiting)

    def _stalled(
        self,
        meta: RunMeta,
        progress: Progress,
        workers: list[WorkerBeat],
        waiting: Standing | None,
    ) -> str | None:
        if not meta.status.active:
            return None
        queues = []
        if progress.inferred + progress.failed < meta.n:
            queues.append(INFER_QUEUE)
        if progress.inferred > progress.scored:
            queues.append(SCORE_QUEUE)
        missing = absence(workers, meta.eval, queues)
        if missing:
            return missing
        if waiting is not None:
            return None  # waiting its turn in the dispatcher, which says why: not stalled
        idle = server_time(self._redis) - (progress.touched or meta.created)
        if idle >= self.settings.stall_after:
            return f"no progress for {idle:.0f}s"
        return None

    def _as_read(
        self, meta: RunMeta, progress: Progress, now: float
    ) -> tuple[RunMeta, Progress, Reader]:
        """A run's record and counters as this reader reads them at ``now`` (coarse, as
        :func:`coarse_timing` makes them, for one who does not see the run's timing), and what
        it may read; an ended run's end is written into its facts (:meth:`RunStore.saw_end`)."""
        self._runs.saw_end(meta)
        reader = self._reader(meta, None if meta.status.active else progress.scored)
        if not reader.sees_timing:
            meta, progress = coarse_timing(meta, progress, now)
        return meta, progress, reader

    def _view(self, meta: RunMeta, workers: list[WorkerBeat]) -> RunView:
        progress = self._results.progress(meta.run_id)
        now = server_time(self._redis)
        waiting = self._backlog.standing(meta.run_id) if meta.status.active else None
        stalled = self._stalled(meta, progress, workers, waiting)
        meta, progress, reader = self._as_read(meta, progress, now)
        provenance = None
        if reader.sees_timing or not meta.status.active:
            provenance = self._provenance.of_run(meta.run_id, self._outward(meta).spec)
        else:  # where it stands in the dispatcher and who stored outputs move by batch
            waiting = None
        if not reader.sees_timing and stalled:
            stalled = _untimed(stalled)
        withheld = reader.withheld
        # only a completed run has an aggregate, and only then is the floor's count final (a
        # run read as going may complete before its aggregate is read)
        completed = meta.status is RunStatus.COMPLETED
        aggregate = self._results.aggregate(meta.run_id) if completed and not withheld else None
        released, stats = None, None
        if aggregate is not None:
            configured = self._releases.rule(meta.dataset_id, meta.split)
            rule = release_rule(reader, configured)
            stats = self._results.stats(meta.run_id)
            if rule.mechanism is not Mechanism.EXACT:
                released = self._release(meta, rule, aggregate, progress.scored)
                aggregate = released.aggregate
            if stats is not None:
                stats = released_stats(stats, rule, aggregate, progress.scored)
        errors = self._results.errors_by_kind(meta.run_id) if progress.failed else {}
        if not reader.sees_error_kinds:
            errors = _by_stage(errors)
            if stats is not None:
                stats = {
                    name: stat.model_copy(update={"failed": _by_stage(stat.failed)})
                    for name, stat in stats.items()
                }
        return RunView(
            meta=self._outward(meta),
            progress=progress,
            tier=reader.tier,
            aggregate=aggregate,
            withheld=withheld,
            release=released,
            stats=stats,
            provenance=provenance,
            errors=errors,
            stalled=stalled,
            waiting=waiting,
            stale_code=self._stale_code(meta, workers),
            timed=reader.sees_timing,
            now=now,
        )

    def _stale_code(self, meta: RunMeta, workers: list[WorkerBeat]) -> str | None:
        """While the run is going, whether live workers serving its evaluation run other code
        than its file holds now, as this process reads the file (the gateway's, or the CLI's
        after a submit loaded the plugins; this process's own staleness is logged once per
        change)."""
        found = source(meta.eval) if meta.status.active else None
        if found is None:
            return None
        found.stale()
        return stale_code(workers, meta.eval, found.now())

    def _release(
        self, meta: RunMeta, rule: ReleaseRule, aggregate: dict[str, float], samples: int
    ) -> Released:
        """The run's aggregate as ``rule`` releases it to its caller: fixed at the first read
        (a Ladder round), the same at every read after."""
        for _ in range(RELEASE_RETRIES):
            done = self._releases.released(meta.run_id)
            if done is not None:
                return done
            best = self._releases.best(meta)
            decisions = release(
                rule, aggregate, samples, meta.run_id, best=best,
                lower_is_better=lower_is_better(meta.eval),
            )  # fmt: skip
            described = rule.describe(samples)
            committed = self._releases.commit(meta, described, decisions, best, aggregate)
            if committed is not None:
                return committed
        raise EvalqError(f"run {meta.run_id}: its release kept racing other reads; try again")

    def recent(
        self, limit: int = 20, owner: str | None = None, only: RunFilter | None = None
    ) -> list[RunView]:
        """The newest runs first (only ``owner``'s, and those ``only`` matches, when given),
        as :meth:`status` shows them; viewed oldest first, so that runs first read here take
        their Ladder rounds in the order they were submitted."""
        workers = self._presence.live()
        now = server_time(self._redis)

        def shown(meta: RunMeta) -> RunMeta:
            if self._reader(meta).sees_timing:
                return meta
            return coarse_timing(meta, Progress(), now)[0]

        metas = self._runs.recent(limit, owner, only, shown)
        return [self._view(meta, workers) for meta in reversed(metas)][::-1]

    def ended(self, run_id: str) -> RunMeta:
        """The record of a run that has ended; :class:`RunNotCompletedError` (exit code 4)
        if it ended ``failed`` or ``cancelled``."""
        return self._outward(check_ended(self._runs.get(run_id)))

    def progress(self, run_id: str) -> tuple[RunMeta, Progress]:
        """The run's record and counters (counts only; coarse, as :func:`coarse_timing` makes
        them, for a reader who does not see the run's timing)."""
        meta, progress, _ = self._as_read(
            self._runs.get(run_id), self._results.progress(run_id), server_time(self._redis)
        )
        return self._outward(meta), progress

    def timeline(self, run_id: str) -> list[tuple[float, int]]:
        """(Unix time, samples settled) of every settling write, oldest first: per-sample
        timing, so only for a reader who sees it (:class:`TierRefusedError` otherwise)."""
        meta = self._runs.get(run_id)
        if not self._reader(meta).sees_timing:
            raise TierRefusedError(
                f"tier refused: {meta.dataset_id}/{meta.split} is not viewable; when its "
                "samples settled is per-sample data (the run's status shows it as a whole)"
            )
        return self._results.timeline(run_id)

    def spec(self, run_id: str) -> DatasetSpec:
        """The published dataset spec of a run (a source and routing, no rows)."""
        return fetch_spec(self._redis, self._runs.get(run_id).spec)

    def results(self, run_id: str, with_input: bool = False) -> Iterator[SampleResult]:
        """Per-sample results (each with its row when ``with_input``: the run's data must be
        readable here); refused unless the policy gives this reader full access."""
        self._readable(run_id)
        found = self._results.results(run_id)
        return self._with_input(run_id, found) if with_input else found

    def result_lines(self, run_id: str) -> Iterator[str]:
        """Per-sample results as JSON lines (:func:`shared.store.wire.text_line`), straight from
        the stored texts; refused as :meth:`results` is."""
        self._readable(run_id)
        return (
            line for chunk in self._results.chunks(run_id, LINE_ROWS) for line in chunk_lines(chunk)
        )

    def result_tables(self, run_id: str) -> Iterator[pa.Table]:
        """Per-sample results as tables of the archive's columns; refused as :meth:`results`
        is."""
        self._readable(run_id)
        return self._results.tables(run_id)

    def _with_input(self, run_id: str, results: Iterator[SampleResult]) -> Iterator[SampleResult]:
        """``results`` each with its row; the data is opened here, so that a source this
        machine cannot read fails before any result is written."""
        return map(self._input_adder(run_id), results)

    def _row_reader(self, run_id: str) -> Callable[[int], dict[str, Any]]:
        """What reads one sample's row of the run's split, labels included, as JSON values:
        the split re-materialised from the run's spec (the data is opened here)."""
        from shared.data.loading import load_rows

        rows = load_rows(self.spec(run_id))

        def row_of(sample_id: int) -> dict[str, Any]:
            return dict(json.loads(json.dumps(rows[sample_id], default=str)))

        return row_of

    def _input_adder(self, run_id: str) -> Callable[[SampleResult], SampleResult]:
        """What adds its row to one of the run's results (the data is opened here)."""
        row_of = self._row_reader(run_id)

        def added(result: SampleResult) -> SampleResult:
            return result.model_copy(update={"input": row_of(result.sample_id)})

        return added

    def rows(self, run_id: str, sample_ids: Iterable[int]) -> dict[int, dict[str, Any]]:
        """Those samples' rows, labels included, read from the run's data where this runs (the
        results hold no input, and no label: labels are scrubbed before inference); refused
        as :meth:`results` is."""
        self._readable(run_id)
        row_of = self._row_reader(run_id)
        return {i: row_of(i) for i in sample_ids}

    def states(self, run_id: str) -> Iterator[tuple[int, SampleState]]:
        """Each sample's state (pending, scored, failed) without its values: every reader."""
        for result in self._results.results(run_id):
            yield result.sample_id, result.state

    def follow_results(
        self, run_id: str, block_ms: int = 500, with_input: bool = False
    ) -> Iterator[SampleResult]:
        """Each sample's result as soon as it is settled, once each, until the run ends; the
        policy is asked here, before anything is returned (or a file opened for it)."""
        follower = self.follower(run_id, with_input=with_input)
        return follower.waiting(block_ms)

    def follower(self, run_id: str, with_input: bool = False) -> Follower:
        """A :class:`producer.follower.Follower` of the run's results, whose steps never wait
        unless asked to (the gateway waits between them asynchronously); the policy is asked
        here, before anything is read."""
        self._readable(run_id)
        adder = self._input_adder(run_id) if with_input else None
        return Follower(self._results, self._runs, run_id, adder)

    def _readable(self, run_id: str) -> None:
        """Refuse, before any result is streamed, a reader without per-sample access and a
        run whose record names an archive outside its folder."""
        meta = self._runs.get(run_id)
        self._runs.saw_end(meta)
        reader = self._reader(meta)
        reader.require_samples()
        self._results.archive_url(run_id)
        if reader.bypasses:
            audit_admin(self._redis, "admin_read", self.principal, meta, {"tier": reader.tier})

    def cancel(self, run_id: str) -> Cancellation:
        """Stop a run, keep what finished, refund (once) the samples that produced nothing."""
        meta = self._runs.get(run_id)
        state, unproduced = self._runs.cancel(run_id)
        self._backlog.withdraw(run_id)
        if state < 0:
            raise EvalqError(f"run {run_id} has already finished; nothing to cancel")
        refunded = 0
        if meta.charged and unproduced > 0:
            refunded = self._ledger.refund(
                meta.dataset_id,
                meta.split,
                run_id,
                runs=0,
                samples=unproduced,
                who=self.principal,
                submitter=meta.principal,
                reason="cancelled",
            )
        return Cancellation(run_id, state == 1, refunded)

    def resume(self, run_id: str) -> Resumption:
        """Re-enqueue every sample without a terminal result; charges nothing.

        Samples with an output go back to scoring, the rest to the run's backlog for inference
        with a fresh attempt count; a sample a message still carries (in the run's backlog, a
        broker queue, or held by a worker) is not sent again, so resuming a queued run adds
        nothing. If every sample is settled but the run never finished, its aggregate is
        computed here.
        """
        meta = self._runs.get(run_id)
        if meta.status is RunStatus.CANCELLED:
            raise EvalqError(f"run {run_id} was cancelled and refunded; submit it again instead")
        if meta.archived is not None:
            raise InputError(f"run {run_id} is archived; submit it again instead")
        ids = self._runs.sample_ids(run_id)
        queued = self._queued(run_id)  # first: a message acknowledged after is settled then
        settled = self._results.settled(run_id, ids) | queued
        missing = [i for i in ids if i not in settled]
        if not missing:
            finalize = meta.status.active and not self._queued(
                run_id
            )  # settled, but the finalizer never finished
            if finalize:
                load_plugins(self.settings.plugins)
                evaluation = create(meta.eval, meta.params)
                self._writer.finalize(run_id, evaluation, partial(self._clusters, meta))
                self._runs.retire(run_id)
            return Resumption(run_id, 0, 0, finalize)
        inferred = self._results.inferred(run_id, missing)
        to_score = [i for i in missing if i in inferred]
        to_infer = [i for i in missing if i not in inferred]
        self._writer.reset_attempts(run_id, to_infer)
        self._backlog.enqueue(self.app, meta, to_infer)
        enqueue(self.app, SCORE_TASK, meta, to_score)
        return Resumption(run_id, len(to_infer), len(to_score), False)

    def _queued(self, run_id: str) -> set[int]:
        """The samples of ``run_id`` a message still carries: in its backlog, in a broker
        queue, or held (unacknowledged) by a live worker (a dead worker's are lost until the
        janitor puts them back)."""
        carried_now = [carried(raw) for raw in self._backlog.messages(run_id)]
        held = {tag for beat in self._presence.live() for tag in beat.held}
        broker = Broker(self.app, self._redis)
        try:
            carried_now += broker.waiting(held).get(run_id, [])
        finally:
            broker.close()
        return {i for task in carried_now if task is not None for i in task.sample_ids}

    def _clusters(self, meta: RunMeta, sample_ids: list[int]) -> dict[int, str] | None:
        """The clusters of a run's samples, read from its data where this client runs."""
        from shared.data.loading import load_rows

        rows = load_rows(self.spec(meta.run_id))
        return create(meta.eval, meta.params).clusters({i: rows[i] for i in sample_ids})

    def add_dataset(
        self, name: str, data: str, *, revision: str | None = None, config: str | None = None
    ) -> RegisteredDataset:
        """Register ``data`` as ``name``, each split pinned (audited)."""
        return self._registry.add(name, data, who=self.principal, revision=revision, config=config)[
            0
        ]

    def datasets(self) -> list[RegisteredDataset]:
        """Every registered dataset."""
        return self._registry.all()

    def set_tier(self, dataset: str, split: str, tier: Tier) -> Tier | None:
        """Set a split's tier (audited); return the one before (None if unlisted)."""
        return self._tiers.set(dataset, split, tier, who=self.principal)

    def tiers(self) -> dict[str, dict[str, Tier]]:
        """Every listed split's tier, by dataset (unlisted splits are ``no_access``)."""
        return self._tiers.listed()

    def set_budget(
        self,
        dataset: str,
        split: str,
        *,
        runs: int | None,
        samples: int | None,
        max_samples_per_run: int | None,
        caller: str | None = None,
    ) -> Budget:
        """Replace a split's budget totals, or ``caller``'s own on it (None = unlimited), keep
        what was used (audited)."""
        return self._ledger.set(
            dataset,
            split,
            runs=runs,
            samples=samples,
            max_samples_per_run=max_samples_per_run,
            who=self.principal,
            caller=caller,
        )

    def budgets(self) -> list[Budget]:
        """Every stored budget."""
        return self._ledger.all()

    def apply_policy(self, policy: PolicyFile) -> list[str]:
        """Apply a policy file's tiers, budgets, release rules and priorities (checked whole
        first); return warnings."""
        registered = {d.name: list(d.splits) for d in self._registry.all()}
        return apply_policy(policy, self._redis, registered=registered, who=self.principal)

    def owner(self, run_id: str) -> str:
        """Who submitted the run."""
        return self._runs.get(run_id).principal

    def compare(self, run_ids: Sequence[str], flips: int = 10) -> Comparison:
        """Each run against the first, sample by sample (:mod:`producer.comparison`), beside
        each run's own stats as :meth:`status` gives them; every run must be readable per
        sample by this reader (a ``non_viewable`` split's pairs are statistics of its labels:
        admins only, audited) and all must pair."""
        metas = [self._runs.get(run_id) for run_id in run_ids]
        for meta in metas:  # before pairing, whose refusal names the runs' data
            self._readable(meta.run_id)
        check_pairable(metas)
        load_plugins(self.settings.plugins)
        scores = [
            self._results.counted(meta.run_id, failure_rule(meta.eval)).scores for meta in metas
        ]
        stats = [self.status(meta.run_id).stats for meta in metas]
        return compare([m.run_id for m in metas], scores, flips, stats)

    def report(self, run_id: str) -> str:
        """The run's self-contained HTML report (charts as its split's tier allows)."""
        from producer.report import gather, render

        return render(gather(self, run_id))

    def create_token(self, principal: str, role: Role) -> str:
        """A new API token for ``principal`` (shown once; stored as a digest; audited)."""
        return self._tokens.create(principal, role, who=self.principal)

    def tokens(self) -> list[TokenRecord]:
        """Every live token's principal, role and creation (never the token)."""
        return self._tokens.all()

    def revoke_tokens(self, principal: str) -> int:
        """Revoke every token of ``principal`` (audited); return how many."""
        return self._tokens.revoke(principal, who=self.principal)

    def results_dataset(self, run_id: str) -> Dataset:
        """The run's per-sample results as a Hugging Face ``datasets.Dataset``, live or
        archived alike: ``sample_id``, ``output``, ``scores`` and ``error`` (JSON text, as
        stored) and ``score.<metric>`` (float64); refused as :meth:`results` is."""
        from datasets import Dataset

        self._readable(run_id)
        archive = self._results.archive(run_id)
        if archive is not None:
            return Dataset(archive.table())
        return Dataset(table_of(self._results.chunks(run_id, PART_ROWS)))

    def purge(self, run_ids: Sequence[str] = (), older_than: float | None = None) -> list[str]:
        """Remove ended runs wholly (:mod:`shared.store.retention`): those named, and those
        submitted more than ``older_than`` seconds ago; audited. Naming a going run, or none
        at all, is refused before anything is removed."""
        if not run_ids and older_than is None:
            raise InputError("say which runs to purge: --run RUN or --older-than AGE")
        for run_id in run_ids:
            meta = self._runs.get(run_id)
            if meta.status.active:
                raise InputError(f"run {run_id} is {meta.status}; cancel it before purging it")
        targets = list(dict.fromkeys(run_ids))
        if older_than is not None:
            before = server_time(self._redis) - older_than
            targets += [r for r in expired(self._redis, before) if r not in targets]
        purged = [r for r in targets if purge(self._redis, r, self.settings.archive_url)]
        for run_id in purged:
            record(
                self._redis, "purge", self.principal, run=run_id, after={"older_than": older_than}
            )
        return purged

    def audit(self, limit: int = 50) -> list[dict[str, str]]:
        """The newest ``limit`` audit entries, oldest first."""
        return recent(self._redis, limit)

    def close(self) -> None:
        """Close the Redis connection."""
        self._redis.close()
