"""Run reports: ``evalq report RUN --out report.html``, one self-contained HTML page.

Charts are drawn by matplotlib as inline SVG, so the page needs no script and no network:
per-metric aggregates, the score distribution, throughput over time (from the run's settled
stream), errors by kind, per-shard progress, and the failed and lowest-scoring samples (each
of the latter with its input and target, read from the run's data, beside its output). The
page shows what ``status`` would show the reader and no more: the score distribution and the
samples need per-sample access (a ``viewable`` split, or ``--admin``); on a ``non_viewable``
split they are withheld and only aggregates appear.
"""

from __future__ import annotations

import html
import io
import itertools
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from producer.client import Client, RunView
from producer.comparison import Comparison, shown
from shared.data.loading import load_rows, shard_of_rows
from shared.data.routing import KMeans
from shared.errors import EvalqError, TierRefusedError
from shared.evaluation import label_fields, scrub
from shared.models import SampleResult, SampleState
from shared.stats import Stat
from shared.store.wire import result_of

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa
    from matplotlib.figure import Figure

__all__ = ["Report", "aggregates_chart", "gather", "render", "render_comparison"]

_TIMELINE_BINS = 40
_COLORS = {"scored": "#2e7d32", "failed": "#c62828", "pending": "#b0bec5", "main": "#1565c0"}


@dataclass
class ShardProgress:
    """Samples of one shard, by state."""

    scored: int = 0
    failed: int = 0
    total: int = 0


@dataclass
class Report:
    """What the page shows, already filtered by the reader's access."""

    view: RunView
    scores: dict[str, list[float]] | None
    """Per-sample values of each metric; None when the tier withholds them."""
    scores_withheld: str | None
    timeline: list[tuple[float, int]]
    shards: list[ShardProgress] = field(default_factory=list)
    shards_note: str | None = None
    failures: list[SampleResult] = field(default_factory=list)
    """The first failed samples (per-sample access only)."""
    worst: list[tuple[float, SampleResult]] = field(default_factory=list)
    """The lowest-scoring samples by the first metric (per-sample access only)."""
    rows: dict[int, dict[str, Any]] | None = None
    """The rows of the lowest-scoring samples, labels included, from the run's data (per-sample
    access only); None when they could not be read (``rows_note`` says why)."""
    rows_note: str | None = None
    labels: tuple[str, ...] = ()
    """The evaluation's label fields: a row's target."""
    generated: float = field(default_factory=time.time)


def _shard_of(client: Client, view: RunView) -> tuple[np.ndarray | None, int, str | None]:
    """The shard of every row of the run's split and the shard count, or why not (the rows
    are read only for a routing that depends on them)."""
    try:
        spec = client.spec(view.meta.run_id)
        rows = load_rows(spec) if isinstance(spec.routing, KMeans) else None
        return shard_of_rows(spec, rows), spec.shards, None
    except EvalqError as exc:
        return None, 0, f"per-shard progress needs the run's data on this machine: {exc}"


def gather(client: Client, run_id: str) -> Report:
    """Everything the report of ``run_id`` shows to this client's reader, in one pass over the
    run's results (tables, live or archived): score values and per-shard counts only where the
    reader may read per-sample results (a split's shards are cut by its rows' content: a
    ``kmeans`` routing on any column, the label included, would make shard counts a per-row
    histogram of it)."""
    view = client.status(run_id)
    values: dict[str, list[np.ndarray]] = {}
    samples = _Samples()
    withheld = None
    try:
        states = _table_states(client.result_tables(run_id), values, samples)
    except TierRefusedError as exc:
        states, withheld = _states(client.states(run_id)), str(exc)
    shard_of, count, note = (None, 0, withheld) if withheld else _shard_of(client, view)
    shards = [ShardProgress() for _ in range(count)]
    for ids, scored, failed in states:
        if shard_of is not None:
            _count(shards, shard_of[ids], scored, failed)
    scores = None
    if withheld is None:
        import numpy as np

        scores = {name: np.concatenate(parts).tolist() for name, parts in values.items()}
    try:
        timeline = client.timeline(run_id)
    except TierRefusedError:
        timeline = []  # per-sample timing: the run's status shows it as a whole
    worst = samples.lowest()
    rows, rows_note = None, None
    if withheld is None and worst:
        try:
            rows = client.rows(run_id, [r.sample_id for _, r in worst])
        except EvalqError as exc:
            rows_note = f"inputs and targets need the run's data on this machine: {exc}"
    return Report(
        view, scores, withheld, timeline, shards, note, failures=samples.failures, worst=worst,
        rows=rows, rows_note=rows_note, labels=label_fields(view.meta.eval),
    )  # fmt: skip


