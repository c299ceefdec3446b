"""The ``evalq`` command line (typer + rich).

Exit codes: 0 ok, 1 error, 2 bad input or usage, 3 refused by policy. Errors print one line on
stderr. Commands that only talk to Redis import neither torch nor any model.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, NoReturn

import redis
import typer
from rich.console import Console
from rich.table import Table

from producer.client import Client
from shared.errors import EvalqError
from shared.ledger import Budget
from shared.routing import RoutingKind
from shared.settings import get_settings
from shared.spec import MAX_SPEC_SHARDS
from shared.tiers import Tier

__all__ = ["app", "main"]

out = Console()
err = Console(stderr=True)


app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="evalq: metered, label-safe model evaluation on Celery + Redis.",
)

JsonFlag = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]


def _print_json(value: Any) -> None:
    typer.echo(json.dumps(value, sort_keys=True, default=str))


AdminFlag = Annotated[
    bool, typer.Option("--admin", help="Bypass tier and budget (recorded in the audit stream).")
]


def _client(admin: bool = False) -> Client:
    return Client(get_settings(), admin=admin)


@app.command()
def demo(
    samples: Annotated[int, typer.Option(min=1, help="Validation samples to evaluate.")] = 1000,
    workers: Annotated[int, typer.Option(min=1, help="Worker processes to start.")] = 1,
    out_dir: Annotated[Path, typer.Option("--out", help="Where data and results go.")] = Path(
        "evalq-demo"
    ),
    as_json: JsonFlag = False,
) -> None:
    """Start a private Redis and workers, evaluate MiniLM zero-shot topics, print accuracy."""
    from producer.demo import run_demo

    summary = run_demo(samples, workers, out_dir.resolve(), err if as_json else out)
    if as_json:
        _print_json(
            {
                "run_id": summary.run.run_id,
                "aggregate": summary.aggregate,
                "scored": summary.scored,
                "failed": summary.failed,
                "seconds": round(summary.seconds, 3),
                "results": str(summary.results_path),
            }
        )
        return
    accuracy = summary.aggregate.get("accuracy", float("nan"))
    out.print(
        f"[bold green]accuracy {accuracy:.4f}[/] over {summary.scored} samples "
        f"({summary.failed} failed) in {summary.seconds:.1f}s "
        f"({summary.samples_per_second:.0f} samples/s)"
    )
    out.print(f"per-sample results: {summary.results_path}")


@app.command()
def worker(
    queues: Annotated[str, typer.Option(help="Comma-separated queues: infer, score.")] = (
        "infer,score"
    ),
    concurrency: Annotated[int, typer.Option(min=1, help="Worker processes (one per GPU).")] = 1,
    loglevel: Annotated[str, typer.Option(help="Celery log level.")] = "INFO",
) -> None:
    """Run a Celery worker (wraps `celery -A worker.main worker`)."""
    from worker.app import run_worker

    run_worker(get_settings(), queues=queues, concurrency=concurrency, loglevel=loglevel)


@app.command("submit")
def submit_command(
    eval_name: Annotated[str, typer.Argument(metavar="EVAL", help="Registered evaluation.")],
    data: Annotated[str, typer.Option(help="Local file/folder or Hub dataset id.")],
    split: Annotated[str, typer.Option(help="Split to evaluate.")],
    limit: Annotated[int | None, typer.Option(help="Evaluate the first N samples.")] = None,
    ids: Annotated[str | None, typer.Option(help="Comma-separated sample ids.")] = None,
    param: Annotated[
        list[str] | None, typer.Option(help="Eval parameter k=v (repeatable).")
    ] = None,
    revision: Annotated[str | None, typer.Option(help="Hub revision to pin.")] = None,
    config: Annotated[str | None, typer.Option(help="Hub dataset configuration.")] = None,
    dataset_id: Annotated[str | None, typer.Option(help="Id for tiers/budgets.")] = None,
    shards: Annotated[
        int, typer.Option(min=1, max=MAX_SPEC_SHARDS, help="Shards to cut the split into.")
    ] = 1,
    routing: Annotated[
        RoutingKind, typer.Option(help="Which shard each row goes to.")
    ] = RoutingKind.CONTIGUOUS,
    route_field: Annotated[str, typer.Option(help="Text field kmeans routes by.")] = "text",
    router_sample: Annotated[
        int, typer.Option(min=1, help="Texts the kmeans fit reads (bounds its memory).")
    ] = 1000,
    router_seed: Annotated[
        int, typer.Option(min=0, help="Seed of the kmeans featurizer and initialisation.")
    ] = 0,
    follow_run: Annotated[bool, typer.Option("--follow", help="Show progress until done.")] = False,
    admin: AdminFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Submit an evaluation; prints the run id."""
    from producer.submit import SubmitRequest, parse_ids, parse_params
    from shared.data import Sharding

    request = SubmitRequest(
        eval=eval_name,
        data=data,
        split=split,
        limit=limit,
        ids=parse_ids(ids) if ids is not None else None,
        params=parse_params(param or []),
        revision=revision,
        config=config,
        dataset_id=dataset_id,
        sharding=Sharding(
            shards=shards,
            routing=routing,
            route_field=route_field,
            sample_size=router_sample,
            seed=router_seed,
        ),
    )
    client = _client(admin)
    meta = client.submit(request)
    if as_json:
        _print_json({"run_id": meta.run_id})
    else:
        out.print(meta.run_id, highlight=False)
    if follow_run:
        _follow_and_report(client, meta.run_id, as_json)


