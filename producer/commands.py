"""The producer's commands of ``evalq``: demo, up, submit, status, watch, runs, results, report,
metrics, cancel, resume, purge, retention (added to the app of :mod:`shared.cli` through the
``evalq.commands`` entry point). Commands that only talk to Redis import neither torch nor any
model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Column, Table
from rich.text import Text

from producer import policy_cli
from producer.api import Api, open_api
from producer.export import ExportFormat
from producer.sweep import MAX_GRID
from producer.views import RunView
from shared.cli import AdminFlag, JsonFlag, err, out, print_json
from shared.data.routing import RoutingKind
from shared.data.spec import MAX_SPEC_SHARDS
from shared.errors import DetachedError, EvalqError, InputError
from shared.models import Priority, Progress, RunStatus
from shared.names import check_run_id
from shared.settings import get_settings
from shared.store.retention import parse_age

if TYPE_CHECKING:
    from producer.submit import SubmitRequest

__all__ = ["register"]

RunArg = Annotated[str, typer.Argument(metavar="RUN", callback=check_run_id)]


def _run_ids(values: list[str] | None) -> list[str] | None:
    """Each of several RUN arguments checked as :data:`RunArg` checks one."""
    return None if values is None else [check_run_id(value) for value in values]


def _client(admin: bool = False) -> Api:
    return open_api(admin=admin)


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
        print_json(
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
        Text(f"accuracy {accuracy:.4f}", style="bold green"),
        f"over {summary.scored} samples "
        f"({summary.failed} failed) in {summary.seconds:.1f}s "
        f"({summary.samples_per_second:.0f} samples/s)",
    )
    out.print(f"per-sample results: {summary.results_path}")


def submit_command(  # noqa: PLR0913, PLR0917 - a typer command: its options are its parameters
    eval_name: Annotated[str, typer.Argument(metavar="EVAL", help="Registered evaluation.")],
    split: Annotated[str, typer.Option(help="Split to evaluate.")],
    dataset: Annotated[
        str | None, typer.Option(help="Registered dataset (evalq datasets list).")
    ] = None,
    data: Annotated[
        str | None,
        typer.Option(help="Unregistered local file/folder or Hub id (operators and admins)."),
    ] = None,
    limit: Annotated[int | None, typer.Option(help="Evaluate the first N samples.")] = None,
    ids: Annotated[str | None, typer.Option(help="Comma-separated sample ids.")] = None,
    param: Annotated[
        list[str] | None, typer.Option(help="Eval parameter k=v (repeatable).")
    ] = None,
    revision: Annotated[str | None, typer.Option(help="Hub revision of --data.")] = None,
    config: Annotated[str | None, typer.Option(help="Hub configuration of --data.")] = None,
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
    priority: Annotated[
        Priority | None,
        typer.Option(help="Share of the workers against your other runs (default: the policy's)."),
    ] = None,
    sweep: Annotated[
        list[str] | None,
        typer.Option(help="Sweep a parameter: k=v1,v2 (repeatable; submits the grid)."),
    ] = None,
    sweep_file: Annotated[
        Path | None, typer.Option(help="YAML mapping of parameter -> values to sweep.")
    ] = None,
    tag: Annotated[list[str] | None, typer.Option(help="Label the run(s) (repeatable).")] = None,
    follow_run: Annotated[bool, typer.Option("--follow", help="Show progress until done.")] = False,
    admin: AdminFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Submit an evaluation (or a sweep's grid of them); prints the run id(s)."""
    from producer.submit import SubmitRequest, parse_ids, parse_params
    from producer.sweep import grid, new_sweep_id, parse_sweeps, read_sweep_file
    from shared.data.loading import Sharding

    sweeps = parse_sweeps(sweep or [])
    if sweep_file is not None:
        for key, values in read_sweep_file(sweep_file).items():
            if key in sweeps:
                raise InputError(f"--sweep {key} is also in {sweep_file}")
            sweeps[key] = values
    request = SubmitRequest(
        eval=eval_name,
        dataset=dataset,
        data=data,
        split=split,
        limit=limit,
        ids=tuple(parse_ids(ids)) if ids is not None else None,
        params=parse_params(param or []),
        revision=revision,
        config=config,
        sharding=Sharding(
            shards=shards,
            routing=routing,
            route_field=route_field,
            sample_size=router_sample,
            seed=router_seed,
        ),
        priority=priority,
        tags=tuple(tag or ()),
    )
    client = _client(admin)
    if sweeps:
        if follow_run:
            raise InputError(
                "--follow follows one run; watch a sweep with evalq runs --sweep ID or "
                "evalq watch RUN"
            )
        _submit_sweep(client, request, grid(request.params, sweeps), new_sweep_id(), as_json)
        return
    meta = client.submit(request)
    if as_json:
        print_json({"run_id": meta.run_id})
    else:
        out.print(meta.run_id, highlight=False)
    view = client.status(meta.run_id)
    if view.stale_code:
        err.print(f"warning: {view.stale_code}", highlight=False, soft_wrap=True)
    waiting = client.stalled(meta, Progress())
    if waiting:
        err.print(f"warning: {waiting}; the run waits until one does", highlight=False)
    if follow_run:
        _follow_and_report(client, meta.run_id, as_json)


