"""The producer's commands on runs once submitted: ``status``, ``watch``, ``runs``, ``results``,
``cancel`` and ``resume``."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from evalq.producer.clients.api import open_api
from evalq.producer.commands.arguments import RunArg
from evalq.producer.commands.outcome import follow_and_report, metric_text
from evalq.producer.commands.tables import Col, print_table
from evalq.shared.choices import ExportFormat, RunStatus
from evalq.shared.cli import AdminFlag, JsonFlag, err, out, print_json
from evalq.shared.errors import InputError

__all__ = ["cancel", "results", "resume", "runs", "status", "watch"]


def status(
    run_id: RunArg,
    admin: AdminFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Show a run's status, counts and aggregate (as its split's tier allows)."""
    view = open_api(admin=admin).status(run_id)
    if as_json:
        print_json(view.as_dict())
        return
    table = Table(show_header=False, box=None)
    meta = view.meta
    for key, value in (
        ("run", meta.run_id),
        ("eval", meta.eval),
        *((("model", meta.model),) if meta.model is not None else ()),
        ("data", f"{meta.dataset_id} / {meta.split} ({view.tier})"),
        ("status", f"{meta.status}, stalled: {view.stalled}" if view.stalled else meta.status),
        ("samples", meta.n),
        ("priority", meta.priority),
    ):
        table.add_row(key, str(value))
    if view.stale_code:
        table.add_row("warning", view.stale_code)
    for worker in view.provenance.workers if view.provenance else ():
        table.add_row("code", f"{worker.host} {worker.device}: {worker.code}")
    if view.waiting is not None:
        waiting = view.waiting
        table.add_row(
            "waiting",
            f"{waiting.waiting} samples not dispatched yet, {waiting.share:.0%} of the workers: "
            f"{waiting.why}",
        )
    if meta.reason:
        table.add_row("reason", meta.reason)
    progress = view.progress.model_dump()
    table.add_row(
        "progress", ", ".join(f"{k} {v}" for k, v in progress.items() if v or k != "recovered")
    )
    pace = "—" if view.throughput is None else f"{view.throughput:.1f} samples/s"
    if view.eta_seconds is not None:
        pace += f", about {view.eta_seconds:.0f}s left"
    table.add_row("throughput", pace)
    if view.endpoint is not None:
        seen = view.endpoint
        table.add_row(
            "endpoint",
            f"{seen.url}, last minute (every run): {seen.requests} requests, "
            f"{seen.rate_limited} answered 429, {seen.retries} retries, {seen.tokens} tokens, "
            f"{seen.cached} from the cache",
        )
    for kind, count in view.errors.items():
        table.add_row("errors", f"{count} {kind}")
    for name, metric in sorted((view.aggregate or {}).items()):
        table.add_row(name, metric_text(view, name, metric))
    if view.withheld:
        table.add_row("aggregate", f"withheld: {view.withheld}")
    out.print(table)


