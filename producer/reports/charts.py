"""The report's charts, drawn by matplotlib as inline SVG, so that a page needs no script and
no network: per-metric aggregates with their intervals, the score distribution, throughput
over time, errors by kind, per-shard progress, and a comparison's forest plot."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

from evalq.producer.service.comparison import Comparison
from evalq.producer.service.report import ShardProgress
from evalq.shared.stats import Stat

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "COLORS",
    "aggregates_chart",
    "distribution_chart",
    "errors_chart",
    "forest_chart",
    "shards_chart",
    "throughput_chart",
]

_TIMELINE_BINS = 40
COLORS = {"scored": "#2e7d32", "failed": "#c62828", "pending": "#b0bec5", "main": "#1565c0"}
"""The charts' colours, by what they show."""


def _svg(figure: Figure) -> str:
    import matplotlib.pyplot as plt

    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", bbox_inches="tight")
    plt.close(figure)
    text = buffer.getvalue()
    return text[text.index("<svg") :]


def _figure(height: float = 3.0) -> tuple[Figure, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.fonttype": "none", "font.size": 10})
    figure, axes = plt.subplots(figsize=(8, height))
    axes.spines[["top", "right"]].set_visible(False)
    return figure, axes


def aggregates_chart(aggregate: dict[str, float], stats: dict[str, Stat] | None) -> str:
    """One bar per metric, with its 95% interval as an error bar where the view has one."""
    figure, axes = _figure(max(1.6, 0.5 * len(aggregate) + 1))
    names = list(aggregate)
    found = [(stats or {}).get(n) for n in names]
    errors = [
        (0.0, 0.0)
        if s is None or s.ci95 is None
        # a bootstrap interval need not contain the estimate: clamp, never a negative bar
        else (max(0.0, aggregate[n] - s.ci95[0]), max(0.0, s.ci95[1] - aggregate[n]))
        for n, s in zip(names, found, strict=True)
    ]
    axes.barh(
        names,
        [aggregate[n] for n in names],
        color=COLORS["main"],
        xerr=[[low for low, _ in errors], [high for _, high in errors]],
        capsize=4,
    )
    for y, (name, stat) in enumerate(zip(names, found, strict=True)):
        label = f" {aggregate[name]:.4g}"
        if stat is not None and stat.ci95 is not None:
            label += f" [{stat.ci95[0]:.4g}, {stat.ci95[1]:.4g}] n={stat.n}"
        if stat is not None and stat.failed:
            label += f" ({sum(stat.failed.values())} {'skipped' if stat.skipped else 'failed'})"
        axes.text(aggregate[name] + errors[y][1], y, label, va="center")
    axes.set_xlabel("run value (bars: 95% confidence interval)")
    return _svg(figure)


def distribution_chart(scores: dict[str, list[float]]) -> str:
    import matplotlib.pyplot as plt

    names = list(scores)
    figure, grid = plt.subplots(1, len(names), figsize=(8, 3), squeeze=False)
    for axes, name in zip(grid[0], names, strict=True):
        axes.hist(scores[name], bins=20, color=COLORS["main"])
        axes.set_title(name)
        axes.set_xlabel("score")
        axes.set_ylabel("samples")
        axes.spines[["top", "right"]].set_visible(False)
    return _svg(figure)


def throughput_chart(timeline: list[tuple[float, int]], start: float) -> str:
    end = max(t for t, _ in timeline)
    span = max(end - start, 1e-3)
    width = span / _TIMELINE_BINS
    counts = [0] * _TIMELINE_BINS
    for moment, settled in timeline:
        counts[max(0, min(int((moment - start) / width), _TIMELINE_BINS - 1))] += settled
    figure, axes = _figure()
    edges = [start + i * width - start for i in range(_TIMELINE_BINS)]
    axes.bar(edges, [c / width for c in counts], width=width, align="edge", color=COLORS["main"])
    axes.set_xlabel("seconds since submission")
    axes.set_ylabel("samples settled / s")
    return _svg(figure)


def _integer_ticks() -> Any:
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(integer=True)


def errors_chart(errors: dict[str, int]) -> str:
    figure, axes = _figure(max(1.6, 0.5 * len(errors) + 1))
    kinds = list(errors)
    axes.barh(kinds, [errors[k] for k in kinds], color=COLORS["failed"])
    axes.xaxis.set_major_locator(_integer_ticks())
    axes.set_xlabel("samples")
    return _svg(figure)


def shards_chart(shards: list[ShardProgress]) -> str:
    figure, axes = _figure(max(1.6, 0.35 * len(shards) + 1))
    labels = [f"shard {k}" for k in range(len(shards))]
    scored = [s.scored for s in shards]
    failed = [s.failed for s in shards]
    pending = [s.total - s.scored - s.failed for s in shards]
    axes.barh(labels, scored, color=COLORS["scored"], label="scored")
    axes.barh(labels, failed, left=scored, color=COLORS["failed"], label="failed")
    lefts = [a + b for a, b in zip(scored, failed, strict=True)]
    axes.barh(labels, pending, left=lefts, color=COLORS["pending"], label="pending")
    axes.set_xlabel("samples")
    axes.xaxis.set_major_locator(_integer_ticks())
    axes.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    return _svg(figure)


def forest_chart(found: Comparison) -> str:
    """Each run's difference from the baseline with its 95% interval, per metric."""
    labels, deltas, lows, highs = [], [], [], []
    for name, runs in found.metrics.items():
        for run_id, delta in runs.items():
            labels.append(f"{name}: {run_id}")
            deltas.append(delta.delta)
            low, high = delta.ci95 or (delta.delta, delta.delta)
            lows.append(max(0.0, delta.delta - low))
            highs.append(max(0.0, high - delta.delta))
    figure, axes = _figure(max(1.6, 0.45 * len(labels) + 1))
    axes.errorbar(
        deltas, range(len(labels)), xerr=[lows, highs], fmt="o", color=COLORS["main"], capsize=4
    )
    axes.axvline(0.0, color=COLORS["failed"], linewidth=1)
    axes.set_yticks(range(len(labels)), labels)
    axes.invert_yaxis()
    axes.set_xlabel(f"difference from {found.baseline} (95% paired bootstrap interval)")
    return _svg(figure)
