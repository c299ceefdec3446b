"""The producer's operator commands: ``demo``, ``metrics``, ``serve`` (the gateway), ``acl``,
``purge``, ``retention`` and ``up`` (a one-machine deployment)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from evalq.producer.clients.api import open_api
from evalq.shared.cli import JsonFlag, err, out, print_json
from evalq.shared.errors import InputError

__all__ = ["acl", "demo", "metrics", "purge", "retention", "serve", "up"]


def demo(  # noqa: PLR0917 - a typer command: its options are its parameters
    samples: Annotated[int, typer.Option(min=1, help="Validation samples to evaluate.")] = 1000,
    workers: Annotated[int, typer.Option(min=1, help="Worker processes to start.")] = 1,
    out_dir: Annotated[Path, typer.Option("--out", help="Where data and results go.")] = Path(
        "evalq-demo"
    ),
    language: Annotated[
        bool,
        typer.Option(
            "--lm", help="SmolLM2 on two built-in language tasks instead (needs: make lm)."
        ),
    ] = False,
    model: Annotated[
        str | None, typer.Option(help="With --lm: another model (hf/<folder or Hub id>).")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Start a private Redis and workers, evaluate MiniLM zero-shot topics, print accuracy."""
    if language:
        _language_demo(workers, out_dir.resolve(), as_json, model)
        return
    if model is not None:
        raise InputError("--model goes with --lm (the MiniLM demo's model is its evaluation's)")
    from evalq.producer.operations.demo import run_demo

    summary = run_demo(samples, workers, out_dir.resolve(), err if as_json else out)
    if as_json:
        print_json(
            {
                "run_id": summary.run.run_id,
                "aggregate": summary.aggregate,
                "stats": {k: v.model_dump(mode="json") for k, v in summary.stats.items()},
                "scored": summary.scored,
                "failed": summary.failed,
                "seconds": round(summary.seconds, 3),
                "results": str(summary.results_path),
            }
        )
        return
    accuracy = summary.aggregate.get("accuracy", float("nan"))
    stat = summary.stats.get("accuracy")
    low, high = (stat.ci95 if stat is not None else None) or (float("nan"), float("nan"))
    out.print(
        Text(f"accuracy {accuracy:.4f}", style="bold green"),
        f"(95% CI {low:.4f}-{high:.4f}) over {summary.scored} samples "
        f"({summary.failed} failed) in {summary.seconds:.1f}s "
        f"({summary.samples_per_second:.0f} samples/s)",
    )
    out.print(f"per-sample results: {summary.results_path}")


def _language_demo(workers: int, out_dir: Path, as_json: bool, model: str | None) -> None:
    from evalq.producer.operations.demo_lm import run_language_demo
    from evalq.shared.settings import get_settings

    console = err if as_json else out
    summaries = run_language_demo(workers, out_dir, console, model, get_settings().models)
    if as_json:
        print_json(
            [
                {
                    "task": s.task,
                    "run_id": s.run_id,
                    "samples": s.samples,
                    "failed": s.failed,
                    "stats": {k: v.model_dump(mode="json") for k, v in s.stats.items()},
                    "completion_tokens": s.completion_tokens,
                    "seconds": round(s.seconds, 3),
                    "results": str(s.results_path),
                }
                for s in summaries
            ]
        )
        return
    for summary in summaries:
        for metric, stat in sorted(summary.stats.items()):
            low, high = stat.ci95 or (float("nan"), float("nan"))
            out.print(
                Text(f"{summary.task} {metric} {stat.mean:.3f}", style="bold green"),
                f"(95% CI {low:.3f}-{high:.3f}) over {summary.samples} samples "
                f"({summary.failed} failed)",
            )
        rate = f", {summary.tokens_per_second:.0f} tokens/s" if summary.completion_tokens else ""
        out.print(f"  {summary.seconds:.1f}s{rate}; per-sample results: {summary.results_path}")


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
    from evalq.producer.operations.metrics import serve
    from evalq.shared.connection import connect
    from evalq.shared.settings import get_settings

    server = serve(connect(get_settings().redis), address, port, runs_shown)
    err.print(f"serving metrics on http://{address}:{server.port}/metrics")
    server.wait()


def serve(
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to serve on.")] = 8700,
) -> None:
    """Serve the gateway: the HTTP API for callers holding a token (until Ctrl-C)."""
    import uvicorn

    from evalq.producer.gateway.app import create_gateway
    from evalq.shared.isolation.privilege import undumpable
    from evalq.shared.settings import get_settings

    undumpable()  # its Redis credential is the strongest there is: not readable through /proc
    gateway = create_gateway(get_settings())
    err.print(f"evalq gateway on http://{host}:{port} (OpenAPI schema at /openapi.json)")
    # the peer address as it is: a caller must not pick its own anonymous bucket by a header;
    # no Date header: an answer carries no server time (a held-out run's reader is told its
    # times on the run's grain only, docs/trust-model.md)
    uvicorn.run(
        gateway,
        host=host,
        port=port,
        log_level="info",
        access_log=True,
        proxy_headers=False,
        date_header=False,
    )


def acl(
    out_path: Annotated[Path, typer.Option("--out", help="ACL file to write.")],
) -> None:
    """Write a Redis ACL file with users gateway, worker and monitor (passwords from
    EVALQ_ACL_GATEWAY_PASSWORD, EVALQ_ACL_WORKER_PASSWORD, EVALQ_ACL_MONITOR_PASSWORD)."""
    from evalq.producer.operations.acl import ROLES, write_acl

    write_acl(out_path)
    out.print(f"wrote {out_path}: users {', '.join(ROLES)}", highlight=False)


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
    from evalq.shared.store.retention import parse_age

    age = None if older_than is None else parse_age(older_than)
    purged = open_api().purge(run or [], age)
    if as_json:
        print_json({"purged": purged})
        return
    out.print(f"purged {len(purged)} runs" + (": " + ", ".join(purged) if purged else ""))


def retention(as_json: JsonFlag = False) -> None:
    """Apply the retention policy once: trim audit entries older than EVALQ_AUDIT_DAYS, purge
    runs older than EVALQ_KEEP_RUNS_DAYS (operators, direct mode; `evalq serve` does it on its
    own)."""
    from evalq.shared.connection import connect
    from evalq.shared.settings import get_settings
    from evalq.shared.store.retention import retain

    done = retain(connect(get_settings().redis), get_settings())
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
    Flower and metrics, each under its own Redis user, each started again when it exits; prints
    the admin token."""
    from evalq.producer.operations.stack import Stack, StackPorts

    ports = StackPorts(gateway=port, flower=flower_port, metrics=metrics_port, redis=redis_port)
    stack = Stack(state.resolve(), ports, workers=workers, concurrency=concurrency, host=host)
    raise typer.Exit(stack.run(redis_server, out))