def _follow_and_report(client: Client, run_id: str, as_json: bool) -> None:
    from producer.follow import follow

    follow(client.runs, client.store, run_id, err if as_json else out)
    view = client.status(run_id)
    if as_json:
        _print_json(
            {
                "run_id": run_id,
                "status": view.meta.status,
                "aggregate": view.aggregate,
                "withheld": view.withheld,
            }
        )
        return
    out.print(f"{run_id} {view.meta.status}")
    for name, value in sorted((view.aggregate or {}).items()):
        out.print(f"  {name}: {value:.4f}")
    if view.withheld:
        out.print(f"  aggregate withheld: {view.withheld}")


@app.command()
def status(
    run_id: Annotated[str, typer.Argument(metavar="RUN")],
    admin: AdminFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Show a run's status, counts and aggregate (as its split's tier allows)."""
    view = _client(admin).status(run_id)
    if as_json:
        _print_json(view.as_dict())
        return
    table = Table(show_header=False, box=None)
    meta = view.meta
    for key, value in (
        ("run", meta.run_id),
        ("eval", meta.eval),
        ("data", f"{meta.dataset_id} / {meta.split} ({view.tier})"),
        ("status", meta.status),
        ("samples", meta.n),
    ):
        table.add_row(key, str(value))
    progress = view.progress.model_dump()
    table.add_row("progress", ", ".join(f"{k} {v}" for k, v in progress.items()))
    pace = f"{view.throughput:.1f} samples/s"
    if view.eta_seconds is not None:
        pace += f", about {view.eta_seconds:.0f}s left"
    table.add_row("throughput", pace)
    for kind, count in view.errors.items():
        table.add_row("errors", f"{count} {kind}")
    for name, metric in sorted((view.aggregate or {}).items()):
        table.add_row(name, f"{metric:.4f}")
    if view.withheld:
        table.add_row("aggregate", f"withheld: {view.withheld}")
    out.print(table)


@app.command()
def watch(
    run_id: Annotated[str, typer.Argument(metavar="RUN")],
    admin: AdminFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Follow a run live until it ends, then print its aggregate."""
    _follow_and_report(_client(admin), run_id, as_json)