States = Iterator[tuple["np.ndarray", "np.ndarray", "np.ndarray"]]
"""Chunks of (sample ids, scored, failed) as arrays."""


def _table_states(
    tables: Iterator[pa.Table], values: dict[str, list[np.ndarray]], samples: _Samples
) -> States:
    """Each table's states, gathering its metric values into ``values`` and its failures and
    low scores into ``samples`` on the way."""
    for table in tables:
        for column in table.column_names:
            if column.startswith("score."):
                found = table.column(column).drop_null().to_numpy()
                values.setdefault(column.removeprefix("score."), []).append(found)
        samples.see(table)
        yield (
            table.column("sample_id").to_numpy(),
            table.column("scores").is_valid().to_numpy(zero_copy_only=False),
            table.column("error").is_valid().to_numpy(zero_copy_only=False),
        )


def _states(found: Iterator[tuple[int, SampleState]], size: int = 65_536) -> States:
    """States one by one (a reader without per-sample access) as chunks of arrays."""
    import numpy as np

    while chunk := list(itertools.islice(found, size)):
        ids = np.array([i for i, _ in chunk], dtype=np.int64)
        scored = np.array([s is SampleState.SCORED for _, s in chunk], dtype=bool)
        failed = np.array([s is SampleState.FAILED for _, s in chunk], dtype=bool)
        yield ids, scored, failed


def _count(
    shards: list[ShardProgress], shard: np.ndarray, scored: np.ndarray, failed: np.ndarray
) -> None:
    import numpy as np

    size = len(shards)
    for index, (total, ok, bad) in enumerate(
        zip(
            np.bincount(shard, minlength=size),
            np.bincount(shard[scored], minlength=size),
            np.bincount(shard[failed], minlength=size),
            strict=True,
        )
    ):
        shards[index].total += int(total)
        shards[index].scored += int(ok)
        shards[index].failed += int(bad)


LISTED = 10
"""Failed and worst-scoring samples the report lists."""


@dataclass
class _Samples:
    """The first failures and the lowest scores of the first metric (the first scored
    sample's first, by name), kept as tables of results pass."""

    failures: list[SampleResult] = field(default_factory=list)
    worst: list[tuple[float, SampleResult]] = field(default_factory=list)
    metric: str | None = None

    def see(self, table: pa.Table) -> None:
        import numpy as np

        if len(self.failures) < LISTED:
            failed = np.flatnonzero(table.column("error").is_valid().to_numpy(zero_copy_only=False))
            self.failures += [_result(table, i) for i in failed[: LISTED - len(self.failures)]]
        if self.metric is None:
            first = table.column("scores").drop_null()
            if len(first) == 0:
                return
            self.metric = sorted(json.loads(first[0].as_py()))[0]
        column = f"score.{self.metric}"
        if column not in table.column_names:
            return
        present = np.flatnonzero(table.column(column).is_valid().to_numpy(zero_copy_only=False))
        found = table.column(column).to_numpy(zero_copy_only=False)
        ids = table.column("sample_id").to_numpy()
        lowest = present[np.lexsort((ids[present], found[present]))[:LISTED]]
        self.worst += [(float(found[i]), _result(table, i)) for i in lowest]
        self.worst = self.lowest()

    def lowest(self) -> list[tuple[float, SampleResult]]:
        """The ``LISTED`` lowest scores, lowest first (ties by sample id)."""
        return sorted(self.worst, key=lambda w: (w[0], w[1].sample_id))[:LISTED]


