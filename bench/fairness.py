"""Fair share: a small run's latency while a big run holds the workers, the rate the workers
keep while shared, and how two principals split them, side by side in one run.

For each worker count (one and two worker processes, the demo's MiniLM ``topic`` model), on a
fresh Redis with the workers warm:

  (a) idle: ``--smalls`` runs of ``--small`` samples, one after another, on idle workers;
  (b) alone: one run of ``--big`` samples, nothing else, and the rate it settles samples from
      5% to 90% of it;
  (c) shared: the same big run, and once 5% of it is settled the small runs again, one after
      another, while it goes (another caller's); and the rate samples settled (both runs) over
      that overlap;
  (c') same caller: (c) with the small runs by the big run's own caller, on the same model
      (they interleave with it within its turn);
  (d) FIFO: the same, with every message of every run handed to the broker at submit (what
      evalq did before the dispatcher), for ``--fifo-smalls`` small runs;
  (e) principals: principal ``a`` submits two runs of ``--share-big`` samples and ``b`` one;
      each principal's share of the samples settled while both have work.

A small run's latency is from just before ``submit`` to the moment its finalizer stamped it
completed. Prints a table and writes JSON.

    python -m bench.fairness [--big N] [--small N] [--smalls K] [--workers 1,2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import redis
from celery import Celery
from rich.console import Console
from rich.table import Table

from bench.result import save
from bench.waiting import completed, wait
from evalq.producer.operations.demo_data import write_demo_dataset
from evalq.producer.operations.redis_server import RedisServer
from evalq.producer.operations.workers import LocalWorkers
from evalq.producer.service.submit import SubmitRequest, submit
from evalq.shared.access.policy import Tier
from evalq.shared.access.registry import DatasetRegistry
from evalq.shared.access.tiers import TierRegistry
from evalq.shared.connection import connect
from evalq.shared.evaluation import load_plugins
from evalq.shared.models import RunMeta
from evalq.shared.queue.backlog import Backlog
from evalq.shared.queue.celery_app import INFER_QUEUE, create_app
from evalq.shared.settings import Settings
from evalq.shared.store.reader import ResultReader
from evalq.shared.store.runs import RunStore
from evalq.worker.runtime_pool import resolve_device

console = Console(stderr=True)

EVAL = "topic"


@dataclass
class Bench:
    """A fresh Redis, warm workers, and what a producer needs to submit and watch runs."""

    client: redis.Redis
    app: Celery
    runs: RunStore
    results: ResultReader
    fifo: bool = False

    def submit(self, samples: int, principal: str = "bench") -> RunMeta:
        request = SubmitRequest(eval=EVAL, dataset="bench", split="validation", limit=samples)
        meta = submit(
            self.client, self.app, request, principal=principal, archive=Settings().archive_url
        )
        if self.fifo:
            # as before the dispatcher: every message to the broker at submit, behind all that
            # is queued (submit put the run's first message at the queue's head: back it goes)
            Backlog(self.client).dispatch(INFER_QUEUE, 10**9)
            self.client.lmove(INFER_QUEUE, INFER_QUEUE, "RIGHT", "LEFT")
        return meta

    def done(self, run_id: str) -> int:
        return self.results.progress(run_id).done

    def completed(self, meta: RunMeta) -> RunMeta:
        return completed(self.runs, meta)

    def small_latency(self, samples: int, principal: str = "loop") -> float:
        """Seconds from just before submit to the small run's completion stamp."""
        started = time.time()
        final = self.completed(self.submit(samples, principal=principal))
        assert final.finished is not None
        return final.finished - started


@contextmanager
def bench_stack(data: Path, workers: int) -> Iterator[Bench]:
    """A fresh Redis with the bench dataset registered and ``workers`` warm worker processes."""
    with tempfile.TemporaryDirectory(prefix="evalq-fair-") as tmp, RedisServer(Path(tmp)) as s:
        client = connect(s.url)
        app = create_app(Settings(redis_url=s.url))
        DatasetRegistry(client).add("bench", str(data), who="bench")
        TierRegistry(client).set("bench", "validation", Tier.VIEWABLE, who="bench")
        pool = LocalWorkers(s.url, count=workers).start(app)
        bench = Bench(client, app, RunStore(client), ResultReader(client))
        try:
            bench.completed(bench.submit(64 * workers * 4))  # every worker loads its model
            yield bench
        finally:
            pool.stop()
            client.close()