@app.command()
def report(
    run_id: Annotated[str, typer.Argument(metavar="RUN")],
    out_path: Annotated[Path, typer.Option("--out", help="HTML file to write.")] = Path(
        "report.html"
    ),
    admin: AdminFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Write a self-contained HTML report of a run (charts as the split's tier allows)."""
    from producer.report import gather, render

    page = render(gather(_client(admin), run_id))
    out_path.write_text(page, encoding="utf-8")
    if as_json:
        _print_json({"run_id": run_id, "out": str(out_path)})
    else:
        out.print(f"wrote {out_path}", highlight=False)


@app.command()
def metrics(
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to serve on.")] = 9808,
    address: Annotated[str, typer.Option(help="Address to bind.")] = "0.0.0.0",
    runs_shown: Annotated[
        int, typer.Option("--runs", min=1, help="Most recent runs to export.")
    ] = 100,
) -> None:
    """Serve Prometheus metrics: per-run samples, queue depths, budgets left (until Ctrl-C)."""
    from producer.metrics import serve
    from shared.connection import connect

    server = serve(connect(get_settings().redis_url), address, port, runs_shown)
    err.print(f"serving metrics on http://{address}:{server.port}/metrics")
    server.wait()


@app.command()
def runs(
    limit: Annotated[int, typer.Option(min=1, help="How many recent runs.")] = 20,
    as_json: JsonFlag = False,
) -> None:
    """List recent runs, newest first."""
    views = _client().recent(limit)
    if as_json:
        _print_json([v.as_dict() for v in views])
        return
    table = Table("run", "eval", "data", "split", "tier", "status", "done", "n")
    for v in views:
        m = v.meta
        done = str(v.progress.done)
        table.add_row(m.run_id, m.eval, m.dataset_id, m.split, v.tier, m.status, done, str(m.n))
    out.print(table)


@app.command()
def results(
    run_id: Annotated[str, typer.Argument(metavar="RUN")],
    fmt: Annotated[str, typer.Option("--format", help="jsonl, csv or parquet.")] = "jsonl",
    out_path: Annotated[Path | None, typer.Option("--out", help="File to write.")] = None,
    follow_run: Annotated[
        bool, typer.Option("--follow", help="Stream results as they are stored (jsonl).")
    ] = False,
    admin: AdminFlag = False,
) -> None:
    """Export a run's per-sample results (viewable splits; admins see all, audited)."""
    from producer.export import ExportFormat, write_results
    from shared.errors import InputError

    try:
        export_format = ExportFormat(fmt)
    except ValueError:
        raise InputError(f"--format must be jsonl, csv or parquet, not {fmt!r}") from None
    client = _client(admin)
    if follow_run and export_format is not ExportFormat.JSONL:
        raise InputError("--follow streams jsonl only")
    rows = client.follow_results(run_id) if follow_run else client.results(run_id)
    count = write_results(rows, export_format, out_path)
    if out_path is not None:
        err.print(f"wrote {count} results to {out_path}")


@app.command()
def cancel(
    run_id: Annotated[str, typer.Argument(metavar="RUN")], as_json: JsonFlag = False
) -> None:
    """Cancel a run: keep what finished, refund (once) the samples that produced nothing."""
    done = _client().cancel(run_id)
    if as_json:
        _print_json(done.__dict__)
        return
    state = "cancelled" if done.cancelled_now else "was already cancelled"
    out.print(f"{run_id} {state}; refunded {done.refunded_samples} samples")


@app.command()
def resume(
    run_id: Annotated[str, typer.Argument(metavar="RUN")], as_json: JsonFlag = False
) -> None:
    """Re-enqueue the samples that have no terminal result yet (charges no budget)."""
    done = _client().resume(run_id)
    if as_json:
        _print_json(done.__dict__)
        return
    out.print(
        f"{run_id}: {done.inference} samples back to inference, {done.scoring} to scoring"
        + (", aggregate computed" if done.finalized else "")
    )


tiers_app = typer.Typer(help="Split tiers: viewable, non_viewable (aggregates only), no_access.")
budget_app = typer.Typer(help="Per-split budgets of runs and samples.")
policy_app = typer.Typer(help="Tiers and budgets from a file.")
app.add_typer(tiers_app, name="tiers")
app.add_typer(budget_app, name="budget")
app.add_typer(policy_app, name="policy")


@tiers_app.command("set")
def tiers_set(
    dataset: Annotated[str, typer.Argument()],
    split: Annotated[str, typer.Argument()],
    tier: Annotated[Tier, typer.Argument(case_sensitive=False)],
) -> None:
    """Set a split's tier (audited)."""
    client = _client()
    before = client.tiers.set(dataset, split, tier, client.settings.principal)
    out.print(f"{dataset}/{split}: {before or 'unlisted'} -> {tier}")


@tiers_app.command("list")
def tiers_list(as_json: JsonFlag = False) -> None:
    """List every listed split's tier (unlisted splits are no_access)."""
    listed = _client().tiers.listed()
    if as_json:
        _print_json({d: {s: t.value for s, t in splits.items()} for d, splits in listed.items()})
        return
    table = Table("dataset", "split", "tier")
    for dataset, splits in listed.items():
        for split, tier in sorted(splits.items()):
            table.add_row(dataset, split, tier)
    out.print(table)


@budget_app.command("set")
def budget_set(
    dataset: Annotated[str, typer.Argument()],
    split: Annotated[str, typer.Argument()],
    runs_total: Annotated[int | None, typer.Option("--runs", min=0, help="Runs in all.")] = None,
    samples: Annotated[int | None, typer.Option(min=0, help="Samples in all.")] = None,
    max_samples_per_run: Annotated[
        int | None, typer.Option(min=1, help="Most samples in one run.")
    ] = None,
) -> None:
    """Set a split's budget totals (unset = unlimited); what was used is kept (audited)."""
    client = _client()
    budget = client.ledger.set(
        dataset, split, runs_total, samples, max_samples_per_run, client.settings.principal
    )
    out.print(f"{dataset}/{split}: " + _budget_line(budget))


def _budget_line(budget: Budget) -> str:
    def part(name: str, left: int | None, total: int | None) -> str:
        return f"{name} unlimited" if total is None else f"{name} {left}/{total} left"

    cap = budget.max_samples_per_run
    return ", ".join(
        [
            part("runs", budget.runs_left, budget.runs_total),
            part("samples", budget.samples_left, budget.samples_total),
            f"max per run {cap if cap is not None else 'unlimited'}",
        ]
    )


@budget_app.command("show")
def budget_show(as_json: JsonFlag = False) -> None:
    """Show every budget: totals, used and left."""
    budgets = _client().ledger.all()
    if as_json:
        _print_json([b.summary() for b in budgets])
        return
    table = Table("dataset", "split", "budget")
    for budget in budgets:
        table.add_row(budget.dataset, budget.split, _budget_line(budget))
    out.print(table)


@policy_app.command("apply")
def policy_apply(path: Annotated[Path, typer.Argument(metavar="FILE")]) -> None:
    """Apply tiers and budgets from a YAML or JSON file (checked whole before anything is set)."""
    from producer.policy_file import apply_policy, load_policy

    client = _client()
    policy = load_policy(path)
    for warning in apply_policy(policy, client.tiers, client.ledger, client.settings.principal):
        err.print(f"[yellow]warning:[/] {warning}", highlight=False)
    splits = sum(len(s) for s in policy.datasets.values())
    out.print(f"applied {path}: {splits} splits")


def _fail(message: str, code: int) -> NoReturn:
    err.print(f"[red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise SystemExit(code)


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point: evalq's errors become one line on stderr and an exit code."""
    try:
        app(args=list(argv) if argv is not None else sys.argv[1:], prog_name="evalq")
    except EvalqError as exc:
        _fail(str(exc), exc.exit_code)
    except redis.ConnectionError as exc:
        _fail(f"cannot reach Redis: {exc}", 1)