def _submit_sweep(
    client: Api, request: SubmitRequest, grid: list[dict[str, str]], sweep: str, as_json: bool
) -> None:
    """Submit one run per point of ``grid``, sharing the sweep id. Every point is checked
    before any is submitted; a refusal midway stops the sweep there, and the runs submitted
    before it stand: listed on stdout (``--json``: with the error) before the error."""
    points = [
        type(request).model_validate({**request.model_dump(), "params": params, "sweep": sweep})
        for params in grid
    ]
    client.check_params(points)
    submitted: list[str] = []
    try:
        for point in points:
            submitted.append(client.submit(point).run_id)
    except EvalqError as exc:
        if as_json:
            print_json({"sweep": sweep, "run_ids": submitted, "error": str(exc)})
        elif submitted:
            _print_sweep(sweep, submitted, grid, f" of {len(grid)} before this refusal")
        raise
    if as_json:
        print_json({"sweep": sweep, "run_ids": submitted})
        return
    _print_sweep(sweep, submitted, grid)


def _print_sweep(
    sweep: str, submitted: list[str], grid: list[dict[str, str]], note: str = ""
) -> None:
    out.print(f"sweep {sweep}: {len(submitted)} runs{note}", highlight=False)
    for run_id, params in zip(submitted, grid, strict=False):
        shown = " ".join(f"{k}={v}" for k, v in sorted(params.items()))
        out.print(f"{run_id}  {shown}", highlight=False)


def _follow_and_report(client: Api, run_id: str, as_json: bool) -> None:
    """Follow the run to its end and print its outcome; exit code 4 (``RunNotCompletedError``)
    when it ended failed or cancelled."""
    from producer.follow import follow

    try:
        follow(client, run_id, err if as_json else out)
    except KeyboardInterrupt:
        raise DetachedError(run_id) from None
    view = client.status(run_id)
    if as_json:
        print_json(
            {
                "run_id": run_id,
                "status": view.meta.status,
                "aggregate": view.aggregate,
                "withheld": view.withheld,
                "release": None if view.release is None else view.release.model_dump(),
                "stats": {k: v.model_dump(mode="json") for k, v in (view.stats or {}).items()}
                or None,
            }
        )
        client.ended(run_id)
        return
    out.print(f"{run_id} {view.meta.status}")
    for name, value in sorted((view.aggregate or {}).items()):
        out.print(f"  {name}: {_metric(view, name, value)}")
    if view.withheld:
        out.print(f"  aggregate withheld: {view.withheld}")
    client.ended(run_id)


