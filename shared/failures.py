"""How a run's failed samples count in its numbers: the one rule that turns a run's per-sample
scores and failures into the metric samples its summary, error bars, release (the Ladder) and
comparison are computed from.

A failed sample (``infer()`` or ``score()`` raised, its attempts spent) is one the model did
not get right: by default (:attr:`FailurePolicy.WORST`) it scores each metric's worst value,
so a model that crashes on hard rows scores no higher than one that answers them wrongly, and a
candidate on a ``non_viewable`` split cannot choose which samples are scored by failing the
others. A metric's worst value is the end of its declared range (``metric_ranges``) on its bad
side (``lower_is_better``); for an undeclared 0/1 metric, 0 (1 for a lower-is-better one); for
any other undeclared metric, the worst value the run scored. An evaluation may instead declare
:attr:`FailurePolicy.SKIP`: failed samples are then left out, and the count is shown beside
each metric.

A sample a token budget kept from being sent (``budget/TokensExhausted``) is neither: it was
never asked, so it is left out of the numbers under either policy and counted as unsent.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from evalq.shared.stats import Stat, binary

__all__ = ["UNSENT", "Counted", "FailurePolicy", "FailureRule", "metric_samples"]

Range = tuple[float, float]
UNSENT = "budget/TokensExhausted"
"""The ``stage/kind`` of a failure that means "never sent"
(:attr:`evalq.shared.models.Stage.BUDGET`, :class:`evalq.shared.errors.TokensExhausted`)."""


class FailurePolicy(StrEnum):
    """What a failed sample counts as in a run's metrics."""

    WORST = "worst"
    """Each metric's worst value (the default)."""
    SKIP = "skip"
    """Nothing: left out, and counted beside each metric as skipped."""


@dataclass(frozen=True)
class FailureRule:
    """An evaluation's declarations that the rule needs."""

    policy: FailurePolicy = FailurePolicy.WORST
    ranges: Mapping[str, Range] = field(default_factory=dict)
    """Declared ``(low, high)`` of metrics."""
    lower_is_better: frozenset[str] = frozenset()

    def range_of(self, metric: str, values: list[float]) -> Range | None:
        """The metric's declared range; (0, 1) for an undeclared one whose scored ``values``
        are all 0 or 1; None otherwise."""
        declared = self.ranges.get(metric)
        if declared is not None:
            return declared
        return (0.0, 1.0) if values and binary(values) else None

    def worst(self, metric: str, values: list[float]) -> float:
        """The metric's worst value: its range's end on its bad side, else the worst of the
        ``values`` the run scored."""
        bounds = self.range_of(metric, values)
        lower = metric in self.lower_is_better
        if bounds is not None:
            return bounds[1] if lower else bounds[0]
        return max(values) if lower else min(values)


@dataclass(frozen=True)
class Counted:
    """A run's metric samples as the rule counts them."""

    scores: dict[int, dict[str, float]]
    """Sample id -> metrics: the scored samples, and under ``worst`` the failed ones with
    each metric's worst value."""
    scored: int
    """Samples that were scored."""
    failed: dict[str, int]
    """Failed samples by ``stage/kind`` (e.g. ``infer/RuntimeError``), most common first."""
    policy: FailurePolicy
    worst: dict[str, float]
    """The value a failed sample scored, per metric (empty under ``skip``)."""
    ranges: dict[str, Range]
    """Each metric's range where one is known (declared, or 0/1): intervals stay inside it."""
    unsent: int = 0
    """Samples a token budget kept from being sent: in no metric."""

    def noted(self, stats: Mapping[str, Stat]) -> dict[str, Stat]:
        """``stats`` (computed from :attr:`scores`) each with the failures and the policy."""
        note = {"failed": self.failed, "on_failure": self.policy.value}
        return {name: stat.model_copy(update=note) for name, stat in stats.items()}


def metric_samples(
    scores: Mapping[int, dict[str, float]], failures: Mapping[int, str], rule: FailureRule
) -> Counted:
    """The metric samples of a run whose scored samples are ``scores`` (sample id -> metrics)
    and whose failed ones are ``failures`` (sample id -> ``stage/kind``), under ``rule``; a
    failed sample that was also scored counts as scored."""
    counted = dict(scores)
    unsent = [i for i in failures if i not in counted and _unsent(failures[i])]
    failures = {i: kind for i, kind in failures.items() if not _unsent(kind)}
    failed_ids = [i for i in sorted(failures) if i not in counted]
    kinds = Counter(failures[i] for i in failed_ids)
    names = sorted(set[str]().union(*counted.values()))
    values = {name: [s[name] for s in counted.values() if name in s] for name in names}
    ranges = {name: r for name in names if (r := rule.range_of(name, values[name])) is not None}
    worst: dict[str, float] = {}
    if rule.policy is FailurePolicy.WORST and failed_ids and names:
        worst = {name: rule.worst(name, values[name]) for name in names}
        for i in failed_ids:
            counted[i] = dict(worst)
    return Counted(
        scores=counted,
        scored=len(scores),
        failed=dict(kinds.most_common()),
        policy=rule.policy,
        worst=worst,
        ranges=ranges,
        unsent=len(unsent),
    )


def _unsent(kind: str) -> bool:
    return kind == UNSENT