def _result(table: pa.Table, row: int) -> SampleResult:
    """One row of a results table as a result."""
    values = [table.column(c)[int(row)].as_py() for c in ("sample_id", "output", "scores", "error")]
    return result_of(*values)


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
        names, [aggregate[n] for n in names], color=_COLORS["main"],
        xerr=[[low for low, _ in errors], [high for _, high in errors]], capsize=4,
    )  # fmt: skip
    for y, (name, stat) in enumerate(zip(names, found, strict=True)):
        label = f" {aggregate[name]:.4g}"
        if stat is not None and stat.ci95 is not None:
            label += f" [{stat.ci95[0]:.4g}, {stat.ci95[1]:.4g}] n={stat.n}"
        if stat is not None and stat.failed:
            label += f" ({sum(stat.failed.values())} {'skipped' if stat.skipped else 'failed'})"
        axes.text(aggregate[name] + errors[y][1], y, label, va="center")
    axes.set_xlabel("run value (bars: 95% confidence interval)")
    return _svg(figure)


def _distribution_chart(scores: dict[str, list[float]]) -> str:
    import matplotlib.pyplot as plt

    names = list(scores)
    figure, grid = plt.subplots(1, len(names), figsize=(8, 3), squeeze=False)
    for axes, name in zip(grid[0], names, strict=True):
        axes.hist(scores[name], bins=20, color=_COLORS["main"])
        axes.set_title(name)
        axes.set_xlabel("score")
        axes.set_ylabel("samples")
        axes.spines[["top", "right"]].set_visible(False)
    return _svg(figure)


def _throughput_chart(timeline: list[tuple[float, int]], start: float) -> str:
    end = max(t for t, _ in timeline)
    span = max(end - start, 1e-3)
    width = span / _TIMELINE_BINS
    counts = [0] * _TIMELINE_BINS
    for moment, settled in timeline:
        counts[max(0, min(int((moment - start) / width), _TIMELINE_BINS - 1))] += settled
    figure, axes = _figure()
    edges = [start + i * width - start for i in range(_TIMELINE_BINS)]
    axes.bar(edges, [c / width for c in counts], width=width, align="edge", color=_COLORS["main"])
    axes.set_xlabel("seconds since submission")
    axes.set_ylabel("samples settled / s")
    return _svg(figure)


def _integer_ticks() -> Any:
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(integer=True)


def _errors_chart(errors: dict[str, int]) -> str:
    figure, axes = _figure(max(1.6, 0.5 * len(errors) + 1))
    kinds = list(errors)
    axes.barh(kinds, [errors[k] for k in kinds], color=_COLORS["failed"])
    axes.xaxis.set_major_locator(_integer_ticks())
    axes.set_xlabel("samples")
    return _svg(figure)


def _shards_chart(shards: list[ShardProgress]) -> str:
    figure, axes = _figure(max(1.6, 0.35 * len(shards) + 1))
    labels = [f"shard {k}" for k in range(len(shards))]
    scored = [s.scored for s in shards]
    failed = [s.failed for s in shards]
    pending = [s.total - s.scored - s.failed for s in shards]
    axes.barh(labels, scored, color=_COLORS["scored"], label="scored")
    axes.barh(labels, failed, left=scored, color=_COLORS["failed"], label="failed")
    lefts = [a + b for a, b in zip(scored, failed, strict=True)]
    axes.barh(labels, pending, left=lefts, color=_COLORS["pending"], label="pending")
    axes.set_xlabel("samples")
    axes.xaxis.set_major_locator(_integer_ticks())
    axes.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    return _svg(figure)


def _table(name: str, headers: list[str], rows: list[list[str]], caption: str = "") -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in rows
    )
    title = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return f'<table class="rows" data-table="{name}">{title}<tr>{head}</tr>{body}</table>'