def status(
    run_id: RunArg,
    admin: AdminFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Show a run's status, counts and aggregate (as its split's tier allows)."""
    view = _client(admin).status(run_id)
    if as_json:
        print_json(view.as_dict())
        return
    table = Table(show_header=False, box=None)
    meta = view.meta
    for key, value in (
        ("run", meta.run_id),
        ("eval", meta.eval),
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
    for kind, count in view.errors.items():
        table.add_row("errors", f"{count} {kind}")
    for name, metric in sorted((view.aggregate or {}).items()):
        table.add_row(name, _metric(view, name, metric))
    if view.withheld:
        table.add_row("aggregate", f"withheld: {view.withheld}")
    out.print(table)


def _metric(view: RunView, name: str, value: float) -> str:
    """``0.8520 ± 0.0159 (95% CI 0.8190-0.8800, n 500, 24 failed: infer/RuntimeError)``, as
    far as the view has them (``skipped`` instead of ``failed`` when the evaluation leaves
    failed samples out), then how it was released when not exactly."""
    text = f"{value:.4f}"
    stat = (view.stats or {}).get(name)
    notes: list[str] = []
    if stat is not None:
        if stat.stderr is not None:
            text += f" ± {stat.stderr:.4f}"
        if stat.ci95 is not None:
            notes.append(f"95% CI {stat.ci95[0]:.4f}-{stat.ci95[1]:.4f}")
        if notes or stat.failed:
            notes.append(f"n {stat.n}")
        if stat.failed:
            notes.append(_failures(stat.failed, "skipped" if stat.skipped else "failed"))
    if notes:
        text += f" ({', '.join(notes)})"
    return text + _released(view, name)


def _failures(failed: dict[str, int], verb: str) -> str:
    """``24 failed: infer/RuntimeError``, or ``24 failed: 20 infer/RuntimeError, 4 score``."""
    total = sum(failed.values())
    if len(failed) == 1:
        return f"{total} {verb}: {next(iter(failed))}"
    return f"{total} {verb}: " + ", ".join(f"{count} {kind}" for kind, count in failed.items())


def _released(view: RunView, metric: str) -> str:
    """`` (released by <rule>: <why>)`` after a metric that is not shown exactly."""
    if view.release is None:
        return ""
    return f" (released by {view.release.rule}: {view.release.why.get(metric, '')})"


def watch(
    run_id: RunArg,
    admin: AdminFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Follow a run live until it ends, then print its aggregate."""
    _follow_and_report(_client(admin), run_id, as_json)


