"""The report's HTML: a run's report (:class:`evalq.producer.service.report.Report`) or a
comparison of runs as one self-contained page, its charts inline
(:mod:`evalq.producer.reports.charts`), its tables escaped."""

from __future__ import annotations

import html
import json
import time

from evalq.producer.reports.charts import (
    aggregates_chart,
    distribution_chart,
    errors_chart,
    forest_chart,
    shards_chart,
    throughput_chart,
)
from evalq.producer.service.comparison import Comparison, shown
from evalq.producer.service.report import LISTED, Report
from evalq.producer.service.views import RunView
from evalq.shared.evaluation import scrub

__all__ = ["render", "render_comparison"]


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
        [
            w.host,
            w.device,
            w.python,
            ", ".join(f"{k} {v}" for k, v in w.packages.items()),
            w.evaluation,
            w.source_sha256[:12],
            w.weights or "",
        ]
        for w in found.workers
    ]
    headers = ["host", "device", "python", "packages", "evaluation", "source sha256", "weights"]
    spec = f"<p>dataset spec <code>{html.escape(found.spec)}</code></p>" if found.spec else ""
    return spec + (_table("provenance", headers, rows) if rows else "")


SHOWN_CHARS = 120
"""A value longer than this (as JSON) is cut in the report's tables."""


def _cut(value: object) -> str:
    """``value`` as compact JSON, cut to :data:`SHOWN_CHARS` (an ellipsis says so)."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "…"


def _text(value: object) -> str:
    """``value`` as text: a string as it is (a model's generated text), anything else as
    compact JSON; cut to :data:`SHOWN_CHARS` (an ellipsis says so)."""
    if value is None:
        return ""
    if not isinstance(value, str):
        return _cut(value)
    return value if len(value) <= SHOWN_CHARS else value[: SHOWN_CHARS - 1] + "…"


def _prompt(value: object) -> str:
    """What a language model read: the prompt's text (a local model's chat template
    applied), or the messages an endpoint chat task sent, as ``role: content`` lines."""
    if isinstance(value, list):
        value = "\n".join(f"{m.get('role')}: {m.get('content')}" for m in value)
    return _text(value)


def _worst(report: Report) -> str:
    """The lowest-scoring samples, each with its input (a language task's prompt as the model
    read it) and target beside its output where its row was read."""
    rows = report.rows
    if rows is None:
        headers = ["sample", "score", "output"]
        cells = [[str(r.sample_id), f"{v:.4g}", _text(r.output)] for v, r in report.worst]
    elif report.prompts:
        headers = ["sample", "score", "prompt", "target", "output"]
        cells = [
            [
                str(r.sample_id),
                f"{v:.4g}",
                _prompt(report.prompts.get(r.sample_id)),
                _text(report.targets.get(r.sample_id)),
                _text(r.output),
            ]
            for v, r in report.worst
        ]
    else:
        headers = ["sample", "score", "input", "target", "output"]
        cells = [
            [
                str(r.sample_id),
                f"{v:.4g}",
                _cut(scrub(rows[r.sample_id], report.labels)),
                _text(report.targets.get(r.sample_id)),
                _text(r.output),
            ]
            for v, r in report.worst
        ]
    caption = f"lowest-scoring samples by their first metric (the {LISTED} lowest)"
    return _table("worst", headers, cells, caption)


def _samples(report: Report) -> str:
    failed = [
        [str(r.sample_id), r.error.stage_kind, r.error.message]
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


def render_comparison(found: Comparison, views: list[RunView]) -> str:
    """A comparison of runs as one HTML page: the runs with their own value of each metric
    (mean, 95% interval, count), a forest plot of the differences from the baseline, and each
    difference's numbers beside the run's own value, and its flipped samples."""
    names = list(found.metrics)
    shown_model = {v.meta.run_id: v.meta.model_shown for v in views}

    def named(run_id: str) -> str:
        """A run with its task and model: runs of two tasks on one model told apart."""
        said = [s for s in (found.tasks.get(run_id), shown_model.get(run_id)) if s]
        return f"{run_id} ({', '.join(said)})" if said else run_id

    runs = [
        [
            v.meta.run_id,
            v.meta.eval,
            v.meta.settings_shown.replace(f"model={v.meta.model}", f"model={v.meta.model_shown}"),
            v.meta.status.value,
            *(" ".join(shown(found.stats.get(n, {}).get(v.meta.run_id))) for n in names),
        ]
        for v in views
    ]
    numbers = [
        [
            name,
            named(run_id),
            f"{d.delta:+.4f}",
            "" if d.ci95 is None else f"{d.ci95[0]:+.4f} to {d.ci95[1]:+.4f}",
            "" if d.p_value is None else f"{d.p_value:.3g}",
            str(d.n_paired),
            *shown(found.stats.get(name, {}).get(run_id)),
        ]
        for name, deltas in found.metrics.items()
        for run_id, d in deltas.items()
    ]
    flips = [
        [
            name,
            named(run_id),
            ", ".join(map(str, f.fixed)) or "-",
            ", ".join(map(str, f.broken)) or "-",
        ]
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
            forest_chart(found) if numbers else None,
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
        **({"model": meta.model_shown} if meta.model_shown is not None else {}),
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
            distribution_chart(report.scores) if report.scores else None,
            report.scores_withheld or (None if report.scores else "no scores yet"),
        ),
        _section(
            "Throughput over time",
            "throughput",
            throughput_chart(report.timeline, meta.created) if report.timeline else None,
            None
            if report.timeline
            else "nothing settled yet"
            if view.timed
            else "when samples settled is per-sample data of this split (not shown)",
        ),
        _section(
            "Errors by kind",
            "errors",
            errors_chart(view.errors) if view.errors else None,
            None if view.errors else "no errors",
        ),
        _section(
            "Per-shard progress",
            "shards",
            shards_chart(report.shards) if report.shards else None,
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
