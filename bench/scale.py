"""A million samples a run: what one run of the null model costs end to end and in Redis.

For 1 and for 2 worker processes, each on a fresh Redis (AOF on, ``appendfsync always``, as
evalq runs it), with a one-field dataset of ``--samples`` rows:

  * ``evalq submit`` through the CLI: seconds and peak RSS;
  * end to end: submit to completed, samples/s (and from the end of submit);
  * CPU per sample from submit to completed: Redis's (``INFO cpu``, user + system, main
    process) and the workers' (every process of each worker's tree, from ``/proc`` through
    psutil), in µs, and Redis's busiest commands (``INFO commandstats``, with ``--commands``);
  * Redis ``used_memory``: before the run, its peak while the run goes (sampled every 0.1 s),
    and once the run is archived (the run's own share = that minus before);
  * the AOF's size on disk once archived, and after a rewrite (``BGREWRITEAOF``, which Redis
    runs by itself once the file has doubled);
  * ``evalq results`` (jsonl to /dev/null, parquet to a file) and ``evalq report``: seconds
    and peak RSS, each a process of its own, reading the archived run.

    python -m bench.scale [--samples N] [--workers 1,2] [--commands] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil
import redis
from rich.console import Console
from rich.table import Table

from bench.result import save
from evalq.producer.operations.redis_server import RedisServer
from evalq.producer.operations.workers import LocalWorkers
from evalq.shared.access.policy import Tier
from evalq.shared.access.registry import DatasetRegistry
from evalq.shared.access.tiers import TierRegistry
from evalq.shared.connection import connect
from evalq.shared.keys import RunKeys
from evalq.shared.queue.celery_app import create_app
from evalq.shared.settings import Settings

console = Console(stderr=True)

REPO = Path(__file__).resolve().parent.parent
SMALL = 20_000
"""The run a million-sample run's samples/s is compared with."""


@dataclass
class Measured:
    workers: int
    samples: int
    small_rate: float
    """Samples/s end to end of a 20,000-sample run on the same workers, just before."""
    submit_s: float
    submit_rss_mb: float
    end_to_end_s: float
    after_submit_s: float
    redis_before_mb: float
    redis_peak_mb: float
    redis_final_mb: float
    aof_mb: float
    aof_rewritten_mb: float
    results_jsonl_s: float
    results_jsonl_rss_mb: float
    results_parquet_s: float
    results_parquet_rss_mb: float
    report_s: float
    report_rss_mb: float
    redis_cpu_us: float
    """Redis's CPU (user + system) per sample from submit to completed."""
    worker_cpu_us: float
    """The workers' CPU (every process of their trees) per sample, same span."""
    commands: dict[str, float]
    """Redis's µs per sample by command (``INFO commandstats``), the busiest first."""

    @property
    def rate(self) -> float:
        return self.samples / self.end_to_end_s


def write_dataset(folder: Path, n: int) -> Path:
    """``n`` rows of one integer field (and its label) as jsonl."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "validation.jsonl"
    with path.open("w", encoding="utf-8") as handle:
        for i in range(n):
            handle.write(f'{{"x":{i},"label":{i % 2}}}\n')
    return folder


def timed(
    args: list[str], env: dict[str, str], stdout: int | None = None
) -> tuple[float, float, str]:
    """Run ``evalq ARGS``; (seconds, peak RSS in MB, stdout) — RSS from the child's rusage."""
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-c", "from evalq.shared.cli import main; main()", *args],
        env=env, cwd=REPO, stdout=stdout if stdout is not None else subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    out = ""
    if stdout is None and process.stdout is not None:
        out = process.stdout.read()
    assert process.stderr is not None
    errors = process.stderr.read()
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise RuntimeError(f"evalq {' '.join(args)} failed: {errors.strip()[-500:]}")
    return seconds, usage.ru_maxrss / 1024, out


class Sampler:
    """Redis ``used_memory`` sampled in a thread: the highest seen."""

    def __init__(self, url: str) -> None:
        self._client = connect(url)
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, int(self._client.info("memory")["used_memory"]))
            self._stop.wait(0.1)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def _wait(probe: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} after {timeout}s")
        time.sleep(0.05)


def _redis_cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _tree_cpu(pids: list[int]) -> float:
    """CPU seconds (user + system) of the processes ``pids`` and their live descendants."""
    total = 0.0
    for pid in pids:
        try:
            root = psutil.Process(pid)
            for process in [root, *root.children(recursive=True)]:
                times = process.cpu_times()
                total += times.user + times.system
        except psutil.NoSuchProcess:
            continue
    return total


