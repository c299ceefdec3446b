"""The policy: every rule about split tiers, and nothing else, lives in this module.

Who may evaluate a split, who may read what of a run, how a stored or missing tier reads, how
a policy file's budgets reconcile with tiers, and which priority a caller's run may have.
Stores (``TierRegistry``, ``Ledger``) only persist; submit, the Python client, ``status``,
``report`` and every other path call the functions here, which fail closed: anything
unlisted, unreadable or unknown is ``no_access``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from shared.errors import ForbiddenError, PolicyError, TierRefusedError
from shared.models import Priority, Progress, RunMeta, RunStatus
from shared.stats import Stat

__all__ = [
    "MIN_AGGREGATE_SAMPLES",
    "TIMING_GRAIN",
    "Access",
    "Best",
    "Caller",
    "Decision",
    "Mechanism",
    "Reader",
    "ReleaseRule",
    "Role",
    "Tier",
    "admit_admin_flag",
    "admit_owner",
    "admit_priority",
    "admit_run",
    "admit_sample_choice",
    "admit_source",
    "admit_split",
    "budgeted_tier",
    "coarse_timing",
    "default_eta",
    "on_grid",
    "read_access",
    "release",
    "release_rule",
    "released_stats",
    "require_admin",
    "run_tier",
    "sees_budget",
    "sees_sources",
    "server_draws",
    "stored_tier",
]

MIN_AGGREGATE_SAMPLES = 5
"""k-anonymity floor: a non-admin never evaluates, nor sees an aggregate over, fewer samples of
a ``non_viewable`` split (single-sample evals would reveal labels)."""


class Tier(StrEnum):
    """Visibility of a (dataset, split)."""

    VIEWABLE = "viewable"
    NON_VIEWABLE = "non_viewable"
    NO_ACCESS = "no_access"


class Access(StrEnum):
    """What a reader may see of a run."""

    FULL = "full"
    AGGREGATE = "aggregate"
    NONE = "none"


def stored_tier(raw: object) -> Tier:
    """How a split's stored tier reads: missing (unlisted) or unrecognised is ``no_access``."""
    if raw is None:
        return Tier.NO_ACCESS
    try:
        return Tier(str(raw))
    except ValueError:
        return Tier.NO_ACCESS


def run_tier(listed: Tier, registered: bool) -> Tier:
    """The tier a run's split reads as: its registered dataset's (``listed``), and
    ``no_access`` for a source that is not registered, whatever a tier under its name says."""
    return listed if registered else Tier.NO_ACCESS


def admit_source(where: str, registered: bool, admin: bool) -> None:
    """Before anything is read: a source that is not a registered dataset (a path, a Hub id,
    an unknown name) is ``no_access``, so only an admin evaluates it."""
    if not admin and not registered:
        raise TierRefusedError(
            f"tier refused: {where} is not a registered dataset (unregistered sources are "
            "no_access; an admin registers them with evalq datasets add)"
        )


def suggests_datasets(admin: bool, sees_sources: bool) -> bool:
    """Whether an unknown dataset name's error may suggest a registered name that is close
    (``did you mean 'reviews'?``): for an admin (``--admin``, an admin token) or an operator
    holding Redis, who may list every dataset anyway; a user's typo teaches it of no dataset."""
    return admin or sees_sources


def admit_split(where: str, tier: Tier, admin: bool) -> None:
    """Before anything is read or charged: refuse a ``no_access`` split to a non-admin."""
    if not admin and tier is Tier.NO_ACCESS:
        raise TierRefusedError(f"tier refused: {where} is no_access")


def server_draws(tier: Tier, admin: bool) -> bool:
    """Whether the server, not the caller, picks a run's samples: on a ``non_viewable`` split
    a non-admin run is the whole split or a subset drawn from a secret random source, whose ids
    the caller never sees (ids chosen by the caller let runs be differenced sample by sample,
    Denning, Denning & Schwartz 1979)."""
    return not admin and tier is Tier.NON_VIEWABLE


def admit_sample_choice(where: str, tier: Tier, admin: bool, ids_given: bool) -> None:
    """Before anything is read: ``--ids`` on a split where the server draws is refused."""
    if ids_given and server_draws(tier, admin):
        raise TierRefusedError(
            f"tier refused: {where} is non_viewable: its samples are drawn by the server "
            "(give --limit N for a random subset, or nothing for the whole split), not --ids"
        )


