"""evalq's Python API: what the CLI uses, with the tier policy applied to every read.

from producer.client import Client
from producer.submit import SubmitRequest

evalq = Client()                      # settings from EVALQ_*; admin=False
run = evalq.submit(SubmitRequest(eval="topic", data="data/", split="validation"))
evalq.status(run.run_id).aggregate    # None until completed, or when withheld
list(evalq.results(run.run_id))       # per-sample rows: viewable splits only
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property

from celery import Celery

from producer.submit import SubmitRequest, submit
from shared.audit import audit_admin
from shared.celery_app import INFER_TASK, SCORE_TASK, create_app
from shared.connection import connect
from shared.dispatch import message_size, publish, split
from shared.errors import EvalqError, TierRefusedError
from shared.evaluation import create, load_plugins
from shared.keys import RunKeys
from shared.ledger import Ledger
from shared.models import Progress, RunMeta, RunStatus, SampleResult
from shared.results import ResultStore
from shared.runs import RunStore
from shared.scripts import Scripts
from shared.settings import Settings, get_settings
from shared.tiers import MIN_AGGREGATE_SAMPLES, Access, Tier, TierRegistry, access

__all__ = ["Cancellation", "Client", "Resumption", "RunView"]


@dataclass(frozen=True)
class RunView:
    """A run as a reader may see it."""

    meta: RunMeta
    progress: Progress
    tier: Tier
    aggregate: dict[str, float] | None
    withheld: str | None
    """Why the aggregate is not shown, when it is not."""
    errors: dict[str, int]
    """Terminal errors by ``stage/kind``."""

    @property
    def throughput(self) -> float:
        """Samples settled per second since submission (until it finished)."""
        elapsed = (self.meta.finished or time.time()) - self.meta.created
        return self.progress.done / elapsed if elapsed > 0 else 0.0

    @property
    def eta_seconds(self) -> float | None:
        """Seconds left at the current throughput, while the run is going."""
        if not self.meta.status.active or not self.throughput:
            return None
        return max(0, self.meta.n - self.progress.done) / self.throughput

    def as_dict(self) -> dict[str, object]:
        return {
            **self.meta.model_dump(mode="json"),
            "tier": self.tier.value,
            "progress": self.progress.model_dump(),
            "throughput": round(self.throughput, 3),
            "eta_seconds": None if self.eta_seconds is None else round(self.eta_seconds, 1),
            "errors": self.errors,
            "aggregate": self.aggregate,
            "withheld": self.withheld,
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


class Client:
    """Submit, watch, read and cancel runs as one principal, admin or not."""

    def __init__(self, settings: Settings | None = None, admin: bool = False) -> None:
        self.settings = settings or get_settings()
        self.admin = admin
        self.redis = connect(self.settings.redis_url)
        self.runs = RunStore(self.redis)
        self.store = ResultStore(self.redis)
        self.tiers = TierRegistry(self.redis)
        self.ledger = Ledger(self.redis)

    @cached_property
    def app(self) -> Celery:
        """The Celery app used to publish."""
        return create_app(self.settings)

    def submit(self, request: SubmitRequest) -> RunMeta:
        """Gate on tier and budget, then enqueue; see :func:`producer.submit.submit`."""
        load_plugins(self.settings.plugins)
        return submit(self.redis, self.app, request, self.settings.principal, self.admin)

    def _access(self, meta: RunMeta) -> tuple[Tier, Access]:
        tier = self.tiers.resolve(meta.dataset_id, meta.split)
        return tier, access(tier, self.admin, meta.n)

    def status(self, run_id: str) -> RunView:
        """The run's record and counters, and its aggregate where the tier allows it."""
        return self._view(self.runs.get(run_id))

    def _view(self, meta: RunMeta) -> RunView:
        run_id = meta.run_id
        tier, allowed = self._access(meta)
        withheld = None
        aggregate = None
        if allowed is Access.NONE:
            withheld = (
                f"{meta.dataset_id}/{meta.split} is {tier.value}"
                if tier is Tier.NO_ACCESS
                else f"fewer than {MIN_AGGREGATE_SAMPLES} samples of a non_viewable split"
            )
        else:
            aggregate = self.store.aggregate(run_id)
        progress = self.store.progress(run_id)
        errors = self.store.errors_by_kind(run_id) if progress.failed else {}
        return RunView(meta, progress, tier, aggregate, withheld, errors)

    def recent(self, limit: int = 20) -> list[RunView]:
        """The newest runs first, as :meth:`status` shows them."""
        return [self._view(meta) for meta in self.runs.recent(limit)]

    def results(self, run_id: str) -> Iterator[SampleResult]:
        """Per-sample results; refused unless the split is viewable (or this is an admin)."""
        self._readable(run_id)
        return self.store.results(run_id, self.runs.sample_ids(run_id))

    def follow_results(self, run_id: str, block_ms: int = 500) -> Iterator[SampleResult]:
        """Each sample's result as soon as it is settled, once each, until the run ends."""
        self._readable(run_id)
        cursor = "0-0"
        while True:
            ended = not self.runs.get(run_id).status.active
            cursor, ids = self.store.settled_since(run_id, cursor, None if ended else block_ms)
            yield from self.store.fetch(run_id, ids)
            if ended and not ids:
                return

    def _readable(self, run_id: str) -> None:
        meta = self.runs.get(run_id)
        tier, allowed = self._access(meta)
        if allowed is not Access.FULL:
            raise TierRefusedError(
                f"tier refused: {meta.dataset_id}/{meta.split} is {tier.value}; "
                "per-sample results are not readable (use status for the aggregate)"
            )
        if self.admin and tier is not Tier.VIEWABLE:
            audit_admin(self.redis, "admin_read", self.settings.principal, meta, {"tier": tier})

    def cancel(self, run_id: str) -> Cancellation:
        """Stop a run, keep what finished, refund (once) the samples that produced nothing."""
        meta = self.runs.get(run_id)
        state, unproduced = Scripts(self.redis).cancel(RunKeys(run_id))
        if state < 0:
            raise EvalqError(f"run {run_id} has already finished; nothing to cancel")
        refunded = 0
        if meta.charged and unproduced > 0:
            refunded = self.ledger.refund(
                meta.dataset_id,
                meta.split,
                run_id,
                0,
                unproduced,
                self.settings.principal,
                "cancelled",
            )
        return Cancellation(run_id, state == 1, refunded)

    def resume(self, run_id: str) -> Resumption:
        """Re-enqueue every sample without a terminal result; charges nothing.

        Samples with an output go back to scoring, the rest to inference with a fresh attempt
        count. Duplicates of messages still queued are harmless (every write is once-only).
        If every sample is settled but the run never finished, its aggregate is computed here.
        """
        meta = self.runs.get(run_id)
        if meta.status is RunStatus.CANCELLED:
            raise EvalqError(f"run {run_id} was cancelled and refunded; submit it again instead")
        ids = self.runs.sample_ids(run_id)
        settled = self.store.settled(run_id, ids)
        missing = [i for i in ids if i not in settled]
        if not missing:
            finalize = meta.status.active  # settled, but the finalizer never finished
            if finalize:
                load_plugins(self.settings.plugins)
                self.store.finalize(run_id, create(meta.eval, meta.params))
            return Resumption(run_id, 0, 0, finalize)
        inferred = self.store.inferred(run_id, missing)
        to_score = [i for i in missing if i in inferred]
        to_infer = [i for i in missing if i not in inferred]
        self.store.reset_attempts(run_id, to_infer)
        for task, ids in ((INFER_TASK, to_infer), (SCORE_TASK, to_score)):
            size = message_size(len(ids))
            publish(self.app, task, split(run_id, meta.eval, meta.spec, ids, size))
        return Resumption(run_id, len(to_infer), len(to_score), False)

    def close(self) -> None:
        """Close the Redis connection."""
        self.redis.close()