def _command_us(client: redis.Redis) -> dict[str, float]:
    """Redis's µs spent per command so far (``INFO commandstats``)."""
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): float(v["usec"]) for name, v in stats.items()}


class Costs:
    """CPU per sample of Redis and of the workers over a ``with`` block, and Redis's µs per
    sample by command (those over 0.05 µs, the busiest first)."""

    def __init__(self, client: redis.Redis, workers: LocalWorkers, samples: int) -> None:
        self._client = client
        self._pids = [p.pid for p in workers.processes]
        self._samples = samples
        self.redis_us = self.workers_us = 0.0
        self.commands: dict[str, float] = {}

    def __enter__(self) -> Costs:
        self._start = (_redis_cpu(self._client), _tree_cpu(self._pids), _command_us(self._client))
        return self

    def __exit__(self, *_: object) -> None:
        redis_cpu, workers_cpu, before = self._start
        per = 1e6 / self._samples
        self.redis_us = (_redis_cpu(self._client) - redis_cpu) * per
        self.workers_us = (_tree_cpu(self._pids) - workers_cpu) * per
        spent = {
            name: (us - before.get(name, 0.0)) / self._samples
            for name, us in _command_us(self._client).items()
        }
        busiest = sorted(spent.items(), key=lambda kv: -kv[1])
        self.commands = {name: us for name, us in busiest if us > 0.05}


def _aof_bytes(server: RedisServer) -> int:
    return sum(p.stat().st_size for p in server.data_dir.rglob("*.aof*") if p.is_file())


def _freed(client: redis.Redis) -> bool:
    """UNLINK frees in a background thread: nothing left pending."""
    return int(client.info("memory").get("lazyfree_pending_objects", 0)) == 0


def _rewritten(client: redis.Redis) -> bool:
    info = client.info("persistence")
    return not info["aof_rewrite_in_progress"] and not info["aof_rewrite_scheduled"]


def _mb(value: float) -> float:
    return value / 1e6


def measure(data: Path, samples: int, workers: int, root: Path, batch: int) -> Measured:
    server = RedisServer(root / f"redis-{workers}", appendonly=True).start()
    try:
        archive = root / f"archive-{workers}"
        settings = Settings(redis_url=server.url, archive_url=str(archive))
        client = connect(server.url)
        DatasetRegistry(client).add("scale", str(data), who="bench")
        TierRegistry(client).set("scale", "validation", Tier.VIEWABLE, who="bench")
        env = {
            **os.environ, "EVALQ_REDIS_URL": server.url, "EVALQ_ARCHIVE_URL": str(archive),
            "PYTHONPATH": str(REPO), "COLUMNS": "200",
        }  # fmt: skip
        env.pop("EVALQ_API_URL", None)
        pool = LocalWorkers(
            server.url,
            count=workers,
            env={
                "EVALQ_ARCHIVE_URL": str(archive),
                "EVALQ_TASK_EVENTS": "false",
                "EVALQ_MAX_BATCH": str(batch),
            },
        ).start(create_app(settings))
        try:
            warm = ["submit", "null", "--dataset", "scale", "--split", "validation", "--limit"]

            def run(n: int) -> tuple[float, float, str, float]:
                """Submit ``n`` samples: (submit s, its peak RSS MB, run id, s to completed)."""
                started = time.perf_counter()
                submit_s, submit_rss, shown = timed([*warm, str(n), "--json"], env)
                run_id = json.loads(shown)["run_id"]
                _wait(
                    lambda: client.hget(RunKeys(run_id).meta, "status") == "completed",
                    3600, "completion",
                )  # fmt: skip
                return submit_s, submit_rss, run_id, time.perf_counter() - started

            warm_id = run(2048)[2]
            _wait(lambda: client.hget(RunKeys(warm_id).meta, "archived"), 120, "warm-up archive")
            _, _, small_id, small_s = run(SMALL)
            _wait(lambda: client.hget(RunKeys(small_id).meta, "archived"), 120, "small archive")
            _wait(lambda: _freed(client), 120, "Redis to free the small run's keys")
            before = int(client.info("memory")["used_memory"])
            with Sampler(server.url) as sampler, Costs(client, pool, samples) as costs:
                submit_s, submit_rss, run_id, end_to_end = run(samples)
            with Sampler(server.url) as archiving:
                _wait(lambda: client.hget(RunKeys(run_id).meta, "archived"), 600, "archive")
            sampler.peak = max(sampler.peak, archiving.peak)
            _wait(lambda: _freed(client), 120, "Redis to free the unlinked keys")
            final = int(client.info("memory")["used_memory"])
            aof = _aof_bytes(server)
            client.bgrewriteaof()  # what Redis does by itself once the AOF has doubled
            _wait(lambda: _rewritten(client), 120, "the AOF rewrite")
            aof_rewritten = _aof_bytes(server)
        finally:
            pool.stop()
        jsonl_s, jsonl_rss, _ = timed(
            ["results", run_id, "--format", "jsonl"], env, stdout=subprocess.DEVNULL
        )
        parquet_s, parquet_rss, _ = timed(
            ["results", run_id, "--format", "parquet", "--out", str(root / "r.parquet")], env
        )
        report_s, report_rss, _ = timed(["report", run_id, "--out", str(root / "r.html")], env)
        client.close()
        return Measured(
            workers, samples, SMALL / small_s, submit_s, submit_rss, end_to_end,
            end_to_end - submit_s,
            _mb(before), _mb(sampler.peak), _mb(final), _mb(aof), _mb(aof_rewritten),
            jsonl_s, jsonl_rss, parquet_s, parquet_rss, report_s, report_rss,
            costs.redis_us, costs.workers_us, costs.commands,
        )  # fmt: skip
    finally:
        server.stop()