def watch(
    run_id: RunArg,
    admin: AdminFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Follow a run live until it ends, then print its aggregate."""
    follow_and_report(open_api(admin=admin), run_id, as_json)


def runs(  # noqa: PLR0913, PLR0917 - a typer command: its options are its parameters
    limit: Annotated[int, typer.Option(min=1, help="How many recent runs.")] = 20,
    eval_name: Annotated[str | None, typer.Option("--eval", help="Only this evaluation.")] = None,
    dataset: Annotated[str | None, typer.Option(help="Only this dataset.")] = None,
    sweep: Annotated[str | None, typer.Option(help="Only this sweep's runs.")] = None,
    tag: Annotated[str | None, typer.Option(help="Only runs with this tag.")] = None,
    status_is: Annotated[
        RunStatus | None, typer.Option("--status", help="Only this status.")
    ] = None,
    model: Annotated[str | None, typer.Option(help="Only runs on this model spec.")] = None,
    split: Annotated[str | None, typer.Option(help="Only runs of this split.")] = None,
    principal: Annotated[
        str | None, typer.Option(help="Only this principal's runs (admins see everyone's).")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """List recent runs, newest first, with their params, tags and first metric."""
    from evalq.shared.models import RunFilter

    only = RunFilter(
        eval=eval_name,
        dataset=dataset,
        sweep=sweep,
        tag=tag,
        status=status_is,
        model=model,
        split=split,
        principal=principal,
    )
    views = open_api().recent(limit, only=only)
    if as_json:
        print_json([v.as_dict() for v in views])
        return
    rows: list[tuple[str, ...]] = []
    for v in views:
        m = v.meta
        metric = ""
        if v.aggregate:
            name = sorted(v.aggregate)[0]
            metric = f"{name} {v.aggregate[name]:.4f}"
        rows.append(
            (
                m.run_id,
                m.eval,
                f"{m.dataset_id}/{m.split}",
                str(m.status),
                f"{v.progress.done}/{m.n}",
                metric,
                m.settings_shown,
                " ".join(m.tags),
            )
        )
    print_table(RUNS_COLUMNS, rows)


RUNS_COLUMNS = (
    Col("run"),
    Col("eval", "text"),
    Col("data", "text", drop=3),
    Col("status"),
    Col("done/n"),
    Col("metric", "text"),
    Col("params", "text", drop=2),
    Col("tags", "text", drop=1),
)
"""``runs``' columns: an id is never shortened (it is what the other commands take), nor a
count; a metric wraps between its name and its value; tags, then params, then the data are left
out of an output too narrow for them wrapped."""


def results(  # noqa: PLR0917 - a typer command: its options are its parameters
    run_id: RunArg,
    fmt: Annotated[
        ExportFormat, typer.Option("--format", case_sensitive=False, help="Output format.")
    ] = ExportFormat.JSONL,
    out_path: Annotated[Path | None, typer.Option("--out", help="File to write.")] = None,
    follow_run: Annotated[
        bool, typer.Option("--follow", help="Stream results as they are stored (jsonl).")
    ] = False,
    with_input: Annotated[
        bool, typer.Option("--with-input", help="Add each sample's row (labels included).")
    ] = False,
    admin: AdminFlag = False,
) -> None:
    """Export a run's per-sample results (viewable splits; admins see all, audited)."""
    from evalq.producer.reports.export import write_lines, write_results, write_tables

    if follow_run and fmt is not ExportFormat.JSONL:
        raise InputError("--follow streams jsonl only")
    client = open_api(admin=admin)
    if fmt is ExportFormat.JSONL and not follow_run and not with_input:
        count = write_lines(client.result_lines(run_id), out_path)
    elif not follow_run and not with_input:
        count = write_tables(client.result_tables(run_id), fmt, out_path)
    else:
        rows = (
            client.follow_results(run_id, with_input=with_input)
            if follow_run
            else client.results(run_id, with_input=with_input)
        )
        count = write_results(rows, fmt, out_path)
    if out_path is not None:
        err.print(f"wrote {count} results to {out_path}")
    if follow_run:
        client.ended(run_id)


def cancel(run_id: RunArg, as_json: JsonFlag = False) -> None:
    """Cancel a run: keep what finished, refund (once) the samples that produced nothing."""
    done = open_api().cancel(run_id)
    if as_json:
        print_json(asdict(done))
        return
    state = "cancelled" if done.cancelled_now else "was already cancelled"
    out.print(f"{run_id} {state}; refunded {done.refunded_samples} samples")


def resume(run_id: RunArg, as_json: JsonFlag = False) -> None:
    """Re-enqueue the samples that have no terminal result yet (charges no budget)."""
    done = open_api().resume(run_id)
    if as_json:
        print_json(asdict(done))
        return
    if done.inference is None or done.scoring is None:
        out.print(f"{run_id}: resumed (counts not shown: the run's split is not viewable)")
        return
    out.print(
        f"{run_id}: {done.inference} samples back to inference, {done.scoring} to scoring"
        + (", aggregate computed" if done.finalized else "")
    )