def _provenance(view: RunView) -> str:
    found = view.provenance
    if found is None:
        return ""
    rows = [
        [w.host, w.device, w.python, ", ".join(f"{k} {v}" for k, v in w.packages.items()),
         w.evaluation, w.source_sha256[:12]]
        for w in found.workers
    ]  # fmt: skip
    headers = ["host", "device", "python", "packages", "evaluation", "source sha256"]
    spec = f"<p>dataset spec <code>{html.escape(found.spec)}</code></p>" if found.spec else ""
    return spec + (_table("provenance", headers, rows) if rows else "")


SHOWN_CHARS = 120
"""A value longer than this (as JSON) is cut in the report's tables."""


def _cut(value: object) -> str:
    """``value`` as compact JSON, cut to :data:`SHOWN_CHARS` (an ellipsis says so)."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "…"


def _target(row: dict[str, Any], labels: tuple[str, ...]) -> object:
    """A row's target: its label field's value, or its label fields' when there are several."""
    if len(labels) == 1:
        return row.get(labels[0])
    return {name: row.get(name) for name in labels}


def _worst(report: Report) -> str:
    """The lowest-scoring samples, each with its input and target beside its output where its
    row was read."""
    rows = report.rows
    if rows is None:
        headers = ["sample", "score", "output"]
        cells = [[str(r.sample_id), f"{v:.4g}", _cut(r.output)] for v, r in report.worst]
    else:
        headers = ["sample", "score", "input", "target", "output"]
        cells = [
            [str(r.sample_id), f"{v:.4g}", _cut(scrub(rows[r.sample_id], report.labels)),
             _cut(_target(rows[r.sample_id], report.labels)), _cut(r.output)]
            for v, r in report.worst
        ]  # fmt: skip
    caption = f"lowest-scoring samples by their first metric (the {LISTED} lowest)"
    return _table("worst", headers, cells, caption)


def _samples(report: Report) -> str:
    failed = [
        [str(r.sample_id), f"{r.error.stage}/{r.error.kind}", r.error.message]
        for r in report.failures
        if r.error is not None
    ]
    parts = []
    if failed:
        caption = f"failed samples (the first {LISTED})"
        parts.append(_table("failures", ["sample", "stage/kind", "message"], failed, caption))
    if report.worst:
        parts.append(_worst(report))
    return "".join(parts)


def _section(title: str, name: str, chart: str | None, note: str | None = None) -> str:
    body = f'<figure class="chart" data-chart="{name}">{chart}</figure>' if chart else ""
    if note:
        body += f'<p class="note">{html.escape(note)}</p>'
    return f"<section><h2>{html.escape(title)}</h2>{body}</section>"


def _forest_chart(found: Comparison) -> str:
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
        deltas, range(len(labels)), xerr=[lows, highs], fmt="o", color=_COLORS["main"], capsize=4
    )
    axes.axvline(0.0, color=_COLORS["failed"], linewidth=1)
    axes.set_yticks(range(len(labels)), labels)
    axes.invert_yaxis()
    axes.set_xlabel(f"difference from {found.baseline} (95% paired bootstrap interval)")
    return _svg(figure)