def table(rows: list[Measured]) -> Table:
    shown = Table(title=f"{rows[0].samples:,} samples of the null model, one run")
    shown.add_column("what")
    for row in rows:
        shown.add_column(f"{row.workers} worker{'s' if row.workers > 1 else ''}", justify="right")

    def pair(seconds: float, rss: float) -> str:
        return f"{seconds:.1f} / {rss:.0f}"

    lines: list[tuple[str, Callable[[Measured], str]]] = [
        ("submit (CLI): s / peak RSS MB", lambda m: pair(m.submit_s, m.submit_rss_mb)),
        ("end to end: s (samples/s)", lambda m: f"{m.end_to_end_s:.1f} ({m.rate:,.0f})"),
        (f"a {SMALL:,}-sample run: samples/s", lambda m: f"{m.small_rate:,.0f}"),
        ("after submit: s", lambda m: f"{m.after_submit_s:.1f}"),
        ("Redis CPU per sample: µs", lambda m: f"{m.redis_cpu_us:.1f}"),
        ("workers' CPU per sample: µs", lambda m: f"{m.worker_cpu_us:.1f}"),
        ("Redis used_memory before: MB", lambda m: f"{m.redis_before_mb:.1f}"),
        ("Redis used_memory peak: MB", lambda m: f"{m.redis_peak_mb:.1f}"),
        ("Redis used_memory archived: MB", lambda m: f"{m.redis_final_mb:.1f}"),
        ("  the run's own: MB", lambda m: f"{m.redis_final_mb - m.redis_before_mb:.2f}"),
        ("AOF on disk: MB", lambda m: f"{m.aof_mb:.0f}"),
        ("AOF after BGREWRITEAOF: MB", lambda m: f"{m.aof_rewritten_mb:.1f}"),
        (
            "results jsonl: s / peak RSS MB",
            lambda m: pair(m.results_jsonl_s, m.results_jsonl_rss_mb),
        ),
        (
            "results parquet: s / RSS MB",
            lambda m: pair(m.results_parquet_s, m.results_parquet_rss_mb),
        ),
        ("report: s / peak RSS MB", lambda m: pair(m.report_s, m.report_rss_mb)),
    ]
    for name, cell in lines:
        shown.add_row(name, *(cell(row) for row in rows))
    return shown


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--batch", type=int, default=64, help="EVALQ_MAX_BATCH of the workers")
    parser.add_argument(
        "--commands", action="store_true", help="also print Redis's µs per sample by command"
    )
    parser.add_argument("--out", type=Path, default=Path("bench/scale.json"))
    args = parser.parse_args(argv)
    rows: list[Measured] = []
    with tempfile.TemporaryDirectory(prefix="evalq-scale-") as tmp:
        root = Path(tmp)
        data = write_dataset(root / "data", args.samples)
        for count in (int(w) for w in args.workers.split(",")):
            console.print(f"[bold]{count} worker(s)[/]: {args.samples:,} samples")
            rows.append(measure(data, args.samples, count, root, args.batch))
            console.print(table(rows))
    Console().print(table(rows))
    if args.commands:
        for row in rows:
            busiest = ", ".join(f"{k} {v:.1f}" for k, v in list(row.commands.items())[:12])
            Console().print(f"{row.workers} worker(s), Redis µs per sample by command: {busiest}")
    save(args.out, [asdict(r) | {"samples_per_s": r.rate} for r in rows], console)


if __name__ == "__main__":
    main()
