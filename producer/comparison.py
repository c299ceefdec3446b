"""A paired comparison of runs over the same samples: ``evalq compare``.

Runs pair by sample id, so they must share a dataset, a split and a spec (the fingerprint that
fixes which row an id is); a sample pairs when every run scored it. Each run after the first
is compared with the first (the baseline), per metric (:func:`shared.stats.paired`); with more
than two runs, the McNemar p-values of one metric are Holm-corrected together.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel

from shared.errors import ComparisonError
from shared.models import RunMeta, RunStatus
from shared.stats import Delta, holm, paired

__all__ = ["Comparison", "Flips", "check_pairable", "compare"]


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
    run_ids: Sequence[str], scores: Sequence[Mapping[int, Mapping[str, float]]], flips: int = 10
) -> Comparison:
    """Each run after the first against the first, per metric, over the samples both scored;
    up to ``flips`` flipped samples of each kind per run and 0/1 metric."""
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
    return Comparison(baseline=run_ids[baseline], metrics=metrics, flips=flipped)


def _metric(scores: Mapping[int, Mapping[str, float]], name: str) -> dict[int, float]:
    return {i: float(s[name]) for i, s in scores.items() if name in s}


def _flips(base: Mapping[int, float], other: Mapping[int, float], limit: int) -> Flips:
    common = sorted(base.keys() & other.keys())
    fixed = [i for i in common if base[i] == 0 and other[i] == 1]
    broken = [i for i in common if base[i] == 1 and other[i] == 0]
    return Flips(fixed=fixed[:limit], broken=broken[:limit])
