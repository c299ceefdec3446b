"""A paired comparison of runs over the same samples: ``evalq compare``.

Runs pair by sample id, so they must share a dataset, a split and a spec (the fingerprint that
fixes which row an id is); a sample pairs when every run counted it (scored, or failed and
counted at the metric's worst value: :func:`evalq.shared.failures.metric_samples`). Each run after
the first is compared with the first (the baseline), per metric (:func:`evalq.shared.stats.paired`);
with more than two runs, the McNemar p-values of one metric are Holm-corrected together.
Beside the differences, each run's own value of each metric (mean, interval, count) as its
status gives it, the baseline's included.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel

from evalq.shared.errors import ComparisonError
from evalq.shared.models import RunMeta, RunStatus
from evalq.shared.stats import Delta, Stat, holm, paired

__all__ = ["Comparison", "Flips", "check_pairable", "compare", "shown"]


class Flips(BaseModel):
    """Samples whose 0/1 metric changed from the baseline, at most ``limit`` of each."""

    fixed: list[int]
    """0 in the baseline, 1 in this run."""
    broken: list[int]
    """1 in the baseline, 0 in this run."""


class Comparison(BaseModel):
    """``compare --json``."""

    baseline: str
    metrics: dict[str, dict[str, Delta]]
    """Metric -> run -> its difference from the baseline."""
    flips: dict[str, dict[str, Flips]] = {}
    """Metric -> run -> samples that flipped (0/1 metrics)."""
    stats: dict[str, dict[str, Stat]] = {}
    """Metric -> run -> the run's own value of it (mean, standard error, 95% interval, count,
    over all its samples, as ``status`` gives them), the baseline's first."""
    runs: dict[str, str] = {}
    """Run -> what it ran with: its model (a language task's) and parameters, ``k=v`` each."""
    tasks: dict[str, str] = {}
    """Run -> its evaluation (a registered task's name), so that runs of two tasks on one
    model are told apart."""


def shown(stat: Stat | None) -> tuple[str, str]:
    """A run's own value of a metric as the comparison tables show it: the mean, and its 95%
    interval with the count (blank where there is none)."""
    if stat is None:
        return "", ""
    interval = "" if stat.ci95 is None else f"{stat.ci95[0]:.4f} to {stat.ci95[1]:.4f}, "
    return f"{stat.mean:.4f}", f"{interval}n {stat.n}"


def check_pairable(metas: Sequence[RunMeta]) -> None:
    """Refuse runs that do not pair sample by sample (exit 2)."""
    if len(metas) < 2 or len({m.run_id for m in metas}) < len(metas):
        raise ComparisonError("compare needs two or more different runs")
    for meta in metas:
        if meta.status is not RunStatus.COMPLETED:
            raise ComparisonError(
                f"run {meta.run_id} is {meta.status}; compare completed runs (a run still "
                "going, failed or cancelled would be compared on part of its samples)"
            )
    first = metas[0]
    for meta in metas[1:]:
        if (meta.dataset_id, meta.split, meta.spec) != (first.dataset_id, first.split, first.spec):
            raise ComparisonError(
                f"runs {first.run_id} and {meta.run_id} do not pair: "
                f"{first.dataset_id}/{first.split} against {meta.dataset_id}/{meta.split}"
                f"{', two specs' if meta.spec != first.spec else ''}; samples pair only "
                "within one dataset, split and spec"
            )


def compare(
    run_ids: Sequence[str],
    scores: Sequence[Mapping[int, Mapping[str, float]]],
    flips: int = 10,
    stats: Sequence[Mapping[str, Stat] | None] = (),
) -> Comparison:
    """Each run after the first against the first, per metric, over the samples both counted
    (``scores``: each run's metric samples); up to ``flips`` flipped samples of each kind per
    run and 0/1 metric; beside them each run's own ``stats`` (in the order of ``run_ids``) of
    the metrics compared."""
    baseline, *others = range(len(run_ids))
    names = sorted({name for sample in scores[baseline].values() for name in sample})
    metrics: dict[str, dict[str, Delta]] = {}
    flipped: dict[str, dict[str, Flips]] = {}
    for name in names:
        base = _metric(scores[baseline], name)
        deltas: dict[str, Delta] = {}
        for k in others:
            other = _metric(scores[k], name)
            delta = paired(base, other)
            if delta is None:
                continue
            deltas[run_ids[k]] = delta
            if delta.p_value is not None and flips > 0:
                flipped.setdefault(name, {})[run_ids[k]] = _flips(base, other, flips)
        if len(deltas) > 1:
            adjusted = holm([d.p_value for d in deltas.values()])
            deltas = {
                run: d.model_copy(update={"p_value": p})
                for (run, d), p in zip(deltas.items(), adjusted, strict=True)
            }
        metrics[name] = deltas
    if not any(metrics.values()):
        raise ComparisonError(f"runs {', '.join(run_ids)} share no scored sample and metric")
    own: dict[str, dict[str, Stat]] = {}
    for run_id, found in zip(run_ids, stats, strict=False):
        for name in names:
            if found is not None and name in found:
                own.setdefault(name, {})[run_id] = found[name]
    return Comparison(
        baseline=run_ids[baseline],
        metrics=metrics,
        flips=flipped,
        stats=own,
    )


def _metric(scores: Mapping[int, Mapping[str, float]], name: str) -> dict[int, float]:
    return {i: float(s[name]) for i, s in scores.items() if name in s}


def _flips(base: Mapping[int, float], other: Mapping[int, float], limit: int) -> Flips:
    common = sorted(base.keys() & other.keys())
    fixed = [i for i in common if base[i] == 0 and other[i] == 1]
    broken = [i for i in common if base[i] == 1 and other[i] == 0]
    return Flips(fixed=fixed[:limit], broken=broken[:limit])
