"""Fair share of the scorers: the compose topology (one inference-only and one scoring-only
``evalq worker``), with scoring the bottleneck.

On a fresh Redis, with the tests' evaluations (``EVALQ_PLUGINS=tests.plugins``: ``spy``,
whose model answers at once, and ``slow_score``, the spy with a scorer of ``--score-ms``
milliseconds a sample):

  (a) throughput: one ``null`` run of ``--null`` samples (nothing to wait on but evalq: what
      staging scoring costs an inference-only worker), samples/s from submit to completion;
  (b) a ``--small``-sample ``slow_score`` run of another principal on idle workers, and while a
      ``--big``-sample one goes (submitted once three quarters of the big run are inferred,
      one after another while a quarter of the big run is left unscored);
  (c) the same with ``rescore``: a ``--small-rescore``-sample rescore on idle workers, and
      started right after a ``--big``-sample one.

A small run's latency is from just before ``submit`` (or ``rescore``) to the moment its
finalizer stamped it completed; with each, the big run's settled samples at that moment.
Prints a table and writes JSON.

    python -m bench.score_fairness [--big N] [--small N] [--smalls K] [--score-ms MS]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis
from celery import Celery
from rich.console import Console
from rich.table import Table

from bench.result import save
from bench.waiting import completed, wait
from evalq.producer.operations.redis_server import RedisServer
from evalq.producer.operations.workers import LocalWorkers
from evalq.producer.service.rescore import rescore
from evalq.producer.service.submit import SubmitRequest, submit
from evalq.shared.access.policy import Tier
from evalq.shared.access.registry import DatasetRegistry
from evalq.shared.access.tiers import TierRegistry
from evalq.shared.connection import connect
from evalq.shared.evaluation import load_plugins
from evalq.shared.models import RunMeta
from evalq.shared.queue.celery_app import create_app
from evalq.shared.settings import Settings
from evalq.shared.store.reader import ResultReader
from evalq.shared.store.runs import RunStore

console = Console(stderr=True)

PLUGINS = "tests.plugins"


@dataclass
class Bench:
    """A fresh Redis, an inference-only and a scoring-only worker, and a producer's handles."""

    client: redis.Redis
    app: Celery
    score_ms: float

    def submit(self, eval_name: str, samples: int, principal: str) -> RunMeta:
        params = {"score_ms": str(self.score_ms)} if eval_name == "slow_score" else {}
        request = SubmitRequest(
            eval=eval_name, dataset="bench", split="validation", limit=samples, params=params
        )
        return submit(
            self.client, self.app, request, principal=principal, archive=Settings().archive_url
        )

    def rescore(self, source: RunMeta, principal: str) -> RunMeta:
        params = {"score_ms": str(self.score_ms)}
        return rescore(
            self.client, self.app, source.run_id, "slow_score", params, principal=principal,
            archive=Settings().archive_url,
        )  # fmt: skip

    def progress(self, meta: RunMeta) -> tuple[int, int]:
        """(inferred, settled) samples of the run."""
        found = ResultReader(self.client).progress(meta.run_id)
        return found.inferred, found.done

    def completed(self, meta: RunMeta) -> RunMeta:
        return completed(RunStore(self.client), meta)

    def latency(self, start: Callable[[], RunMeta]) -> float:
        """Seconds from just before ``start`` to the completion stamp of the run it starts."""
        started = time.time()
        final = self.completed(start())
        assert final.finished is not None
        return final.finished - started


@contextmanager
def bench_stack(data: Path, score_ms: float) -> Iterator[Bench]:
    with tempfile.TemporaryDirectory(prefix="evalq-sfair-") as tmp, RedisServer(Path(tmp)) as s:
        client = connect(s.url)
        app = create_app(Settings(redis_url=s.url))
        DatasetRegistry(client).add("bench", str(data), who="bench")
        TierRegistry(client).set("bench", "validation", Tier.VIEWABLE, who="bench")
        env = {"EVALQ_PLUGINS": PLUGINS}
        workers = [
            LocalWorkers(s.url, queues=queues, env=env).start(app) for queues in ("infer", "score")
        ]
        bench = Bench(client, app, score_ms)
        try:
            bench.completed(bench.submit("spy", 256, "warm"))  # both workers load what they need
            yield bench
        finally:
            for pool in workers:
                pool.stop()
            client.close()