def report(
    run_ids: Annotated[list[str], typer.Argument(metavar="RUN [RUN ...]", callback=_run_ids)],
    out_path: Annotated[Path, typer.Option("--out", help="HTML file to write.")] = Path(
        "report.html"
    ),
    admin: AdminFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Write a self-contained HTML report of a run (charts as the split's tier allows), or of
    the comparison of several runs against the first."""
    client = _client(admin)
    if len(run_ids) == 1:
        page = client.report(run_ids[0])
    else:
        from producer.page import render_comparison

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
    from producer.rescore import RescoreRequest
    from producer.submit import parse_params

    client = _client(admin)
    request = RescoreRequest(run=run_id, eval=eval_name, params=parse_params(param or []))
    meta = client.rescore(request)
    if as_json:
        print_json({"run_id": meta.run_id, "rescored_from": run_id})
    else:
        out.print(meta.run_id, highlight=False)
    if follow_run:
        _follow_and_report(client, meta.run_id, as_json)


def compare(
    run_ids: Annotated[
        list[str] | None,
        typer.Argument(metavar="RUN_A RUN_B [RUN ...]", show_default=False, callback=_run_ids),
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
    from producer.comparison import shown
    from shared.store.runs import RunFilter

    client = _client(admin)
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
    table = Table(title=f"against {found.baseline}")
    for column in ("metric", "run", "mean", "its 95% CI", "delta", "95% CI", "p (McNemar)",
                   "paired", "flips"):  # fmt: skip
        table.add_column(column, justify="left" if column in ("metric", "run") else "right")
    for name, deltas in found.metrics.items():
        own = found.stats.get(name, {})
        table.add_row(name, found.baseline, *shown(own.get(found.baseline)), "baseline")
        for run_id, delta in deltas.items():
            ci = "" if delta.ci95 is None else f"{delta.ci95[0]:+.4f} to {delta.ci95[1]:+.4f}"
            p = "" if delta.p_value is None else f"{delta.p_value:.3g}"
            moved = f"+{delta.flips[0]} / -{delta.flips[1]}" if delta.p_value is not None else ""
            table.add_row(
                name, run_id, *shown(own.get(run_id)), f"{delta.delta:+.4f}", ci, p,
                str(delta.n_paired), moved,
            )  # fmt: skip
    out.print(table)
    for name, runs in found.flips.items():
        for run_id, flipped in runs.items():
            if flipped.fixed or flipped.broken:
                fixed, broken = flipped.fixed or "-", flipped.broken or "-"
                out.print(f"{name} {run_id}: fixed {fixed}, broken {broken}", highlight=False)


def metrics(
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to serve on.")] = 9808,
    address: Annotated[
        str, typer.Option(help="Address to bind (0.0.0.0: every interface, no auth).")
    ] = "127.0.0.1",
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


def serve(
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to serve on.")] = 8700,
) -> None:
    """Serve the gateway: the HTTP API for callers holding a token (until Ctrl-C)."""
    import uvicorn

    from producer.gateway import create_gateway
    from shared.isolation.privilege import undumpable

    undumpable()  # its Redis credential is the strongest there is: not readable through /proc
    gateway = create_gateway(get_settings())
    err.print(f"evalq gateway on http://{host}:{port} (OpenAPI schema at /openapi.json)")
    # the peer address as it is: a caller must not pick its own anonymous bucket by a header
    uvicorn.run(
        gateway, host=host, port=port, log_level="info", access_log=True, proxy_headers=False
    )


def acl(
    out_path: Annotated[Path, typer.Option("--out", help="ACL file to write.")],
) -> None:
    """Write a Redis ACL file with users gateway, worker and monitor (passwords from
    EVALQ_ACL_GATEWAY_PASSWORD, EVALQ_ACL_WORKER_PASSWORD, EVALQ_ACL_MONITOR_PASSWORD)."""
    from producer.acl import ROLES, write_acl

    write_acl(out_path)
    out.print(f"wrote {out_path}: users {', '.join(ROLES)}", highlight=False)


def runs(  # noqa: PLR0917 - a typer command: its options are its parameters
    limit: Annotated[int, typer.Option(min=1, help="How many recent runs.")] = 20,
    eval_name: Annotated[str | None, typer.Option("--eval", help="Only this evaluation.")] = None,
    dataset: Annotated[str | None, typer.Option(help="Only this dataset.")] = None,
    sweep: Annotated[str | None, typer.Option(help="Only this sweep's runs.")] = None,
    tag: Annotated[str | None, typer.Option(help="Only runs with this tag.")] = None,
    status_is: Annotated[
        RunStatus | None, typer.Option("--status", help="Only this status.")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """List recent runs, newest first, with their params, tags and first metric."""
    from shared.store.runs import RunFilter

    only = RunFilter(eval=eval_name, dataset=dataset, sweep=sweep, tag=tag, status=status_is)
    views = _client().recent(limit, only=only)
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
                m.run_id, m.eval, f"{m.dataset_id}/{m.split}", str(m.status),
                f"{v.progress.done}/{m.n}", metric,
                " ".join(f"{k}={val}" for k, val in sorted(m.params.items())), " ".join(m.tags),
            )
        )  # fmt: skip
    widths = _fit(rows, out.width)
    table = Table(
        *(
            Column(header, width=width, min_width=width, no_wrap=True, overflow="ellipsis")
            for header, width in zip(RUNS_COLUMNS, widths, strict=True)
        ),
        box=None,
        pad_edge=False,
        collapse_padding=True,
    )
    for row in rows:
        table.add_row(*row)
    out.print(table)


RUNS_COLUMNS = ("run", "eval", "data", "status", "done/n", "metric", "params", "tags")
SHRINK = (
    ("tags", 4), ("data", 8), ("params", 8), ("eval", 6), ("metric", 8),
    ("tags", 1), ("params", 1), ("data", 1), ("eval", 1), ("metric", 1), ("status", 1),
    ("done/n", 1),
)  # fmt: skip
"""Which ``runs`` columns give up width first when the output is narrow, down to how much (an
id is never shortened: it is what the other commands take)."""


def _fit(rows: list[tuple[str, ...]], available: int) -> list[int]:
    """Each ``runs`` column's width, so that a row is one line of at most ``available``
    characters where it can be (cells cut with an ellipsis, as :data:`SHRINK` says)."""
    widths = [
        max([len(header), *(len(row[i]) for row in rows)]) for i, header in enumerate(RUNS_COLUMNS)
    ]
    for header, floor in SHRINK:
        excess = sum(widths) + len(widths) - 1 - available
        if excess <= 0:
            break
        i = RUNS_COLUMNS.index(header)
        widths[i] -= min(excess, max(0, widths[i] - floor))
    return widths


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
    from producer.export import write_lines, write_results, write_tables

    if follow_run and fmt is not ExportFormat.JSONL:
        raise InputError("--follow streams jsonl only")
    client = _client(admin)
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
    done = _client().cancel(run_id)
    if as_json:
        print_json(asdict(done))
        return
    state = "cancelled" if done.cancelled_now else "was already cancelled"
    out.print(f"{run_id} {state}; refunded {done.refunded_samples} samples")


def resume(run_id: RunArg, as_json: JsonFlag = False) -> None:
    """Re-enqueue the samples that have no terminal result yet (charges no budget)."""
    done = _client().resume(run_id)
    if as_json:
        print_json(asdict(done))
        return
    out.print(
        f"{run_id}: {done.inference} samples back to inference, {done.scoring} to scoring"
        + (", aggregate computed" if done.finalized else "")
    )


def purge(
    run: Annotated[
        list[str] | None,
        typer.Option("--run", metavar="RUN", help="A run to purge (repeat for more)."),
    ] = None,
    older_than: Annotated[
        str | None,
        typer.Option(
            "--older-than", metavar="AGE", help="Runs submitted longer ago: 30d, 12h, 45m, 90s."
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Remove ended runs wholly: record, results and archive (admins; audited)."""
    age = None if older_than is None else parse_age(older_than)
    purged = _client().purge(run or [], age)
    if as_json:
        print_json({"purged": purged})
        return
    out.print(f"purged {len(purged)} runs" + (": " + ", ".join(purged) if purged else ""))


def retention(as_json: JsonFlag = False) -> None:
    """Apply the retention policy once: trim audit entries older than EVALQ_AUDIT_DAYS, purge
    runs older than EVALQ_KEEP_RUNS_DAYS (operators, direct mode; `evalq serve` does it on its
    own)."""
    from shared.connection import connect
    from shared.store.retention import retain

    done = retain(connect(get_settings().redis_url), get_settings())
    if as_json:
        print_json({"trimmed": done.trimmed, "purged": done.purged})
        return
    purged = ": " + ", ".join(done.purged) if done.purged else ""
    out.print(
        f"trimmed {done.trimmed} audit entries; purged {len(done.purged)} runs{purged}",
        highlight=False,
    )


def up(  # noqa: PLR0913, PLR0917 - a typer command: its options are its parameters
    workers: Annotated[int, typer.Option(min=1, help="Worker processes to start.")] = 1,
    concurrency: Annotated[int, typer.Option(min=1, help="Pool processes per worker.")] = 1,
    host: Annotated[str, typer.Option(help="Address the gateway binds.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="The gateway's port.")] = 8700,
    flower_port: Annotated[int, typer.Option(min=1, max=65535, help="Flower's port.")] = 5555,
    metrics_port: Annotated[
        int, typer.Option(min=1, max=65535, help="The metrics endpoint's port.")
    ] = 9808,
    redis_port: Annotated[
        int, typer.Option(min=0, max=65535, help="Redis's port (0: a free one).")
    ] = 0,
    redis_server: Annotated[
        str | None,
        typer.Option(metavar="PATH", help="The redis-server (7.0 or newer) to run."),
    ] = None,
    state: Annotated[
        Path, typer.Option("--dir", help="Where Redis's data, secrets, archive and logs go.")
    ] = Path("evalq-up"),
) -> None:
    """Run a one-machine deployment until Ctrl-C: Redis with the ACL file, the gateway, workers,
    Flower and metrics, each under its own Redis user; prints an admin token."""
    from producer.stack import Stack, StackPorts

    ports = StackPorts(gateway=port, flower=flower_port, metrics=metrics_port, redis=redis_port)
    stack = Stack(state.resolve(), ports, workers=workers, concurrency=concurrency, host=host)
    raise typer.Exit(stack.run(redis_server, out))


def register(app: typer.Typer) -> None:
    """Add the producer's commands to the ``evalq`` app."""
    commands: tuple[Callable[..., None], ...] = (
        demo, status, watch, runs, results, compare, rescore, report, metrics, serve, acl,
        cancel, resume, purge, retention, up,
    )  # fmt: skip
    for command in commands:
        app.command()(command)
    app.command("submit")(submit_command)
    policy_cli.register(app)
