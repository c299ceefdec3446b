"""How sure a run's numbers are, and how two runs over the same samples differ.

- **A metric's uncertainty** (:func:`describe`). For an evaluation that keeps the default
  ``aggregate()`` (the mean of each per-sample metric): the analytic standard error ``s/√n``
  (``s`` the sample standard deviation) and the 95% interval: Wilson's score interval for a
  0/1 metric (:func:`wilson`), else the normal one clipped to the metric's range when it has
  one; when the evaluation declares a ``cluster_field`` (several samples per passage, per
  task), the cluster-robust standard error, since samples of one cluster are not independent
  (Miller 2024, "Adding Error Bars to Evals"), and its normal interval clipped to the range.
  For a custom ``aggregate()``: a seeded bootstrap over samples (percentile interval).
- **A paired comparison** (:func:`paired`): over the samples both runs scored, the mean
  difference of a metric (the other run minus the baseline), a seeded paired bootstrap 95%
  interval and, for 0/1 metrics, McNemar's exact p-value (a two-sided binomial test on the
  discordant pairs, :func:`scipy.stats.binomtest`). Several runs against one baseline are
  corrected with Holm's step-down (:func:`holm`).

Seeds are fixed, so the same scores always give the same numbers. numpy is imported by the
functions that compute, not with the module: the models (:class:`Stat`, :class:`Delta`) are read
by every client, a gateway read included, which computes nothing.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from statistics import fmean, stdev
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, computed_field

if TYPE_CHECKING:
    import numpy as np

__all__ = ["Delta", "Interval", "Stat", "binary", "describe", "holm", "paired", "wilson"]

Z95 = 1.959963984540054
"""The standard normal's 97.5% quantile."""
SEED = 20261123
RESAMPLES = 1000
"""Bootstrap resamples (fewer for a custom aggregate of many samples: see :func:`_rounds`)."""
BOOTSTRAP_WORK = 5_000_000
"""Samples a custom ``aggregate()`` is given over all resamples, at most."""
MIN_RESAMPLES = 50
"""Fewer resamples than this give no error bar (a run too large for the budget)."""
BOOTSTRAP_SECONDS = 10.0
"""Resampling stops after this long."""
PAIRED_BOOTSTRAP_MAX = 100_000
"""Above this many pairs, a difference's interval is the normal one (the bootstrap's, to
within its own noise, at that size) instead of 1,000 resamples of every pair."""
_CHUNK = 4_000_000

Scores = Mapping[int, Mapping[str, float]]
Range = tuple[float, float]


class Interval(BaseModel):
    """A 95% interval and how it was computed."""

    model_config = ConfigDict(frozen=True)

    method: str
    """``wilson`` (a 0/1 metric's mean), ``normal`` (``normal, clipped to [low, high]`` when
    it reached past the metric's range) or ``bootstrap percentile``."""
    low: float
    high: float


class Stat(BaseModel):
    """One metric of a run: its value, standard error, 95% interval and sample count, and how
    its failed samples were counted."""

    model_config = ConfigDict(frozen=True)

    mean: float
    stderr: float | None
    """None when it cannot be estimated (fewer than two samples or clusters)."""
    ci95: tuple[float, float] | None
    """``interval``'s ends."""
    n: int
    """Samples counted (failed ones included, unless the failure policy is ``skip``)."""
    method: str
    """``analytic``, ``clustered`` (with the clusters' count) or ``bootstrap``."""
    interval: Interval | None = None
    """The 95% interval with its method (None where ``ci95`` is)."""
    failed: dict[str, int] = {}
    """The run's failed samples by ``stage/kind`` (by ``stage`` for a reader who does not see
    error kinds)."""
    on_failure: str | None = None
    """How they count (:class:`evalq.shared.failures.FailurePolicy`): ``worst`` (in ``n`` and the
    mean, at the metric's worst value) or ``skip`` (left out); None for a run finalized before
    failures counted."""

    @computed_field  # type: ignore[prop-decorator]
    @property
    def skipped(self) -> int:
        """Failed samples left out of the metric (the ``skip`` policy)."""
        return sum(self.failed.values()) if self.on_failure == "skip" else 0


class Delta(BaseModel):
    """One metric of a run against the baseline, over the samples both scored."""

    model_config = ConfigDict(frozen=True)

    delta: float
    """Mean of (this run's score - the baseline's) over the paired samples."""
    ci95: tuple[float, float] | None
    p_value: float | None
    """McNemar's exact p-value (Holm-corrected with several runs), for 0/1 metrics only."""
    n_paired: int
    flips: tuple[int, int] = (0, 0)
    """For 0/1 metrics: samples 0 in the baseline and 1 here, and 1 there and 0 here."""
    method: str = "paired bootstrap"
    """How ``ci95`` was computed: ``paired bootstrap``, or ``normal`` above
    :data:`PAIRED_BOOTSTRAP_MAX` pairs."""


