"""Side-by-side throughput: evalq against the in-process baseline and a naive Celery reference.

For a real model (the demo's MiniLM topic eval) and a null model (answers instantly, exposing
pure queue overhead), in one process tree on one machine:

  (a) baseline: the same eval, model and batch size in a plain loop in this process;
  (b) evalq end to end (submit -> every sample scored) with 1 and with 2 worker processes;
  (c) naive: one Celery task per sample, no batching, model still warm (bench/naive.py);

plus the time to submit 100,000 samples. (a) and (b) run in rounds, each configuration once a
round, and a ratio is the median of the per-round ratios: this machine's speed drifts by 10% or
more over minutes, which would otherwise land on whichever configuration ran last. Prints a
table and writes JSON.

    python -m bench.throughput [--real-samples N] [--null-samples N] [--out PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

from celery import Celery
from rich.console import Console
from rich.table import Table

from bench.result import save
from evalq.producer.operations.demo_data import write_demo_dataset
from evalq.producer.operations.redis_server import RedisServer
from evalq.producer.operations.workers import LocalWorkers
from evalq.producer.service.submit import SubmitRequest, submit
from evalq.shared.access.policy import Tier
from evalq.shared.access.registry import DatasetRegistry
from evalq.shared.access.tiers import TierRegistry
from evalq.shared.connection import connect
from evalq.shared.data.loading import build_spec
from evalq.shared.data.spec import publish_spec
from evalq.shared.errors import ScriptError
from evalq.shared.evaluation import create, load_plugins, scrub
from evalq.shared.models import RunStatus
from evalq.shared.queue.celery_app import create_app
from evalq.shared.queue.sizing import MESSAGE_SAMPLES
from evalq.shared.settings import Settings
from evalq.shared.store.runs import RunStore
from evalq.worker.heap import keep_freed_memory
from evalq.worker.runtime_pool import resolve_device
from evalq.worker.script_pool import ScriptPool

console = Console(stderr=True)


@dataclass
class Row:
    """One measured configuration: median seconds over its rounds, and its speed relative to
    the baseline (the median of per-round ratios where it ran in rounds)."""

    model: str
    config: str
    samples: int
    seconds: float
    ratio: float
    rounds: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.samples / self.seconds


def _wait(probe: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise TimeoutError("benchmark run did not finish")
        time.sleep(0.05)


@contextmanager
def baseline_loop(
    eval_name: str, data: Path, n: int, batch: int, device: str
) -> Iterator[Callable[[], float]]:
    """A timer for the plain loop (scrub, infer in batches, score every sample) with the model
    loaded once; each call returns the seconds of one pass over ``n`` rows. This process gets
    the worker's heap settings too, so the loop is never slowed by page faults the workers
    are spared."""
    keep_freed_memory()
    evaluation = create(eval_name)
    model = evaluation.load(device)
    _, dataset = build_spec(str(data), "validation")
    rows = [dict(r) for r in dataset.select(range(n))]
    evaluation.infer(model, [scrub(r, evaluation.label_fields) for r in rows[:batch]])

    scripts = None if evaluation.scorer is None else ScriptPool(evaluation.scorer, 1)

    def run() -> float:
        started = time.perf_counter()
        for i in range(0, n, batch):
            chunk = rows[i : i + batch]
            outputs = evaluation.infer(model, [scrub(r, evaluation.label_fields) for r in chunk])
            if scripts is None:
                for row, output in zip(chunk, outputs, strict=True):
                    evaluation.score(row, output)
            else:  # a script scorer, warm, as a worker process runs it
                pairs = zip(chunk, outputs, strict=True)
                answers = scripts.map([evaluation.script_call(r, o) for r, o in pairs])
                for answer in answers:
                    if isinstance(answer, ScriptError):
                        raise answer
                    evaluation.script_score(answer)
        return time.perf_counter() - started

    try:
        yield run
    finally:
        if scripts is not None:
            scripts.close()


def side_by_side(timers: Mapping[str, Callable[[], float]], repeat: int) -> dict[str, list[float]]:
    """Seconds of every timer, run in rounds (each timer once per round, ``repeat`` rounds), so
    a change in the machine's speed during the benchmark reaches every configuration alike."""
    seconds: dict[str, list[float]] = {name: [] for name in timers}
    for _ in range(repeat):
        for name, timer in timers.items():
            seconds[name].append(timer())
    return seconds