def rate_alone(bench: Bench, big: int) -> float:
    """Samples/s one big run settles on its own, from 5% to 90% of it (the steady state, as
    the shared window below is)."""
    meta = bench.submit(big)
    wait(lambda: bench.done(meta.run_id) >= big // 20)
    start, before = time.time(), bench.done(meta.run_id)
    wait(lambda: bench.done(meta.run_id) >= big * 9 // 10)
    end, after = time.time(), bench.done(meta.run_id)
    bench.completed(meta)
    return (after - before) / (end - start)


@dataclass
class Shared:
    """Small runs during a big one: their latencies and the overlap's settled rate."""

    latencies: list[float]
    rate: float
    big_left: int
    """Samples of the big run not settled when the last small run completed."""


def shared(bench: Bench, big: int, small: int, smalls: int, principal: str = "loop") -> Shared:
    """The big run (by ``bench``), and ``smalls`` small runs by ``principal`` one after another
    once it is under way."""
    meta = bench.submit(big)
    wait(lambda: bench.done(meta.run_id) >= big // 20)
    start, before = time.time(), bench.done(meta.run_id)
    latencies = [bench.small_latency(small, principal) for _ in range(smalls)]
    end, after = time.time(), bench.done(meta.run_id)
    bench.completed(meta)
    return Shared(latencies, (after - before + small * smalls) / (end - start), big - after)


def principals(bench: Bench, samples: int) -> dict[str, float]:
    """Each principal's share of the samples settled while both have work: ``a`` submits two
    runs, ``b`` one, all of ``samples``; from the moment both have progress to the moment one
    of them has none left."""
    metas = {"a": [bench.submit(samples, "a"), bench.submit(samples, "a")]}
    metas["b"] = [bench.submit(samples, "b")]

    def done() -> dict[str, int]:
        return {p: sum(bench.done(m.run_id) for m in ms) for p, ms in metas.items()}

    def total(principal: str) -> int:
        return sum(m.n for m in metas[principal])

    wait(lambda: all(v > 0 for v in done().values()))
    first = done()
    wait(lambda: any(v >= total(p) for p, v in done().items()))
    last = done()
    for meta in [m for ms in metas.values() for m in ms]:
        bench.completed(meta)
    settled = sum(last[p] - first[p] for p in metas)
    return {p: (last[p] - first[p]) / settled for p in metas}


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, round(0.95 * len(ordered)) - 1)]


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} / {p95(values):.2f}"


@dataclass
class Measured:
    """Everything measured with one worker count."""

    workers: int
    idle: list[float]
    alone_rate: float
    fair: Shared
    same: Shared
    fifo: Shared
    principals: dict[str, float]

    def rows(self) -> list[tuple[str, str, str]]:
        fair, fifo, alone = self.fair, self.fifo, self.alone_rate
        return [
            ("small run on idle workers, p50 / p95 s", _spread(self.idle), ""),
            ("small run during the big run, p50 / p95 s", _spread(fair.latencies),
             _spread(fifo.latencies)),
            ("same caller's small run during it, p50 / p95 s", _spread(self.same.latencies), ""),
            ("big run alone, samples/s", f"{alone:.0f}", ""),
            ("big + small shared, samples/s (ratio to alone)",
             f"{fair.rate:.0f} ({fair.rate / alone:.2f})",
             f"{fifo.rate:.0f} ({fifo.rate / alone:.2f})"),
            ("principal a (2 runs) / b (1 run), share of samples",
             f"{self.principals['a']:.0%} / {self.principals['b']:.0%}", ""),
        ]  # fmt: skip


def measure(data: Path, workers: int, args: argparse.Namespace) -> Measured:
    """Every measurement with ``workers`` worker processes, on one fresh stack."""
    with bench_stack(data, workers) as bench:
        idle = [bench.small_latency(args.small) for _ in range(args.smalls)]
        alone = rate_alone(bench, args.big)
        fair = shared(bench, args.big, args.small, args.smalls)
        same = shared(bench, args.big, args.small, args.smalls, principal="bench")
        split = principals(bench, args.share_big)
        bench.fifo = True
        fifo = shared(bench, args.big, args.small, args.fifo_smalls)
    return Measured(workers, idle, alone, fair, same, fifo, split)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--big", type=int, default=20_000)
    parser.add_argument("--small", type=int, default=20)
    parser.add_argument("--smalls", type=int, default=20)
    parser.add_argument("--fifo-smalls", type=int, default=2)
    parser.add_argument("--share-big", type=int, default=4000)
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--out", type=Path, default=Path("bench/results/fairness.json"))
    args = parser.parse_args(argv)

    load_plugins([])
    data = write_demo_dataset(Path(tempfile.mkdtemp(prefix="evalq-fair-data-")), args.big)
    found: list[Measured] = []
    for workers in [int(w) for w in args.workers.split(",")]:
        console.print(f"[bold]{workers} worker(s)[/]")
        found.append(measure(data, workers, args))

    device = resolve_device("auto")
    table = Table(title=f"evalq fair share ({os.cpu_count()} cores, {device}, MiniLM)")
    for column in ("workers", "measure", "fair", "FIFO (before)"):
        table.add_column(column, justify="left" if column == "measure" else "right")
    for measured in found:
        for row in measured.rows():
            table.add_row(str(measured.workers), *row)
    Console().print(table)
    result = {
        "machine": {"cores": os.cpu_count(), "device": device, "python": sys.version},
        "args": {k: str(v) for k, v in vars(args).items()},
        "measured": [asdict(m) for m in found],
    }
    save(args.out, result, Console())


if __name__ == "__main__":
    main()
