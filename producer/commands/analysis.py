"""The producer's commands that read runs side by side or anew: ``compare``, ``rescore`` and
``report``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from evalq.producer.clients.api import open_api
from evalq.producer.commands.arguments import RunArg, check_run_ids
from evalq.producer.commands.outcome import follow_and_report
from evalq.producer.commands.tables import Col, print_table
from evalq.producer.service.sweep import MAX_GRID
from evalq.shared.cli import AdminFlag, JsonFlag, out, print_json
from evalq.shared.errors import InputError

__all__ = ["compare", "report", "rescore"]


def report(
    run_ids: Annotated[list[str], typer.Argument(metavar="RUN [RUN ...]", callback=check_run_ids)],
    out_path: Annotated[Path, typer.Option("--out", help="HTML file to write.")] = Path(
        "report.html"
    ),
    admin: AdminFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Write a self-contained HTML report of a run (charts as the split's tier allows), or of
    the comparison of several runs against the first."""
    client = open_api(admin=admin)
    if len(run_ids) == 1:
        page = client.report(run_ids[0])
    else:
        from evalq.producer.reports.page import render_comparison

        found = client.compare(run_ids, flips=20)
        page = render_comparison(found, [client.status(r) for r in run_ids])
    out_path.write_text(page, encoding="utf-8")
    if as_json:
        runs = {"run_id": run_ids[0]} if len(run_ids) == 1 else {"run_ids": run_ids}
        print_json({**runs, "out": str(out_path)})
    else:
        out.print(f"wrote {out_path}", highlight=False)


def rescore(  # noqa: PLR0917 - a typer command: its options are its parameters
    run_id: RunArg,
    eval_name: Annotated[
        str, typer.Option("--eval", help="Evaluation whose score() scores RUN's outputs.")
    ],
    param: Annotated[list[str] | None, typer.Option(help="Its parameter k=v (repeatable).")] = None,
    follow_run: Annotated[bool, typer.Option("--follow", help="Show progress until done.")] = False,
    admin: AdminFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Score a completed run's stored outputs with another evaluation: a new run, no
    inference (the two must declare the same output kind); prints the new run id."""
    from evalq.producer.service.rescore import RescoreRequest
    from evalq.producer.service.submit import parse_params

    client = open_api(admin=admin)
    request = RescoreRequest(run=run_id, eval=eval_name, params=parse_params(param or []))
    meta = client.rescore(request)
    if as_json:
        print_json({"run_id": meta.run_id, "rescored_from": run_id})
    else:
        out.print(meta.run_id, highlight=False)
    if follow_run:
        follow_and_report(client, meta.run_id, as_json)


def compare(
    run_ids: Annotated[
        list[str] | None,
        typer.Argument(metavar="RUN_A RUN_B [RUN ...]", show_default=False, callback=check_run_ids),
    ] = None,
    sweep: Annotated[
        str | None, typer.Option(help="Compare a sweep's runs (the first submitted: baseline).")
    ] = None,
    flips: Annotated[
        int, typer.Option(min=0, help="Flipped samples to list per run and 0/1 metric.")
    ] = 10,
    admin: AdminFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Compare runs sample by sample: each against the first (same dataset, split and spec),
    beside each run's own mean and interval."""
    from evalq.producer.service.comparison import shown
    from evalq.shared.models import RunFilter

    client = open_api(admin=admin)
    if (sweep is None) == (not run_ids):
        raise InputError("give two or more runs, or --sweep ID (not both)")
    if sweep is not None:
        found_runs = client.recent(MAX_GRID, only=RunFilter(sweep=sweep))
        if not found_runs:
            raise InputError(f"no runs of sweep {sweep!r}")
        run_ids = [v.meta.run_id for v in sorted(found_runs, key=lambda v: v.meta.created)]
    assert run_ids is not None
    found = client.compare(run_ids, flips)
    if as_json:
        print_json(found.model_dump(mode="json"))
        return
    rows: list[tuple[str, ...]] = []
    for name, deltas in found.metrics.items():
        own = found.stats.get(name, {})
        rows.append(
            (name, found.baseline, *shown(own.get(found.baseline)), "baseline", "", "", "", "")
        )
        for run_id, delta in deltas.items():
            ci = "" if delta.ci95 is None else f"{delta.ci95[0]:+.4f} to {delta.ci95[1]:+.4f}"
            p = "" if delta.p_value is None else f"{delta.p_value:.3g}"
            moved = f"+{delta.flips[0]} / -{delta.flips[1]}" if delta.p_value is not None else ""
            rows.append(
                (
                    name,
                    run_id,
                    *shown(own.get(run_id)),
                    f"{delta.delta:+.4f}",
                    ci,
                    p,
                    str(delta.n_paired),
                    moved,
                )
            )
    print_table(COMPARE_COLUMNS, rows, title=f"against {found.baseline}")
    for run_id, settings in found.runs.items():
        if settings:
            out.print(f"{run_id}: {settings}", highlight=False)
    for name, runs in found.flips.items():
        for run_id, flipped in runs.items():
            if flipped.fixed or flipped.broken:
                fixed, broken = flipped.fixed or "-", flipped.broken or "-"
                out.print(f"{name} {run_id}: fixed {fixed}, broken {broken}", highlight=False)


COMPARE_COLUMNS = (
    Col("metric"),
    Col("run"),
    Col("mean", justify="right"),
    Col("its 95% CI", "text", "right", drop=1),
    Col("delta", justify="right"),
    Col("95% CI", "text", "right", drop=3),
    Col("p (McNemar)", justify="right"),
    Col("paired", justify="right", drop=2),
    Col("flips", justify="right", drop=4),
)
"""``compare``'s columns: metric names, ids, means, deltas, p-values and counts whole; the
intervals wrap between their numbers; a run's own interval, then the paired count, then the
delta's interval, then the flips are left out of an output too narrow for them."""