def round_ratio(base: list[float], other: list[float]) -> float:
    """Median over rounds of ``other``'s speed relative to the baseline in the same round."""
    return statistics.median(b / o for b, o in zip(base, other, strict=True))


BASELINE = "in-process baseline"


def measure(  # noqa: PLR0913 - one benchmark's whole configuration, every knob named
    model: str,
    eval_name: str,
    data: Path,
    *,
    n: int,
    batch: int,
    device: str,
    repeat: int,
    worker_counts: Sequence[int],
    env: Mapping[str, str] | None = None,
) -> list[Row]:
    """The baseline and evalq with each worker count, side by side in ``repeat`` rounds."""
    with baseline_loop(eval_name, data, n, batch, device) as loop:
        timers: dict[str, Callable[[], float]] = {BASELINE: loop}
        for count in worker_counts:
            timers[f"evalq, {count} worker(s)"] = partial(
                evalq_run, eval_name, data, n=n, workers=count, batch=batch, env=env
            )
        seconds = side_by_side(timers, repeat)
    base = seconds[BASELINE]
    return [
        Row(model, name, n, statistics.median(runs), round_ratio(base, runs), runs)
        for name, runs in seconds.items()
    ]


@contextmanager
def _redis() -> Iterator[RedisServer]:
    with tempfile.TemporaryDirectory(prefix="evalq-bench-") as tmp, RedisServer(Path(tmp)) as s:
        yield s


def evalq_run(
    eval_name: str,
    data: Path,
    *,
    n: int,
    workers: int,
    batch: int,
    env: Mapping[str, str] | None = None,
) -> float:
    """Seconds from submit to the last score of ``n`` samples, on a fresh Redis with
    ``workers`` worker processes (each with ``env`` added to its environment), warmed up
    first."""
    with _redis() as server:
        settings = Settings(redis_url=server.url, max_batch=batch)
        app = create_app(settings)
        client = connect(server.url)
        runs = RunStore(client)
        DatasetRegistry(client).add("bench", str(data), who="bench")
        TierRegistry(client).set("bench", "validation", Tier.VIEWABLE, who="bench")
        extra = {"EVALQ_MAX_BATCH": str(batch), **(env or {})}
        pool = LocalWorkers(server.url, count=workers, env=extra).start(app)
        try:

            def run(limit: int) -> float:
                started = time.perf_counter()
                meta = submit(
                    client,
                    app,
                    SubmitRequest(eval=eval_name, dataset="bench", split="validation", limit=limit),
                    principal="bench",
                    archive=Settings().archive_url,
                )
                _wait(lambda: runs.get(meta.run_id).status is RunStatus.COMPLETED, 600)
                return time.perf_counter() - started

            run(batch * workers * 4)  # warm-up: every worker loads its model
            return run(n)
        finally:
            pool.stop()
            client.close()


def naive_run(eval_name: str, data: Path, n: int) -> float:
    """Seconds for one hand-written Celery task per sample (bench/naive.py), one worker."""
    with _redis() as server:
        env = {**os.environ, "EVALQ_REDIS_URL": server.url}
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "bench.naive", "worker",
             "--concurrency=1", "--pool=prefork", "--loglevel=WARNING"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        client = connect(server.url)
        try:
            app = Celery("naive", broker=server.url, set_as_current=False)
            app.conf.update(task_serializer="json", accept_content=["json"])
            fingerprint = publish_spec(client, build_spec(str(data), "validation")[0])

            def run(run_id: str, count: int) -> float:
                started = time.perf_counter()
                for i in range(count):  # what a user writes: one .delay() per sample
                    app.send_task("naive.evaluate", args=[run_id, eval_name, fingerprint, i])
                _wait(lambda: int(client.get(f"naive:{run_id}:done") or 0) >= count, 900)
                return time.perf_counter() - started

            run("warm", 32)
            return run("timed", n)
        finally:
            worker.terminate()
            worker.wait(30)
            client.close()