def _interval(mean: float, stderr: float | None) -> tuple[float, float] | None:
    return None if stderr is None else (mean - Z95 * stderr, mean + Z95 * stderr)


def wilson(right: int, n: int) -> tuple[float, float]:
    """Wilson's 95% score interval of the fraction ``right / n`` (always inside [0, 1])."""
    z2, p = Z95 * Z95, right / n
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = Z95 * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def binary(values: np.ndarray | list[float]) -> bool:
    """Whether every value is 0 or 1 (True for none)."""
    import numpy as np

    return bool(np.all((np.asarray(values) == 0) | (np.asarray(values) == 1)))


def _clipped(bounds: tuple[float, float] | None, span: Range | None) -> Interval | None:
    """The normal interval ``bounds``, clipped to the metric's range ``span`` (said so in its
    method when it reached past it)."""
    if bounds is None:
        return None
    low, high = bounds
    if span is None or (span[0] <= low and high <= span[1]):
        return Interval(method="normal", low=low, high=high)
    return Interval(
        method=f"normal, clipped to [{span[0]:g}, {span[1]:g}]",
        low=min(max(low, span[0]), span[1]),
        high=max(min(high, span[1]), span[0]),
    )


def _stat(
    mean: float, stderr: float | None, n: int, method: str, interval: Interval | None
) -> Stat:
    ci = None if interval is None else (interval.low, interval.high)
    return Stat(mean=mean, stderr=stderr, ci95=ci, n=n, method=method, interval=interval)


def _stdev(array: np.ndarray, mean: float) -> float:
    """The sample standard deviation about ``mean`` (the exact mean: equal values give 0),
    by numpy; ``statistics.stdev``'s exact sums where float64 squares overflow."""
    import numpy as np

    with np.errstate(over="ignore", invalid="ignore"):
        spread = math.sqrt(float(np.square(array - mean).sum()) / (len(array) - 1))
    return spread if math.isfinite(spread) else stdev(array.tolist())


def _analytic(values: list[float], span: Range | None = None) -> Stat:
    import numpy as np

    array = np.asarray(values, dtype=float)
    mean = fmean(values)
    stderr = _stdev(array, mean) / math.sqrt(len(values)) if len(values) > 1 else None
    if binary(array):
        low, high = wilson(int(array.sum()), len(values))
        interval: Interval | None = Interval(method="wilson", low=low, high=high)
    else:
        interval = _clipped(_interval(mean, stderr), span)
    return _stat(mean, stderr, len(values), "analytic", interval)


def _clustered(values: list[float], clusters: list[str], span: Range | None = None) -> Stat:
    """Liang-Zeger standard error of a mean with the small-sample factor G/(G-1)."""
    mean = fmean(values)
    sums: dict[str, float] = {}
    for value, cluster in zip(values, clusters, strict=True):
        sums[cluster] = sums.get(cluster, 0.0) + (value - mean)
    groups = len(sums)
    stderr = None
    if groups > 1:
        spread = sum(s * s for s in sums.values()) * groups / (groups - 1)
        stderr = math.sqrt(spread) / len(values)
    if span is None and binary(values):
        span = (0.0, 1.0)
    interval = _clipped(_interval(mean, stderr), span)
    return _stat(mean, stderr, len(values), f"clustered ({groups} clusters)", interval)