def admit_priority(
    requested: Priority | None,
    *,
    principal_default: Priority | None,
    split_default: Priority | None,
    admin: bool,
) -> Priority:
    """A run's priority: the one asked for, else the principal's default, else the split's,
    else ``normal``. A non-admin may ask for less than that default but not for more: the
    priority weights a principal's share against the others', so only the policy grants
    ``high``."""
    default = principal_default or split_default or Priority.NORMAL
    if requested is None:
        return default
    if not admin and requested.rank > default.rank:
        raise ForbiddenError(
            f"forbidden: priority '{requested}' is above this caller's '{default}' (an admin "
            "grants more with a priority in the policy file)"
        )
    return requested


def admit_run(where: str, tier: Tier, admin: bool, samples: int) -> None:
    """Once the sample ids are resolved, before the ledger: the split's tier and the
    k-anonymity floor must allow a run of ``samples`` samples."""
    admit_split(where, tier, admin)
    if not admin and tier is Tier.NON_VIEWABLE and samples < MIN_AGGREGATE_SAMPLES:
        raise TierRefusedError(
            f"tier refused: {where} is non_viewable; a run needs at least "
            f"{MIN_AGGREGATE_SAMPLES} samples, this one has {samples}"
        )


@dataclass(frozen=True)
class Reader:
    """What one reader may see of one run, and why not when it may not."""

    where: str
    """``dataset/split`` of the run."""
    tier: Tier
    """The split's tier as the policy resolves it."""
    access: Access
    """What this reader gets."""
    admin: bool = False
    """The reader is an admin (or an operator acting as one)."""

    @property
    def bypasses(self) -> bool:
        """An admin reading a split that is not ``viewable``: allowed, and audited."""
        return self.admin and self.tier is not Tier.VIEWABLE

    @property
    def sees_error_kinds(self) -> bool:
        """Error kinds (exception class names, chosen by whatever code raised them: a
        candidate's code too) are per-sample detail: counts by stage for everyone else."""
        return self.access is Access.FULL

    @property
    def withheld(self) -> str | None:
        """Why the aggregate is not shown, or None when it is."""
        if self.access is not Access.NONE:
            return None
        if self.tier is Tier.NON_VIEWABLE:
            return f"fewer than {MIN_AGGREGATE_SAMPLES} samples of a non_viewable split"
        return f"{self.where} is {self.tier.value}"

    @property
    def sees_timing(self) -> bool:
        """When a run's samples settled (its timeline, throughput, ETA, live counts, exact
        times) is per-sample data too: a scorer slower on a wrong answer writes each label
        into it (the attack review read 178 of 200 off the report's throughput chart). Only a
        reader with per-sample access sees it; everyone else sees the run as a whole, on a
        grain of :data:`TIMING_GRAIN` (:func:`coarse_timing`)."""
        return self.access is Access.FULL

    def require_samples(self) -> None:
        """Per-sample results (outputs, scores, score distributions) and samples' rows (their
        inputs and targets, as ``--with-input`` and the report's lowest-scoring samples show
        them) need full access: raise :class:`TierRefusedError` otherwise."""
        if self.access is not Access.FULL:
            raise TierRefusedError(
                f"tier refused: {self.where} is {self.tier.value}; "
                "per-sample results are not readable (use status for the aggregate)"
            )


def read_access(where: str, tier: Tier, admin: bool, samples: int) -> Reader:
    """What a reader (admin or not) gets of a run of ``samples`` samples on a split of
    ``tier``: everything on ``viewable`` or as admin, the aggregate of a ``non_viewable`` run
    at or above the floor, nothing otherwise."""
    if admin or tier is Tier.VIEWABLE:
        allowed = Access.FULL
    elif tier is Tier.NON_VIEWABLE and samples >= MIN_AGGREGATE_SAMPLES:
        allowed = Access.AGGREGATE
    else:
        allowed = Access.NONE
    return Reader(where, tier, allowed, admin)


TIMING_GRAIN = 1.0
"""Seconds: the grain of a run's times for a reader who does not see its timing."""


def coarse_timing(meta: RunMeta, progress: Progress, now: float) -> tuple[RunMeta, Progress]:
    """A run's record and counters as a reader who does not see its timing
    (:attr:`Reader.sees_timing`) reads them at ``now`` (Redis's clock): its creation rounded
    down to :data:`TIMING_GRAIN`; its end shown only from the next multiple of the grain after
    it (until then the run reads as running, so polling ``status`` learns its end to the
    grain, not to the sample); no counts while it goes (each settling write would show), and
    ``running`` from submission on (the moment of its first write would show too)."""
    created = math.floor(meta.created / TIMING_GRAIN) * TIMING_GRAIN
    if meta.finished is None:
        if meta.status.active:
            going = {"created": created, "status": RunStatus.RUNNING}
            return meta.model_copy(update=going), Progress()
        return meta.model_copy(update={"created": created}), progress
    end = math.ceil(meta.finished / TIMING_GRAIN) * TIMING_GRAIN
    if now < end:
        going = {"created": created, "finished": None, "reason": None, "status": RunStatus.RUNNING}
        return meta.model_copy(update=going), Progress()
    return meta.model_copy(update={"created": created, "finished": end}), progress


