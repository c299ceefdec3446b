"""Endpoint models side by side in one run, against one OpenAI-compatible server:

1. **Throughput**: the same 200 prompts (``bench/lmeval/data/arith.jsonl``, plain text, greedy,
   ``max_tokens`` 8, stop at a newline) through
   - lm-evaluation-harness's ``local-completions`` (``lm_eval.simple_evaluate``) at
     ``num_concurrent`` = evalq's concurrency, timed around its ``generate_until`` (the ratio's
     reference) and around the whole call;
   - evalq with 1 and 2 worker processes (``--model openai/NAME``), timed from submit to the
     run's completion stamp;
   and the texts compared sample by sample.
2. **429s and the fleet's limit**: two workers against ``tests/openai_server.py`` (its fake
   model) answering 20% of requests with 429 + ``Retry-After: 1``, under a policy limit of
   ``--rpm`` requests per minute: failed samples, and the most requests the server received in
   any 10 s and any 60 s.

The server: ``--server URL`` (for instance vLLM's, serving SmolLM2 as ``--served-model
smollm2``), else ``tests/openai_server.py --model-dir`` serving SmolLM2 with transformers, one
request at a time. Prints a table, writes ``bench/results/endpoint.json``::

    python -m bench.endpoint [--server http://127.0.0.1:8011/v1 --served-model smollm2]
        [--workers 1,2] [--concurrency 8] [--rpm 1200]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from bench.generate import DATA, Evalq, rows
from bench.result import save
from evalq.producer.operations.redis_server import RedisServer, free_port
from evalq.producer.operations.workers import LocalWorkers
from evalq.producer.service.client import Client
from evalq.producer.service.policy_file import PolicyFile
from evalq.producer.service.submit import SubmitRequest
from evalq.shared.access.policy import Tier
from evalq.shared.connection import connect
from evalq.shared.settings import Settings
from evalq.shared.store.runs import RunStore

console = Console(stderr=True)
REPO = Path(__file__).resolve().parents[1]
PLAIN = """
prompt: "What is {a} plus {b}? Answer with only the number."
target: answer
generate: {max_new_tokens: 8, stop: ["\\n"]}
scorer: exact_match
"""


@contextmanager
def test_server(model_dir: Path | None) -> Iterator[str]:
    """``tests/openai_server.py`` on a free port: SmolLM2 from ``model_dir``, or its fake
    model; yields its base URL."""
    port = free_port()
    command = [sys.executable, "-m", "tests.openai_server", "--port", str(port)]
    if model_dir is not None:
        command += ["--model-dir", str(model_dir)]
    process = subprocess.Popen(command, cwd=REPO)
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/stats", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the endpoint server did not start")
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        process.kill()
        process.wait(30)


@contextmanager
def stack(workers: int, url: str, limits: dict[str, Any]) -> Iterator[Evalq]:
    """A private Redis with the plain task and the arith rows registered, ``url`` listed with
    ``limits``, and ``workers`` worker processes."""
    with tempfile.TemporaryDirectory(prefix="evalq-ep-") as tmp, RedisServer(Path(tmp)) as s:
        client = Client(Settings(redis_url=s.url), admin=True)
        here = Evalq(client, RunStore(connect(s.url)))
        folder = Path(tmp) / "arith"
        folder.mkdir()
        (folder / "test.jsonl").write_text((DATA / "arith.jsonl").read_text())
        client.add_dataset("ep-arith", str(folder))
        client.set_tier("ep-arith", "test", Tier.VIEWABLE)
        client.add_task("ep-arith", PLAIN)
        client.apply_policy(PolicyFile.model_validate({"endpoints": {url: limits}}))
        env = {"OPENAI_API_KEY": "bench"}
        pool = LocalWorkers(s.url, count=workers, env=env).start(client.app)
        try:
            yield here
        finally:
            pool.stop()
            client.close()


def evalq_run(
    here: Evalq, url: str, model: str, concurrency: int, limit: int | None = None, **args: str
) -> tuple[list[Any], float]:
    """Submit the task and wait for its end: results in row order, seconds from submit to the
    completion stamp."""
    request = SubmitRequest(
        eval="ep-arith", dataset="ep-arith", split="test", limit=limit, model=f"openai/{model}",
        model_args={"base_url": url, "concurrency": str(concurrency), **args},
    )  # fmt: skip
    return here.timed(request)


def lmeval(
    url: str, model: str, tokenizer: Path, concurrency: int
) -> tuple[list[str], float, float]:
    """lm-eval's ``local-completions`` on the same prompts: texts in row order, the seconds of
    its ``generate_until`` (the requests) and of the whole ``simple_evaluate``."""
    import lm_eval
    from lm_eval.models.openai_completions import LocalCompletionsAPI
    from lm_eval.tasks import TaskManager

    args = (
        f"model={model},base_url={url}/completions,num_concurrent={concurrency},"
        f"max_retries=3,tokenized_requests=False,tokenizer_backend=huggingface,"
        f"tokenizer={tokenizer}"
    )
    manager = TaskManager(include_path=str(REPO / "bench" / "lmeval" / "tasks"))
    lm = LocalCompletionsAPI.create_from_arg_string(args)
    generate_until = lm.generate_until
    spent: list[float] = []

    def timed(*given: Any, **named: Any) -> Any:
        began = time.perf_counter()
        made = generate_until(*given, **named)
        spent.append(time.perf_counter() - began)
        return made

    lm.generate_until = timed
    cwd = Path.cwd()
    os.chdir(REPO)  # the task's data_files path is relative to the repository
    try:
        started = time.perf_counter()
        out = lm_eval.simple_evaluate(
            model=lm, tasks=["evalq_arith"], task_manager=manager, log_samples=True,
            apply_chat_template=False,
        )  # fmt: skip
        seconds = time.perf_counter() - started
    finally:
        os.chdir(cwd)
    assert out is not None
    samples = sorted(out["samples"]["evalq_arith"], key=lambda s: s["doc_id"])
    return [str(s["resps"][0][0]) for s in samples], sum(spent), seconds


def throttled(url: str, rpm: int, n: int) -> dict[str, Any]:
    """Two workers against ``url`` (the fake model) answering 20% of requests with 429."""
    httpx.post(url.removesuffix("/v1") + "/control", json={"rate_limit_share": 0.2}, timeout=10)
    with stack(2, url, {"requests_per_minute": rpm}) as here:
        rows_n = len(rows("arith"))
        results: list[Any] = []
        seconds = 0.0
        for _ in range(max(1, n // rows_n)):
            made, took = evalq_run(here, url, "fake", 8, max_retries="10")
            results += made
            seconds += took
    stats = httpx.get(url.removesuffix("/v1") + "/stats", timeout=10).json()
    arrivals = sorted(stats["arrivals"])

    def busiest(window: float) -> int:
        return max(sum(1 for t in arrivals[i:] if t < a + window) for i, a in enumerate(arrivals))

    return {
        "samples": len(results),
        "failed": sum(1 for r in results if r.error is not None),
        "requests": len(arrivals),
        "answered_429": stats["answers"].get("429", 0),
        "rpm_limit": rpm,
        "busiest_10s": busiest(10.0),
        "allowed_10s": rpm / 6,
        "busiest_60s": busiest(60.0),
        "seconds": seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default=None, help="base URL of a running server (…/v1)")
    parser.add_argument("--served-model", default="smollm2")
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rpm", type=int, default=1200)
    parser.add_argument("--throttled-samples", type=int, default=400)
    args = parser.parse_args()
    from evalq.shared.lm.local import smollm2

    model_dir = smollm2(Settings().models)
    measured: dict[str, Any] = {"server": args.server or "tests/openai_server.py (transformers)"}
    table = Table(title="endpoint: the same 200 prompts, greedy, one server")
    for column in ("side", "seconds", "samples/s", "vs lm-eval", "texts equal"):
        table.add_column(column)
    serving = nullcontext(args.server) if args.server else test_server(model_dir)
    with serving as url:
        name = args.served_model if args.server else "smollm2"
        console.print(f"[bold]lm-eval local-completions, num_concurrent={args.concurrency}[/]")
        theirs, their_s, whole_s = lmeval(url, name, model_dir, args.concurrency)
        n = len(theirs)
        table.add_row(
            "lm-eval (generate_until)", f"{their_s:.1f}", f"{n / their_s:.2f}", "1.00", "—"
        )
        table.add_row(
            "lm-eval (whole run)", f"{whole_s:.1f}", f"{n / whole_s:.2f}",
            f"{their_s / whole_s:.2f}", "—",
        )  # fmt: skip
        measured["lmeval"] = {
            "seconds": their_s, "whole_seconds": whole_s, "samples_per_s": n / their_s,
        }  # fmt: skip
        for workers in [int(w) for w in args.workers.split(",")]:
            console.print(f"[bold]evalq, {workers} worker(s)[/]")
            with stack(workers, url, {"max_concurrency": args.concurrency}) as here:
                evalq_run(here, url, name, args.concurrency, limit=8 * workers)  # warm
                results, seconds = evalq_run(here, url, name, args.concurrency)
            texts = [str(r.output) for r in results]
            same = sum(a == b for a, b in zip(texts, theirs, strict=True))
            ratio = (n / seconds) / (n / their_s)
            table.add_row(
                f"evalq, {workers} worker(s)", f"{seconds:.1f}", f"{n / seconds:.2f}",
                f"{ratio:.2f}", f"{same}/{n}",
            )  # fmt: skip
            measured[f"evalq_{workers}"] = {
                "seconds": seconds, "samples_per_s": n / seconds, "vs_lmeval": ratio,
                "texts_equal": same,
            }  # fmt: skip
    console.print(table)
    console.print("[bold]429s: two workers, 20% answered 429 + Retry-After, the fleet limited[/]")
    with test_server(None) as fake:
        limited = throttled(fake, args.rpm, args.throttled_samples)
    console.print(json.dumps(limited, indent=1))
    measured["throttled"] = limited
    save(REPO / "bench" / "results" / "endpoint.json", measured, console)


if __name__ == "__main__":
    main()