def _rounds(samples: int) -> int:
    """Resamples within :data:`BOOTSTRAP_WORK` (0 when fewer than :data:`MIN_RESAMPLES` fit)."""
    rounds = min(RESAMPLES, BOOTSTRAP_WORK // max(1, samples))
    return rounds if rounds >= MIN_RESAMPLES else 0


def _bootstrap(
    samples: list[Mapping[str, float]],
    aggregate: Callable[[list[dict[str, float]]], Mapping[str, float]],
) -> dict[str, Stat]:
    """A custom aggregate's value on all samples, with the standard deviation and the 2.5% and
    97.5% percentiles of its value over seeded resamples of the samples. Resampling stops at
    :data:`BOOTSTRAP_SECONDS` (the finalizer must finish well within ``EVALQ_STALL_AFTER``); a
    metric with fewer than :data:`MIN_RESAMPLES` finite values over the resamples (too large a
    run, too slow an aggregate, one that fails or is not finite on resamples) gets no error
    bar; the others keep theirs."""
    import numpy as np

    full = {str(k): float(v) for k, v in aggregate([dict(s) for s in samples]).items()}
    rng = np.random.default_rng(SEED)
    n = len(samples)
    replicates: dict[str, list[float]] = {name: [] for name in full}
    deadline = time.monotonic() + BOOTSTRAP_SECONDS
    rounds = _rounds(n) if n > 1 else 0
    for _ in range(rounds):
        if time.monotonic() > deadline:
            break
        drawn = rng.integers(0, n, size=n)
        try:
            value = aggregate([dict(samples[i]) for i in drawn])
        except Exception:  # a resample the aggregate cannot take: that round counts for none
            continue
        for name in full:
            found = value.get(name)
            if isinstance(found, int | float) and math.isfinite(found):
                replicates[name].append(float(found))
    stats = {}
    for name, mean in full.items():
        values = replicates[name]
        if len(values) < MIN_RESAMPLES:
            why = f"bootstrap: {len(values)} usable resamples of {rounds}, no error bar"
            stats[name] = Stat(mean=mean, stderr=None, ci95=None, n=n, method=why)
            continue
        low, high = np.percentile(values, [2.5, 97.5])
        interval = Interval(method="bootstrap percentile", low=float(low), high=float(high))
        stderr = float(np.std(values, ddof=1))
        stats[name] = _stat(mean, stderr, n, f"bootstrap ({len(values)} resamples)", interval)
    return stats


def describe(
    scores: Scores,
    aggregate: Callable[[list[dict[str, float]]], Mapping[str, float]] | None = None,
    clusters: Mapping[int, str] | None = None,
    ranges: Mapping[str, Range] | None = None,
) -> dict[str, Stat]:
    """Each metric of the samples ``scores`` (sample id -> metrics, as
    :func:`evalq.shared.failures.metric_samples` counts them) with its uncertainty: analytic
    (clustered by ``clusters``, sample id -> cluster, when given) for means, its interval
    inside the metric's range (from ``ranges``, when known); a seeded bootstrap through
    ``aggregate`` when the evaluation has its own."""
    ids = sorted(scores)
    if aggregate is not None:
        return _bootstrap([scores[i] for i in ids], aggregate)
    names = sorted(set[str]().union(*scores.values()))
    stats = {}
    for name in names:
        scored = [i for i in ids if name in scores[i]]
        values = [float(scores[i][name]) for i in scored]
        span = (ranges or {}).get(name)
        if clusters is not None:
            stats[name] = _clustered(values, [clusters.get(i, f"#{i}") for i in scored], span)
        else:
            stats[name] = _analytic(values, span)
    return stats


def paired(baseline: Mapping[int, float], other: Mapping[int, float]) -> Delta | None:
    """``other`` against ``baseline`` (sample id -> one metric's score) over the samples both
    scored; None when they share none."""
    import numpy as np

    common = sorted(baseline.keys() & other.keys())
    if not common:
        return None
    a = np.array([baseline[i] for i in common], dtype=float)
    b = np.array([other[i] for i in common], dtype=float)
    differences = b - a
    n = len(common)
    delta = float(differences.mean())
    ci, method = None, "paired bootstrap"
    if n > PAIRED_BOOTSTRAP_MAX:
        stderr = float(differences.std(ddof=1)) / math.sqrt(n)
        ci, method = _interval(delta, stderr), "normal"
    elif n > 1:
        rng = np.random.default_rng(SEED)
        means = np.empty(RESAMPLES)
        step = max(1, _CHUNK // n)
        for start in range(0, RESAMPLES, step):
            rounds = min(step, RESAMPLES - start)
            drawn = rng.integers(0, n, size=(rounds, n))
            means[start : start + rounds] = differences[drawn].mean(axis=1)
        low, high = np.percentile(means, [2.5, 97.5])
        ci = (float(low), float(high))
    p_value, flips = None, (0, 0)
    if binary(a) and binary(b):
        if ci is not None:  # a difference of 0/1 values lies in [-1, 1]
            ci = (max(-1.0, ci[0]), min(1.0, ci[1]))
        up = int(np.sum((a == 0) & (b == 1)))
        down = int(np.sum((a == 1) & (b == 0)))
        flips = (up, down)
        p_value = 1.0 if up + down == 0 else _mcnemar(up, up + down)
    return Delta(delta=delta, ci95=ci, p_value=p_value, n_paired=n, flips=flips, method=method)


def _mcnemar(up: int, discordant: int) -> float:
    from scipy.stats import binomtest  # scipy is slow to import: only when comparing

    return float(binomtest(up, discordant, 0.5).pvalue)


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjustment of ``p_values`` (None stays None): the k-th smallest of m
    is multiplied by m - k + 1, made monotone, and capped at 1."""
    present = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    adjusted: list[float | None] = [None] * len(p_values)
    running = 0.0
    m = len(present)
    for rank, (p, i) in enumerate(present):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[i] = running
    return adjusted
