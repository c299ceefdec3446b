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
from shared.celery_app import create_app
from shared.connection import connect
from shared.errors import EvalqError, TierRefusedError
from shared.evaluation import load_plugins
from shared.keys import AUDIT, RunKeys
from shared.ledger import Ledger
from shared.models import Progress, RunMeta, SampleResult
from shared.results import ResultStore
from shared.runs import RunStore
from shared.scripts import Scripts
from shared.settings import Settings, get_settings
from shared.tiers import MIN_AGGREGATE_SAMPLES, Access, Tier, TierRegistry, access

__all__ = ["Cancellation", "Client", "RunView"]


@dataclass(frozen=True)
class RunView:
    """A run as a reader may see it."""

    meta: RunMeta
    progress: Progress
    tier: Tier
    aggregate: dict[str, float] | None
    withheld: str | None
    """Why the aggregate is not shown, when it is not."""

    def as_dict(self) -> dict[str, object]:
        return {
            **self.meta.model_dump(mode="json"),
            "tier": self.tier.value,
            "progress": self.progress.model_dump(),
            "aggregate": self.aggregate,
            "withheld": self.withheld,
        }


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
        meta = self.runs.get(run_id)
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
        return RunView(meta, self.store.progress(run_id), tier, aggregate, withheld)

    def recent(self, limit: int = 20) -> list[RunView]:
        """The newest runs first, as :meth:`status` shows them."""
        return [self.status(meta.run_id) for meta in self.runs.recent(limit)]

    def results(self, run_id: str) -> Iterator[SampleResult]:
        """Per-sample results; refused unless the split is viewable (or this is an admin)."""
        meta = self.runs.get(run_id)
        tier, allowed = self._access(meta)
        if allowed is not Access.FULL:
            raise TierRefusedError(
                f"tier refused: {meta.dataset_id}/{meta.split} is {tier.value}; "
                "per-sample results are not readable (use status for the aggregate)"
            )
        if self.admin and tier is not Tier.VIEWABLE:
            self._audit_admin_read(meta, tier)
        return self.store.results(run_id, self.runs.sample_ids(run_id))

    def _audit_admin_read(self, meta: RunMeta, tier: Tier) -> None:
        self.redis.xadd(
            AUDIT,
            {
                "action": "admin_read",
                "who": self.settings.principal,
                "dataset": meta.dataset_id,
                "split": meta.split,
                "run": meta.run_id,
                "at": str(time.time()),
                "before": "null",
                "after": f'{{"tier": "{tier.value}"}}',
            },
        )

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

    def close(self) -> None:
        """Close the Redis connection."""
        self.redis.close()