def _write_rows(folder: Path, n: int) -> Path:
    lines = [json.dumps({"text": f"sample {i} of the bench", "label": i % 3}) for i in range(n)]
    (folder / "validation.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


@dataclass
class During:
    """Small runs while a big one goes: their latencies and the big run's settled samples as
    each completed."""

    latencies: list[float]
    big_settled: list[int]


def runs_during(bench: Bench, args: argparse.Namespace) -> During:
    big = bench.submit("slow_score", args.big, "sweep")
    wait(lambda: bench.progress(big)[0] >= args.big * 3 // 4)
    found = During([], [])
    while not found.latencies or bench.progress(big)[1] < args.big * 3 // 4:
        found.latencies.append(
            bench.latency(lambda: bench.submit("slow_score", args.small, "loop"))
        )
        found.big_settled.append(bench.progress(big)[1])
        if len(found.latencies) >= args.smalls:
            break
    bench.completed(big)
    return found


def rescore_during(bench: Bench, args: argparse.Namespace) -> tuple[float, During]:
    sources = [
        bench.submit("spy", args.big, "sweep"),
        bench.submit("spy", args.small_rescore, "loop"),
    ]
    for meta in sources:
        bench.completed(meta)
    alone = bench.latency(lambda: bench.rescore(sources[1], "loop"))
    big = bench.rescore(sources[0], "sweep")
    latency = bench.latency(lambda: bench.rescore(sources[1], "loop"))
    during = During([latency], [bench.progress(big)[1]])
    bench.completed(big)
    return alone, during


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--big", type=int, default=4000)
    parser.add_argument("--small", type=int, default=20)
    parser.add_argument("--smalls", type=int, default=5)
    parser.add_argument("--small-rescore", type=int, default=64)
    parser.add_argument("--score-ms", type=float, default=5.0)
    parser.add_argument("--null", type=int, default=20_000)
    parser.add_argument("--out", type=Path, default=Path("bench/results/score_fairness.json"))
    args = parser.parse_args(argv)

    load_plugins([PLUGINS])
    data = _write_rows(Path(tempfile.mkdtemp(prefix="evalq-sfair-data-")), max(args.big, args.null))
    with bench_stack(data, args.score_ms) as bench:
        started = time.time()
        final = bench.completed(bench.submit("null", args.null, "bench"))
        assert final.finished is not None
        rate = args.null / (final.finished - started)
        idle = [
            bench.latency(lambda: bench.submit("slow_score", args.small, "loop"))
            for _ in range(args.smalls)
        ]
        during = runs_during(bench, args)
        rescore_alone, rescored = rescore_during(bench, args)

    table = Table(title=f"evalq scoring fair share ({os.cpu_count()} cores, split workers)")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row(f"null run of {args.null}, samples/s", f"{rate:.0f}")
    table.add_row(
        f"{args.small}-sample run on idle workers, p50 / max s",
        f"{statistics.median(idle):.2f} / {max(idle):.2f}",
    )
    table.add_row(
        f"{args.small}-sample run during a {args.big}-sample run, each s (big run settled)",
        ", ".join(
            f"{s:.2f} ({n})" for s, n in zip(during.latencies, during.big_settled, strict=True)
        ),
    )
    table.add_row(f"{args.small_rescore}-sample rescore on idle workers, s", f"{rescore_alone:.2f}")
    table.add_row(
        f"{args.small_rescore}-sample rescore after a {args.big}-sample one, s (big settled)",
        f"{rescored.latencies[0]:.2f} ({rescored.big_settled[0]})",
    )
    Console().print(table)
    result = {
        "machine": {"cores": os.cpu_count(), "python": sys.version},
        "args": {k: str(v) for k, v in vars(args).items()},
        "null_rate": rate,
        "idle": idle,
        "during": vars(during),
        "rescore_alone": rescore_alone,
        "rescore_during": vars(rescored),
    }
    save(args.out, result, Console())


if __name__ == "__main__":
    main()
