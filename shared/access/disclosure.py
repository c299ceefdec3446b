"""Disclosure: what one reader may see of one run, answered in one place.

Reading a run applies three sets of rules: the tier rules (:mod:`evalq.shared.access.policy`: what
access the reader has, and whether it sees the run's timing), the release mechanisms
(:mod:`evalq.shared.access.ladder`: what a ``non_viewable`` aggregate shows) and the Ladder's state
(:mod:`evalq.shared.access.release`: the round a run's first read takes). ``status`` (and every view
of runs built like it) calls :meth:`Disclosure.status`, which applies all of them and records the
release; the other reads ask :meth:`Disclosure.reader` what this reader may read.
"""

from __future__ import annotations

from dataclasses import dataclass

from evalq.shared.access.ladder import Mechanism, Released, release_rule, released_stats
from evalq.shared.access.policy import Reader, coarse_timing, read_access, run_tier
from evalq.shared.access.release import ReleaseStore
from evalq.shared.access.tiers import TierRegistry
from evalq.shared.models import Progress, RunMeta, RunProvenance, RunStatus
from evalq.shared.queue.standing import Standing
from evalq.shared.stats import Stat
from evalq.shared.store.provenance import ProvenanceStore
from evalq.shared.store.reader import ResultReader

__all__ = ["Disclosed", "Disclosure", "Stall"]


@dataclass(frozen=True)
class Disclosed:
    """A run as one reader may see it at one moment."""

    meta: RunMeta
    """Its record: coarse for a reader who does not see its timing, and without the spec
    fingerprint for one who does not see data sources."""
    progress: Progress
    """Its counters (none while it goes, for a reader who does not see its timing)."""
    reader: Reader
    """What the reader may read of it."""
    aggregate: dict[str, float] | None
    """The aggregate, exact or as the split's release rule releases it; None until the run
    completed, or when withheld."""
    withheld: str | None
    """Why the aggregate is not shown, when it is not."""
    release: Released | None
    """How the aggregate was released when not exactly."""
    stats: dict[str, Stat] | None
    """Each metric's uncertainty, as the release releases it."""
    errors: dict[str, int]
    """Terminal errors by ``stage/kind``, or by ``stage`` for a reader without per-sample
    access."""
    provenance: RunProvenance | None
    """Who stored outputs with what (moves by batch: once the run ended, for a reader who
    does not see its timing)."""
    stalled: str | None
    """Why nothing moves the run (without the exact idle time for a reader who does not see
    its timing)."""
    waiting: Standing | None
    """Where it stands in the dispatcher (moves by batch: only for a reader who sees its
    timing)."""


@dataclass(frozen=True)
class Stall:
    """What the queue says of why nothing moves a going run, before a reader's rules apply."""

    unserved: str | None = None
    """Why no live worker serves the run at all (its evaluation, or its model's provider): a
    fact of the fleet, the same whatever the run's samples did."""
    queue: str | None = None
    """Why no live worker consumes the queue its samples wait in now (which queue follows
    how many of them were inferred and scored)."""
    idle: float | None = None
    """Seconds since the run's last write, once that passed ``EVALQ_STALL_AFTER`` (when its
    last sample settled)."""

    def why(self) -> str | None:
        """The whole reason, as a reader who sees the run's timing reads it."""
        if self.unserved or self.queue:
            return self.unserved or self.queue
        return None if self.idle is None else f"no progress for {self.idle:.0f}s"


def _by_stage(errors: dict[str, int]) -> dict[str, int]:
    """``stage/kind`` counts summed by stage."""
    stages: dict[str, int] = {}
    for key, count in errors.items():
        stage = key.split("/", 1)[0]
        stages[stage] = stages.get(stage, 0) + count
    return stages


