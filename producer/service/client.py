"""The service: every operation over Redis as one principal, with the policy applied to every
read. The gateway's routes act through it for each caller (:mod:`evalq.producer.gateway.acting`),
in ``evalq serve`` and in direct mode's in-process app alike
(:mod:`evalq.producer.clients.inprocess`); the demos and tests use it beside their own Redis.

from evalq.producer.service.client import Client
from evalq.producer.service.submit import SubmitRequest

evalq = Client()                      # settings from EVALQ_*; admin=False
run = evalq.submit(SubmitRequest(eval="topic", dataset="demo", split="validation"))
evalq.status(run.run_id).aggregate    # None until completed, or when withheld
list(evalq.results(run.run_id))       # per-sample rows: viewable splits only

The stores are private: every read goes through a method that asks
:class:`evalq.shared.access.disclosure.Disclosure` what this reader may see. The work is done by the
client's parts, one concern each: views of runs (:mod:`evalq.producer.service.viewer`), per-sample
reads (:mod:`evalq.producer.service.samples`), resuming (:mod:`evalq.producer.service.resume`),
submitting (:mod:`evalq.producer.service.submit`) and rescoring
(:mod:`evalq.producer.service.rescore`); administration is a call on a store each.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import redis
from celery import Celery

from evalq.producer.service.comparison import Comparison, check_pairable, compare
from evalq.producer.service.direct import Direct
from evalq.producer.service.language import check_split, resolve
from evalq.producer.service.policy_file import PolicyFile, apply_policy
from evalq.producer.service.rescore import RescoreRequest, rescore
from evalq.producer.service.resume import resume
from evalq.producer.service.samples import Samples
from evalq.producer.service.submit import SubmitRequest, submit
from evalq.producer.service.viewer import Viewer
from evalq.producer.service.views import Cancellation, Resumption, RunView, SamplePage, SampleQuery
from evalq.shared.access.budget import Budget
from evalq.shared.access.dataset import RegisteredDataset
from evalq.shared.access.policy import Tier, stored_tier, suggests_datasets
from evalq.shared.access.roles import Role, TokenRecord
from evalq.shared.access.task import RegisteredTask
from evalq.shared.access.tasks import TaskRegistry
from evalq.shared.connection import server_time
from evalq.shared.errors import EvalqError, InputError
from evalq.shared.evaluation import failure_rule, load_plugins
from evalq.shared.lm.task import TaskSpec
from evalq.shared.models import Progress, RunFilter, RunMeta, RunStatus, SampleResult
from evalq.shared.settings import Settings, get_settings
from evalq.shared.store.audit import recent, record
from evalq.shared.store.retention import expired, purge

if TYPE_CHECKING:
    import pyarrow as pa
    from datasets import Dataset

    from evalq.producer.service.report import Report

__all__ = ["Client"]


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
        self._direct = Direct(
            self.settings,
            admin,
            principal=principal or self.settings.principal,
            client=client,
            app=app,
            sees_sources=sees_sources,
        )
        self._viewer = Viewer(self._direct)
        self._samples = Samples(self._direct)

    @property
    def app(self) -> Celery:
        """The Celery app used to publish (made on first use): direct mode only."""
        return self._direct.app

    @property
    def principal(self) -> str:
        """Who this client acts for."""
        return self._direct.principal

    @property
    def samples(self) -> Samples:
        """This reader's per-sample reads beside the stores, those the client interface has
        and those only code beside Redis can make (rows, states, the timeline, the spec, a
        follower that never waits): the report's and the gateway's."""
        return self._samples

    def submit(self, request: SubmitRequest) -> RunMeta:
        """Gate on tier and budget, then enqueue; see
        :func:`evalq.producer.service.submit.submit`."""
        load_plugins(self.settings.plugins)
        direct = self._direct
        direct.refund_unsent()
        meta = submit(
            direct.redis,
            direct.app,
            request,
            principal=self.principal,
            admin=self.admin,
            archive=self.settings.archive_url,
            model_roots=self.settings.allowed_model_roots,
            suggest=suggests_datasets(self.admin, direct.sees_sources),
            data_cache=direct.data_cache,
            sizes=(self.settings.max_output_bytes, self.settings.max_run_bytes),
        )
        return direct.outward(meta)

    def check_params(self, points: Sequence[SubmitRequest]) -> None:
        """Refuse (:class:`evalq.shared.errors.ParamError`, nothing charged) the first point whose
        params its evaluation does not declare as given: a sweep checks every point before
        it submits one."""
        load_plugins(self.settings.plugins)
        for point in points:
            resolve(
                self._direct.redis,
                point.eval,
                point.params,
                point.model,
                point.model_args,
                admin=self.admin,
                model_roots=self.settings.allowed_model_roots,
            )

    def rescore(self, request: RescoreRequest) -> RunMeta:
        """A new run scoring ``request.run``'s stored outputs with another evaluation; see
        :func:`evalq.producer.service.rescore.rescore`."""
        load_plugins(self.settings.plugins)
        direct = self._direct
        # the source's state as this reader reads it: a refusal tells no more than status
        shown = direct.seen(direct.runs.get(request.run))[0].status
        if shown is not RunStatus.COMPLETED:
            raise InputError(f"run {request.run} is {shown}; only a completed run is rescored")
        meta = rescore(
            direct.redis,
            direct.app,
            request.run,
            request.eval,
            request.params,
            principal=self.principal,
            admin=self.admin,
            archive=self.settings.archive_url,
        )
        return direct.outward(meta)

    def status(self, run_id: str) -> RunView:
        """The run's record and counters, and its aggregate where the policy allows it."""
        self._direct.refund_unsent()
        return self._viewer.status(run_id)

    def stalled(self, meta: RunMeta, progress: Progress) -> str | None:
        """Why nothing moves a going run (:meth:`evalq.producer.service.viewer.Viewer.stalled`)."""
        return self._viewer.stalled(meta, progress)

    def recent(
        self, limit: int = 20, owner: str | None = None, only: RunFilter | None = None
    ) -> list[RunView]:
        """The newest runs first, as :meth:`status` shows them
        (:meth:`evalq.producer.service.viewer.Viewer.recent`)."""
        return self._viewer.recent(limit, owner, only)

    def run_counts(self, owner: str | None = None, only: RunFilter | None = None) -> dict[str, int]:
        """How many runs are in each status (only ``owner``'s, and those ``only`` matches, when
        given), each status as a listing shows it to this reader; no run is viewed, so none
        takes a Ladder round."""
        direct = self._direct
        now = server_time(direct.redis)
        shown = partial(direct.disclosure.listed, now=now)
        metas = direct.runs.recent(2**31, owner, only, shown)
        return dict(Counter(str(shown(meta).status) for meta in metas))

    def progress(self, run_id: str) -> tuple[RunMeta, Progress]:
        """The run's record and counters, as this reader reads them."""
        return self._viewer.progress(run_id)

    def owner(self, run_id: str) -> str:
        """Who submitted the run."""
        return self._direct.runs.get(run_id).principal

    def ended(self, run_id: str) -> RunMeta:
        """The record of a run that has ended; :class:`RunNotCompletedError` (exit code 4)
        if it ended ``failed`` or ``cancelled``."""
        return self._viewer.ended(run_id)

    def results(self, run_id: str, with_input: bool = False) -> Iterator[SampleResult]:
        """Per-sample results (:meth:`evalq.producer.service.samples.Samples.results`)."""
        return self._samples.results(run_id, with_input)

    def follow_results(self, run_id: str, with_input: bool = False) -> Iterator[SampleResult]:
        """Each sample's result as soon as it is settled, once each, until the run ends; the
        policy is asked here, before anything is returned (or a file opened for it)."""
        return self._samples.follow(run_id, with_input)

    def sample_page(self, run_id: str, query: SampleQuery | None = None) -> SamplePage:
        """One page of per-sample results, filtered and sorted as ``query`` says
        (:meth:`evalq.producer.service.samples.Samples.page`)."""
        return self._samples.page(run_id, query or SampleQuery())

    def result_lines(self, run_id: str) -> Iterator[str]:
        """Per-sample results as JSON lines
        (:meth:`evalq.producer.service.samples.Samples.result_lines`)."""
        return self._samples.result_lines(run_id)

    def result_tables(self, run_id: str) -> Iterator[pa.Table]:
        """Per-sample results as tables
        (:meth:`evalq.producer.service.samples.Samples.result_tables`)."""
        return self._samples.result_tables(run_id)

    def results_dataset(self, run_id: str) -> Dataset:
        """Per-sample results as a ``datasets.Dataset``
        (:meth:`evalq.producer.service.samples.Samples.results_dataset`)."""
        return self._samples.results_dataset(run_id)

    def compare(self, run_ids: Sequence[str], flips: int = 10) -> Comparison:
        """Each run against the first, sample by sample (:mod:`evalq.producer.service.comparison`),
        beside each run's own stats as :meth:`status` gives them; every run must be readable per
        sample by this reader (a ``non_viewable`` split's pairs are statistics of its labels:
        admins only, audited) and all must pair."""
        direct = self._direct
        metas = [direct.runs.get(run_id) for run_id in run_ids]
        for meta in metas:  # before pairing, whose refusal names the runs' data
            direct.readable(meta.run_id)
        check_pairable(metas)
        load_plugins(self.settings.plugins)
        scores = [
            direct.results.counted(meta.run_id, failure_rule(meta.eval)).scores for meta in metas
        ]
        stats = [self.status(meta.run_id).stats for meta in metas]
        found = compare([m.run_id for m in metas], scores, flips, stats)
        return found.model_copy(
            update={
                "runs": {m.run_id: m.settings_shown for m in metas},
                "tasks": {m.run_id: m.eval for m in metas},
            }
        )

    def report(self, run_id: str) -> Report:
        """What the run's report shows, as this reader may see it
        (:func:`evalq.producer.service.report.gather`; :func:`evalq.producer.reports.page.render`
        draws it)."""
        from evalq.producer.service.report import gather

        return gather(self.status(run_id), self._samples)

    def cancel(self, run_id: str) -> Cancellation:
        """Stop a run, keep what finished, refund (once) the samples that produced nothing
        (those a token budget kept from being sent included)."""
        direct = self._direct
        meta = direct.runs.get(run_id)
        state, unproduced = direct.runs.cancel(run_id)
        direct.backlog.withdraw(run_id)
        if state < 0:
            raise EvalqError(f"run {run_id} has already finished; nothing to cancel")
        refunded, unproduced = 0, min(meta.n, unproduced + direct.unsent(run_id))
        if meta.charged and unproduced > 0:
            refunded = direct.ledger.refund(
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
        """Re-enqueue every sample without a terminal result; charges nothing (see
        :mod:`evalq.producer.service.resume`)."""
        return resume(self._direct, run_id)

    def add_dataset(
        self, name: str, data: str, *, revision: str | None = None, config: str | None = None
    ) -> RegisteredDataset:
        """Register ``data`` as ``name``, each split pinned (audited)."""
        direct = self._direct
        return direct.registry.add(
            name,
            data,
            who=self.principal,
            revision=revision,
            config=config,
            data_cache=direct.data_cache,
        )[0]

    def datasets(self) -> list[RegisteredDataset]:
        """Every registered dataset."""
        return self._direct.registry.all()

    def add_task(
        self, name: str, text: str, *, dataset: str | None = None, split: str | None = None
    ) -> RegisteredTask:
        """Register the language task file ``text`` (YAML) as ``name`` (audited), its scorer
        checked against this process's plugins; with ``dataset`` and ``split``, checked first
        against that registered split's rows
        (:func:`evalq.producer.service.language.check_split`)."""
        load_plugins(self.settings.plugins)  # a task may not take a Python evaluation's name
        if (dataset is None) != (split is None):
            raise InputError("a task is checked against a split: give both --dataset and --split")
        redis_ = self._direct.redis
        data_cache = self._direct.data_cache

        def against(spec: TaskSpec) -> None:
            if dataset is not None and split is not None:
                check_split(redis_, spec, dataset, split, data_cache)

        return TaskRegistry(redis_).add(name, text, who=self.principal, check=against)[0]

    def add_lm_eval_task(
        self, name: str, task: str, *, include_path: str | None = None
    ) -> RegisteredTask:
        """Register lm-eval's task ``task`` (found by lm-eval's ``TaskManager``, in
        ``include_path`` first when given) as ``name`` (audited), its config and every file it
        is made of pinned by sha256 (:func:`evalq.shared.lm.lmeval.resolve`)."""
        from evalq.shared.lm.lmeval import resolve as resolve_lm_eval

        load_plugins(self.settings.plugins)  # a task may not take a Python evaluation's name
        folder = None if include_path is None else Path(include_path)
        registry = TaskRegistry(self._direct.redis)
        return registry.add_harness(
            name, lambda: resolve_lm_eval(task, folder), who=self.principal
        )[0]

    def tasks(self) -> list[RegisteredTask]:
        """Every registered task (YAML language tasks and lm-eval tasks)."""
        return TaskRegistry(self._direct.redis).all()

    def set_tier(self, dataset: str, split: str, tier: Tier) -> Tier | None:
        """Set a registered split's tier (audited); return the one before (None if unlisted,
        which reads ``no_access``). A dataset or split nobody registered is refused (exit 2)."""
        direct = self._direct
        direct.registry.check_split(dataset, split, suggest=True)
        return direct.tiers.set(dataset, split, tier, who=self.principal)

    def tiers(self) -> dict[str, dict[str, Tier]]:
        """Every registered split's tier, by dataset (one no tier was set for reads
        ``no_access``, as every path reads it), and any other listed tier."""
        direct = self._direct
        found = direct.tiers.listed()
        for dataset in direct.registry.all():
            listed = found.setdefault(dataset.name, {})
            for split in dataset.splits:
                listed.setdefault(split, stored_tier(None))
        return {d: dict(sorted(found[d].items())) for d in sorted(found)}

    def set_budget(
        self,
        dataset: str,
        split: str,
        *,
        runs: int | None,
        samples: int | None,
        max_samples_per_run: int | None,
        caller: str | None = None,
        tokens: int | None = None,
    ) -> Budget:
        """Replace a registered split's budget totals, or ``caller``'s own on it (None =
        unlimited), keep what was used (audited). A dataset or split nobody registered is
        refused (exit 2)."""
        self._direct.registry.check_split(dataset, split, suggest=True)
        return self._direct.ledger.set(
            dataset,
            split,
            runs=runs,
            samples=samples,
            max_samples_per_run=max_samples_per_run,
            who=self.principal,
            caller=caller,
            tokens=tokens,
        )

    def budgets(self) -> list[Budget]:
        """Every stored budget (the samples of runs a token budget kept from being sent
        given back first)."""
        self._direct.refund_unsent()
        return self._direct.ledger.all()

    def apply_policy(self, policy: PolicyFile) -> list[str]:
        """Apply a policy file's tiers, budgets, release rules and priorities (checked whole
        first); return warnings."""
        direct = self._direct
        registered = {d.name: list(d.splits) for d in direct.registry.all()}
        return apply_policy(policy, direct.redis, registered=registered, who=self.principal)

    def create_token(self, principal: str, role: Role) -> str:
        """A new API token for ``principal`` (shown once; stored as a digest; audited)."""
        return self._direct.tokens.create(principal, role, who=self.principal)

    def tokens(self) -> list[TokenRecord]:
        """Every live token's principal, role and creation (never the token)."""
        return self._direct.tokens.all()

    def revoke_tokens(self, principal: str) -> int:
        """Revoke every token of ``principal`` (audited); return how many."""
        return self._direct.tokens.revoke(principal, who=self.principal)

    def purge(self, run_ids: Sequence[str] = (), older_than: float | None = None) -> list[str]:
        """Remove ended runs wholly (:mod:`evalq.shared.store.retention`): those named, and those
        submitted more than ``older_than`` seconds ago; audited. Naming a going run, or none
        at all, is refused before anything is removed."""
        if not run_ids and older_than is None:
            raise InputError("say which runs to purge: --run RUN or --older-than AGE")
        direct = self._direct
        for run_id in run_ids:
            meta = direct.runs.get(run_id)
            if meta.status.active:
                raise InputError(f"run {run_id} is {meta.status}; cancel it before purging it")
        targets = list(dict.fromkeys(run_ids))
        if older_than is not None:
            before = server_time(direct.redis) - older_than
            targets += [r for r in expired(direct.redis, before) if r not in targets]
        purged = [r for r in targets if purge(direct.redis, r, self.settings.archive_url)]
        for run_id in purged:
            after = {"older_than": older_than}
            record(direct.redis, "purge", self.principal, run=run_id, after=after)
        return purged

    def audit(self, limit: int = 50) -> list[dict[str, str]]:
        """The newest ``limit`` audit entries, oldest first."""
        return recent(self._direct.redis, limit)

    def close(self) -> None:
        """Close the Redis connection."""
        self._direct.redis.close()