def submit_time(data: Path, n: int) -> float:
    """Seconds for ``submit`` of ``n`` null-model samples (no worker consuming)."""
    with _redis() as server:
        client = connect(server.url)
        app = create_app(Settings(redis_url=server.url))
        build_spec(str(data), "validation")  # datasets' Arrow cache is warm, as for a user
        DatasetRegistry(client).add("bench", str(data), who="bench")
        TierRegistry(client).set("bench", "validation", Tier.VIEWABLE, who="bench")
        request = SubmitRequest(eval="null", dataset="bench", split="validation", limit=n)
        started = time.perf_counter()
        submit(client, app, request, principal="bench", archive=str(data / "archive"))
        seconds = time.perf_counter() - started
        client.close()
        return seconds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--real-samples", type=int, default=10000)
    parser.add_argument("--null-samples", type=int, default=20000)
    parser.add_argument("--naive-null-samples", type=int, default=5000)
    parser.add_argument("--naive-real-samples", type=int, default=1000)
    parser.add_argument("--submit-samples", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3, help="rounds (each config once a round)")
    parser.add_argument("--skip-naive-real", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("bench/results/throughput.json"))
    args = parser.parse_args(argv)

    load_plugins([])
    device = resolve_device("auto")
    largest = max(args.real_samples, args.null_samples, args.submit_samples)
    data = write_demo_dataset(Path(tempfile.mkdtemp(prefix="evalq-bench-data-")), largest)
    rows: list[Row] = []
    for model, eval_name, n, naive_n in (
        ("null", "null", args.null_samples, args.naive_null_samples),
        (
            "MiniLM",
            "topic",
            args.real_samples,
            0 if args.skip_naive_real else args.naive_real_samples,
        ),
    ):
        console.print(f"[bold]{model}[/]: baseline and evalq, {args.repeat} rounds")
        measured = measure(
            model, eval_name, data, n=n, batch=args.batch, device=device, repeat=args.repeat,
            worker_counts=(1, 2),
        )  # fmt: skip
        rows += measured
        if naive_n:
            console.print(f"[bold]{model}[/]: naive")
            seconds = naive_run(eval_name, data, naive_n)
            ratio = (naive_n / seconds) / measured[0].rate
            rows.append(Row(model, "naive: 1 task/sample", naive_n, seconds, ratio, [seconds]))
    console.print(f"submit of {args.submit_samples} samples")
    submit_seconds = submit_time(data, args.submit_samples)

    title = f"evalq throughput ({os.cpu_count()} cores, {device}, {args.repeat} rounds, medians)"
    table = Table(title=title)
    for column in ("model", "configuration", "samples", "samples/s", "ratio to baseline"):
        table.add_column(column, justify="right" if column != "configuration" else "left")
    for row in rows:
        table.add_row(
            row.model, row.config, str(row.samples), f"{row.rate:,.0f}", f"{row.ratio:.2f}"
        )
    Console().print(table)
    Console().print(f"submit {args.submit_samples:,} samples: {submit_seconds:.2f} s")
    result = {
        "machine": {"cores": os.cpu_count(), "device": device, "python": sys.version},
        "batch": args.batch,
        "repeat": args.repeat,
        "message_samples": MESSAGE_SAMPLES,
        "rows": [{**asdict(r), "samples_per_s": r.rate} for r in rows],
        "submit": {"samples": args.submit_samples, "seconds": submit_seconds},
    }
    save(args.out, result, Console())


if __name__ == "__main__":
    main()