class Disclosure:
    """The rules of what one reader (admin or not, seeing data sources or not) may see of
    runs, over the stores they read."""

    def __init__(
        self,
        *,
        tiers: TierRegistry,
        releases: ReleaseStore,
        results: ResultReader,
        provenance: ProvenanceStore,
        admin: bool,
        sees_sources: bool,
    ) -> None:
        """``sees_sources``: whether the reader may see data sources (a run's spec fingerprint
        hashes its data file's digest, so a gateway user sees it blank)."""
        self._tiers = tiers
        self._releases = releases
        self._results = results
        self._provenance = provenance
        self._admin = admin
        self._sees_sources = sees_sources

    def outward(self, meta: RunMeta) -> RunMeta:
        """``meta`` as this reader may see it: without the spec fingerprint unless it sees data
        sources (a hash over the data file's digest and path: with the path, an oracle for
        guessed labels of a small held-out file)."""
        return meta if self._sees_sources else meta.model_copy(update={"spec": ""})

    def sees_fleet(self) -> bool:
        """Whether this reader sees the fleet's own traffic (an endpoint's requests, tokens and
        failures over the last minute, from every principal's runs together): an admin's or an
        operator's only, as data sources are. A user's view of its run showed other users'
        work, and its own ``non_viewable`` runs' progress through a viewable run beside them
        (the viewer's attack review)."""
        return self._sees_sources

    def reader(self, meta: RunMeta, aggregated: int | None = None) -> Reader:
        """What this reader may see of the run; the floor applies to the samples an aggregate
        is computed from (``aggregated``, the scored ones), else to those submitted."""
        tier = run_tier(self._tiers.resolve(meta.dataset_id, meta.split), meta.registered)
        samples = meta.n if aggregated is None else aggregated
        return read_access(f"{meta.dataset_id}/{meta.split}", tier, self._admin, samples)

    def as_read(
        self, meta: RunMeta, progress: Progress, now: float
    ) -> tuple[RunMeta, Progress, Reader]:
        """A run's record and counters as this reader reads them at ``now`` (coarse, as
        :func:`coarse_timing` makes them, for one who does not see the run's timing), and what
        it may read (an ended run's floor counts its scored samples)."""
        reader = self.reader(meta, None if meta.status.active else progress.scored)
        if not reader.sees_timing:
            # the floor too counts as the run reads: its scored samples only once its end
            # shows (``withheld`` changed at the true end, to the millisecond)
            meta, progress = coarse_timing(meta, progress, now)
            reader = self.reader(meta, None if meta.status.active else progress.scored)
        return meta, progress, reader

    def listed(self, meta: RunMeta, now: float) -> RunMeta:
        """A run's record as a listing of runs matches it for this reader at ``now``: coarse,
        as :func:`coarse_timing` makes it, for one who does not see the run's timing (a filter
        on its status must not tell more than its status shows)."""
        if self.reader(meta).sees_timing:
            return meta
        return coarse_timing(meta, Progress(), now)[0]

    @staticmethod
    def stalled(reader: Reader, meta: RunMeta, stall: Stall) -> str | None:
        """Why nothing moves the run (``meta`` as ``reader`` reads it), as ``reader`` may be
        told. A reader who does not see the run's timing is told only what no sample of the
        run moves: that no live worker serves it at all. The moment the run went quiet is its
        last sample's settling (the attack review timed the onset of ``no progress`` with a
        scorer slower on a wrong answer: 19 of 20 labels), and which queue it waits in follows
        how many samples were inferred and scored; both are per-sample data."""
        if not meta.status.active:
            return None
        return stall.why() if reader.sees_timing else stall.unserved

    def status(
        self,
        meta: RunMeta,
        progress: Progress,
        now: float,
        *,
        stall: Stall,
        waiting: Standing | None,
    ) -> Disclosed:
        """Everything this reader may see of the run at ``now``, given its record, counters,
        why it is stalled and where it waits; a first read of a released aggregate takes the
        run's Ladder round, fixed and recorded here (:meth:`ReleaseStore.settle`)."""
        meta, progress, reader = self.as_read(meta, progress, now)
        stalled = self.stalled(reader, meta, stall)
        provenance = None
        if reader.sees_timing or not meta.status.active:
            provenance = self._provenance.of_run(meta.run_id, self.outward(meta).spec)
        else:
            waiting = None
        withheld = reader.withheld
        # only a completed run has an aggregate, and only then is the floor's count final (a
        # run read as going may complete before its aggregate is read)
        completed = meta.status is RunStatus.COMPLETED
        aggregate = self._results.aggregate(meta.run_id) if completed and not withheld else None
        released, stats = None, None
        if aggregate is not None:
            rule = release_rule(reader, self._releases.rule(meta.dataset_id, meta.split))
            stats = self._results.stats(meta.run_id)
            if rule.mechanism is not Mechanism.EXACT:
                released = self._releases.settle(meta, rule, aggregate, progress.scored)
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
        return Disclosed(
            meta=self.outward(meta),
            progress=progress,
            reader=reader,
            aggregate=aggregate,
            withheld=withheld,
            release=released,
            stats=stats,
            errors=errors,
            provenance=provenance,
            stalled=stalled,
            waiting=waiting,
        )