def budgeted_tier(where: str, listed: Tier | None) -> tuple[Tier | None, str | None]:
    """Reconcile a budget with the split's tier (``None`` = unlisted) when a policy file gives
    the split a budget: return the tier to set (None = leave it) and a warning, if any.

    Unlisted becomes ``non_viewable``; ``no_access`` cannot be budgeted; ``viewable`` is
    allowed with a warning (a budget meters compute, not information).
    """
    if listed is None:
        return Tier.NON_VIEWABLE, f"{where}: budgeted but unlisted, made non_viewable"
    if listed is Tier.NO_ACCESS:
        raise PolicyError(f"{where}: a no_access split cannot have a budget")
    if listed is Tier.VIEWABLE:
        return None, f"{where}: budgeted but viewable (labels readable)"
    return None, None


class Role(StrEnum):
    """What a token's holder may do through the gateway."""

    ADMIN = "admin"
    """Datasets, tiers, budgets, policy, tokens, audit; ``--admin`` submits and reads; any run."""
    USER = "user"
    """Submit and read within the tiers; see, cancel and resume its own runs only."""


@dataclass(frozen=True)
class Caller:
    """Who a gateway request acts for: the principal and role of its token."""

    principal: str
    role: Role


def require_admin(caller: Caller, what: str) -> None:
    """Admin operations (datasets, tiers, budgets, policy, tokens, audit) need the admin
    role: :class:`ForbiddenError` otherwise."""
    if caller.role is not Role.ADMIN:
        raise ForbiddenError(
            f"forbidden: {what} needs the admin role ({caller.principal} is a user)"
        )


def admit_admin_flag(caller: Caller, admin: bool) -> bool:
    """``--admin`` (bypass tier and budget, read every tier) is for admins only."""
    if admin:
        require_admin(caller, "--admin")
    return admin


def sees_sources(caller: Caller) -> bool:
    """Registered datasets' sources (paths, Hub ids, file digests) are an admin's to read; a
    user sees names, splits and tiers."""
    return caller.role is Role.ADMIN


def sees_budget(caller: Caller, metered: str | None) -> bool:
    """Whether ``caller`` may see a budget metering ``metered`` (None: a whole split's, which
    every caller on the split draws from, so its ``used`` counts everyone's runs together): an
    admin sees every budget, a user the splits' and its own; another principal's budget (its
    name, totals and use) is not a user's to read."""
    return caller.role is Role.ADMIN or metered is None or metered == caller.principal


def admit_owner(caller: Caller, run_id: str, owner: str) -> None:
    """A user sees, cancels and resumes only its own runs (each principal is metered on its
    own, so another's aggregates are not its to read); an admin, every run."""
    if caller.role is not Role.ADMIN and owner != caller.principal:
        raise ForbiddenError(f"forbidden: run {run_id} belongs to another principal")


class Mechanism(StrEnum):
    """How a ``non_viewable`` run's aggregate is released to a caller who may not see it
    exactly (everyone but admins)."""

    EXACT = "exact"
    """As computed (what viewable splits and admins always get)."""
    ROUNDED = "rounded"
    """Each metric rounded to a grid of ``eta``; no memory between runs."""
    LADDER = "ladder"
    """Blum & Hardt's Ladder (ICML 2015): a metric changes only when a run beats the caller's
    best so far by more than ``eta`` (then rounded to ``eta``); else the best so far."""


@dataclass(frozen=True)
class ReleaseRule:
    """A split's release mechanism; ``eta`` None = :func:`default_eta` of the run's samples."""

    mechanism: Mechanism = Mechanism.LADDER
    eta: float | None = None

    def step(self, samples: int) -> float:
        """The grid (and the Ladder's margin) for a run aggregated over ``samples``."""
        return self.eta if self.eta is not None else default_eta(samples)

    def describe(self, samples: int) -> str:
        """How it reads in ``status`` and the audit stream."""
        if self.mechanism is Mechanism.EXACT:
            return "exact"
        return f"{self.mechanism.value}, eta {self.step(samples):g}"


DEFAULT_RELEASE = ReleaseRule()
"""A ``non_viewable`` split with no ``release:`` of its own (or an unreadable one): the
Ladder, with :func:`default_eta`."""


