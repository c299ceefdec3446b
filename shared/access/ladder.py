"""The release mechanisms: what a ``non_viewable`` run's aggregate shows to a caller who may not
see it exactly (everyone but admins), as arithmetic with no state of its own.

``exact`` (viewable splits and admins always), ``rounded`` to a grid, or Blum & Hardt's Ladder
(ICML 2015, the default): a metric moves only when a run beats the caller's best so far by more
than the margin ``eta``. A split's mechanism is set by ``release:`` in a policy file
(:class:`Release`); each run's release (:class:`Released`) and each caller's best are kept by
:class:`evalq.shared.access.release.ReleaseStore`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, Strict, model_validator

from evalq.shared.access.policy import Access, Reader
from evalq.shared.stats import Stat

__all__ = [
    "DEFAULT_RELEASE",
    "MIN_ETA",
    "Best",
    "Decision",
    "Mechanism",
    "Release",
    "ReleaseRule",
    "Released",
    "default_eta",
    "on_grid",
    "release",
    "release_rule",
    "released_stats",
]


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

MIN_ETA = 1e-6
"""The finest grid a policy may set (finer is no protection, and far finer overflows)."""


class Release(BaseModel):
    """``release:`` of a split in a policy file: ``exact``, ``rounded``, ``ladder`` or a
    mapping ``{mechanism: ladder, eta: 0.02}``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mechanism: Mechanism
    eta: Annotated[float, Strict(), Field(ge=MIN_ETA, le=1)] | None = None
    """Grid and Ladder step; absent = :func:`default_eta` of the run's samples."""

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: object) -> object:
        if isinstance(value, dict) and "paired" in value:
            raise ValueError(
                "the paired Ladder was removed: it has no leakage bound, and a caller that keeps "
                "its best run's answers and adds one sample forced its margin to zero (200 of "
                "200 labels in 201 runs); use the ladder (with eta, if needed)"
            )
        return {"mechanism": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _consistent(self) -> Release:
        if self.mechanism is Mechanism.EXACT and self.eta is not None:
            raise ValueError("exact release has no eta")
        return self

    def rule(self) -> ReleaseRule:
        """The rule it sets."""
        return ReleaseRule(self.mechanism, self.eta)


class Released(BaseModel):
    """What one run's aggregate released, fixed at its first read."""

    rule: str
    """The mechanism and its parameters, as :meth:`ReleaseRule.describe` says them."""
    aggregate: dict[str, float]
    """The released values."""
    why: dict[str, str]
    """Why each metric shows what it shows (``first run``, ``not better than the best ...``)."""


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