def render_comparison(found: Comparison, views: list[RunView]) -> str:
    """A comparison of runs as one HTML page: the runs with their own value of each metric
    (mean, 95% interval, count), a forest plot of the differences from the baseline, and each
    difference's numbers beside the run's own value, and its flipped samples."""
    names = list(found.metrics)
    runs = [
        [v.meta.run_id, v.meta.eval, " ".join(f"{k}={x}" for k, x in sorted(v.meta.params.items())),
         v.meta.status.value,
         *(" ".join(shown(found.stats.get(n, {}).get(v.meta.run_id))) for n in names)]
        for v in views
    ]  # fmt: skip
    numbers = [
        [name, run_id, f"{d.delta:+.4f}",
         "" if d.ci95 is None else f"{d.ci95[0]:+.4f} to {d.ci95[1]:+.4f}",
         "" if d.p_value is None else f"{d.p_value:.3g}", str(d.n_paired),
         *shown(found.stats.get(name, {}).get(run_id))]
        for name, deltas in found.metrics.items()
        for run_id, d in deltas.items()
    ]  # fmt: skip
    flips = [
        [name, run_id, ", ".join(map(str, f.fixed)) or "-", ", ".join(map(str, f.broken)) or "-"]
        for name, flipped in found.flips.items()
        for run_id, f in flipped.items()
    ]
    sections = [
        _section(
            "Runs",
            "runs",
            _table(
                "runs",
                ["run", "eval", "params", "status", *(f"{n} (95% CI, n)" for n in names)],
                runs,
            ),
        ),
        _section(
            "Differences from the baseline",
            "forest",
            _forest_chart(found) if numbers else None,
            None if numbers else "no metric pairs",
        ),
        _section(
            "Numbers",
            "numbers",
            _table(
                "numbers",
                [
                    "metric",
                    "run",
                    "delta",
                    "95% CI",
                    "p (McNemar, Holm)",
                    "paired",
                    "mean",
                    "its 95% CI",
                ],
                numbers,
            ),
        ),
        _section(
            "Flipped samples",
            "flips",
            _table("flips", ["metric", "run", "fixed (0 to 1)", "broken (1 to 0)"], flips)
            if flips
            else None,
            None if flips else "no 0/1 metric",
        ),
    ]
    title = f"evalq comparison against {found.baseline}"
    return _page(title, "", sections, time.time())


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 60rem; color: #222; }
table { border-collapse: collapse; } td, th { padding: .2rem .8rem; text-align: left; }
th { color: #555; font-weight: normal; } section { margin-top: 1.5rem; }
figure.chart { margin: 0; } figure.chart svg { max-width: 100%; height: auto; }
caption { text-align: left; color: #555; padding-top: .6rem; }
.note { color: #555; font-style: italic; }
"""


def render(report: Report) -> str:
    """The report as one HTML page."""
    view = report.view
    meta = view.meta
    progress = view.progress
    facts = {
        "run": meta.run_id,
        "evaluation": meta.eval,
        "data": f"{meta.dataset_id} / {meta.split} ({view.tier.value})",
        "status": meta.status.value,
        "samples": f"{meta.n:,}",
        "inferred / scored / failed": f"{progress.inferred:,} / {progress.scored:,} / "
        f"{progress.failed:,}",
        "throughput": "—" if view.throughput is None else f"{view.throughput:,.1f} samples/s",
        "submitted": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(meta.created)),
    }
    rows = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in facts.items()
    )
    sections = [
        _section(
            "Per-metric aggregates",
            "aggregates",
            aggregates_chart(view.aggregate, view.stats) if view.aggregate else None,
            None if view.aggregate else (view.withheld or "no aggregate yet"),
        ),
        _section(
            "Score distribution",
            "distribution",
            _distribution_chart(report.scores) if report.scores else None,
            report.scores_withheld or (None if report.scores else "no scores yet"),
        ),
        _section(
            "Throughput over time",
            "throughput",
            _throughput_chart(report.timeline, meta.created) if report.timeline else None,
            None
            if report.timeline
            else "nothing settled yet"
            if view.timed
            else "when samples settled is per-sample data of this split (not shown)",
        ),
        _section(
            "Errors by kind",
            "errors",
            _errors_chart(view.errors) if view.errors else None,
            None if view.errors else "no errors",
        ),
        _section(
            "Per-shard progress",
            "shards",
            _shards_chart(report.shards) if report.shards else None,
            report.shards_note,
        ),
        _section(
            "Failures and lowest-scoring samples",
            "samples",
            _samples(report) or None,
            report.scores_withheld
            or report.rows_note
            or (None if report.failures or report.worst else "no scored or failed sample yet"),
        ),
        _section("Provenance", "provenance", _provenance(view) or None),
    ]
    return _page(f"evalq run {meta.run_id}", f"<table>{rows}</table>", sections, report.generated)


def _page(title: str, facts: str, sections: list[str], generated: float) -> str:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(generated))
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>"
        f"<h1>{html.escape(title)}</h1>{facts}{''.join(sections)}"
        f'<p class="note">generated {stamp} by evalq</p></body></html>'
    )
