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

from shared.connection import connect
from shared.errors import EvalqError
from shared.results import ResultStore
from shared.runs import RunStore
from shared.settings import Settings, get_settings

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


def _stores(settings: Settings) -> tuple[redis.Redis, RunStore, ResultStore]:
    client = connect(settings.redis_url)
    return client, RunStore(client), ResultStore(client)


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
    follow_run: Annotated[bool, typer.Option("--follow", help="Show progress until done.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Submit an evaluation; prints the run id."""
    from producer.submit import SubmitRequest, parse_ids, parse_params, submit
    from shared.celery_app import create_app
    from shared.evaluation import load_plugins

    settings = get_settings()
    load_plugins(settings.plugins)
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
    )
    client, runs, results = _stores(settings)
    meta = submit(client, create_app(settings), request)
    if as_json:
        _print_json({"run_id": meta.run_id})
    else:
        out.print(meta.run_id, highlight=False)
    if follow_run:
        _follow_and_report(runs, results, meta.run_id, as_json)


def _follow_and_report(runs: RunStore, results: ResultStore, run_id: str, as_json: bool) -> None:
    from producer.follow import follow

    final = follow(runs, results, run_id, err if as_json else out)
    aggregate = results.aggregate(run_id)
    if as_json:
        _print_json({"run_id": run_id, "status": final.status, "aggregate": aggregate})
        return
    out.print(f"{run_id} {final.status}")
    for name, value in sorted((aggregate or {}).items()):
        out.print(f"  {name}: {value:.4f}")


def _status_record(runs: RunStore, results: ResultStore, run_id: str) -> dict[str, Any]:
    meta = runs.get(run_id)
    return {
        **meta.model_dump(mode="json"),
        "progress": results.progress(run_id).model_dump(),
        "aggregate": results.aggregate(run_id),
    }


@app.command()
def status(
    run_id: Annotated[str, typer.Argument(metavar="RUN")],
    as_json: JsonFlag = False,
) -> None:
    """Show a run's status, counts and aggregate."""
    _, runs, results = _stores(get_settings())
    record = _status_record(runs, results, run_id)
    if as_json:
        _print_json(record)
        return
    progress = record["progress"]
    table = Table(show_header=False, box=None)
    for key in ("run_id", "eval", "dataset_id", "split", "status", "n"):
        table.add_row(key, str(record[key]))
    table.add_row("progress", ", ".join(f"{k} {v}" for k, v in progress.items()))
    for name, value in sorted((record["aggregate"] or {}).items()):
        table.add_row(name, f"{value:.4f}")
    out.print(table)


@app.command()
def watch(run_id: Annotated[str, typer.Argument(metavar="RUN")], as_json: JsonFlag = False) -> None:
    """Follow a run live until it ends, then print its aggregate."""
    _, runs, results = _stores(get_settings())
    _follow_and_report(runs, results, run_id, as_json)


@app.command()
def runs(
    limit: Annotated[int, typer.Option(min=1, help="How many recent runs.")] = 20,
    as_json: JsonFlag = False,
) -> None:
    """List recent runs, newest first."""
    _, store, results = _stores(get_settings())
    records = [_status_record(store, results, m.run_id) for m in store.recent(limit)]
    if as_json:
        _print_json(records)
        return
    table = Table("run", "eval", "data", "split", "status", "done", "n")
    for r in records:
        done = r["progress"]["scored"] + r["progress"]["failed"]
        table.add_row(
            r["run_id"], r["eval"], r["dataset_id"], r["split"], r["status"], str(done), str(r["n"])
        )
    out.print(table)


@app.command()
def results(
    run_id: Annotated[str, typer.Argument(metavar="RUN")],
    fmt: Annotated[str, typer.Option("--format", help="jsonl, csv or parquet.")] = "jsonl",
    out_path: Annotated[Path | None, typer.Option("--out", help="File to write.")] = None,
) -> None:
    """Export a run's per-sample results."""
    from producer.export import ExportFormat, write_results
    from shared.errors import InputError

    try:
        export_format = ExportFormat(fmt)
    except ValueError:
        raise InputError(f"--format must be jsonl, csv or parquet, not {fmt!r}") from None
    _, store, result_store = _stores(get_settings())
    ids = store.sample_ids(run_id)
    count = write_results(result_store.results(run_id, ids), export_format, out_path)
    if out_path is not None:
        err.print(f"wrote {count} results to {out_path}")


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