def release_rule(reader: Reader, configured: ReleaseRule | None) -> ReleaseRule:
    """How ``reader`` gets a run's aggregate: exactly with full access (an admin, a viewable
    split), else the split's configured mechanism, the Ladder when it has none."""
    if reader.access is Access.FULL:
        return ReleaseRule(Mechanism.EXACT)
    return configured or DEFAULT_RELEASE


def released_stats(
    stats: Mapping[str, Stat], rule: ReleaseRule, released: Mapping[str, float], samples: int
) -> dict[str, Stat]:
    """A run's error bars as ``rule`` releases them: as computed under an exact release; under
    any other, only each released value and the run's scored count ``samples``. An exact
    standard error would undo the rounding (with the count it pins the sum of squares, hence
    the exact mean of a 0/1 metric), and so would a metric's own count (a metric that
    ``score()`` gives only on rows of one label counts that label); the grid of the release is
    itself about twice the largest standard error. Failed samples stay counted as the run
    counted them (in ``n`` unless skipped)."""
    if rule.mechanism is Mechanism.EXACT:
        return dict(stats)
    method = f"released ({rule.describe(samples)}): no exact error bar"
    return {
        name: Stat(
            mean=released[name],
            stderr=None,
            ci95=None,
            n=samples + _counted_failures(stat),
            method=method,
            failed=stat.failed,
            on_failure=stat.on_failure,
        )
        for name, stat in stats.items()
        if name in released
    }


def _counted_failures(stat: Stat) -> int:
    """Failed samples counted in the stat's ``n`` besides the scored ones."""
    return 0 if stat.on_failure is None else sum(stat.failed.values()) - stat.skipped


def default_eta(samples: int) -> float:
    """The default grid for an aggregate over ``samples`` values: the smallest of 1, 2 or 5
    times a power of ten that is at least ``1/sqrt(samples)``, i.e. twice the largest standard
    error of a mean of that many values in [0, 1]. A difference below it is noise on that many
    samples: an honest loop loses nothing real by not seeing it (200 samples: 0.1; 1,000:
    0.05; 10,000: 0.01)."""
    target = 1 / math.sqrt(max(1, samples))
    power = 10.0 ** math.floor(math.log10(target))
    mantissa = next(m for m in (1, 2, 5, 10) if m * power >= target * (1 - 1e-12))
    return round(mantissa * power, 12)


def on_grid(value: float, eta: float) -> float:
    """``value`` rounded to the nearest multiple of ``eta`` (Blum & Hardt's ``[x]_eta``)."""
    return round(math.floor(value / eta + 0.5) * eta, 12)


_TIE = 1e-9
"""A gain within float error of the margin is a tie, and a tie does not move the Ladder."""


@dataclass(frozen=True)
class Best:
    """A caller's best so far on one metric: the value released for it, and its run."""

    value: float
    run: str


@dataclass(frozen=True)
class Decision:
    """What one metric of one run releases, and why."""

    released: float
    why: str
    """Shown to the caller: says nothing the released values do not."""
    best: Best | None = None
    """The caller's new best (the Ladder moved), None when it stays."""
    margin: float | None = None
    """The gain the Ladder asked for (audited)."""


def _ladder(value: float, best: Best | None, grid: float, *, higher: bool, run: str) -> Decision:
    if best is None:
        released = on_grid(value, grid)
        return Decision(released, "first run", Best(released, run), grid)
    gain = (value - best.value) if higher else (best.value - value)
    if gain <= grid * (1 + _TIE) + _TIE:
        return Decision(best.value, "not better than the best so far", None, grid)
    released = on_grid(value, grid)
    return Decision(released, "better than the best so far", Best(released, run), grid)


def release(
    rule: ReleaseRule,
    aggregate: Mapping[str, float],
    samples: int,
    run: str,
    *,
    best: Mapping[str, Best],
    lower_is_better: frozenset[str] = frozenset(),
) -> dict[str, Decision]:
    """Each metric of a run aggregated over ``samples`` as ``rule`` releases it, given the
    caller's ``best`` so far."""
    decisions: dict[str, Decision] = {}
    for metric, value in aggregate.items():
        if rule.mechanism is Mechanism.EXACT:
            decisions[metric] = Decision(value, "exact")
        elif rule.mechanism is Mechanism.ROUNDED:
            eta = rule.step(samples)
            decisions[metric] = Decision(on_grid(value, eta), f"rounded to {eta:g}")
        else:
            higher = metric not in lower_is_better
            decisions[metric] = _ladder(
                value, best.get(metric), rule.step(samples), higher=higher, run=run
            )
    return decisions
