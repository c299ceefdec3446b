"""One caller's endpoint beside another's: the second caller's run times while the first's
server is slow, or answers with 4 MB per request, with the endpoint lane on (4
threads) and off (``EVALQ_ENDPOINT_THREADS=0``: such messages run in the pool, as before), side
by side in one run, on one worker with one pool process and the scripted server
(``tests/openai_server.py``, its fake model).

For each case and each setting, on a fresh Redis:

- **alone**: ``--runs`` runs of ``--samples`` samples by ``bob`` on a quick server, one after
  another, nothing else going;
- **4 MB**: the same while ``flood`` has ``--flood`` runs of ``--samples`` samples on a server
  answering each request with 4 MB of text (each ends ``endpoint/TooLarge``), and how much
  Redis grew at its peak;
- **slow**: the same while ``flood`` has ``--flood`` runs of 64 samples (``concurrency=16``) on
  a server answering each request after ``--delay`` seconds.

A run's time is from just before ``submit`` to its completion stamp. Prints a table and writes
``bench/results/endpoint_share.json``::

    python -m bench.endpoint_share [--runs 10] [--samples 20] [--flood 3] [--delay 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from bench.endpoint import PLAIN, test_server
from bench.generate import DATA
from bench.result import save
from bench.waiting import completed
from evalq.producer.operations.redis_server import RedisServer
from evalq.producer.operations.workers import LocalWorkers
from evalq.producer.service.client import Client
from evalq.producer.service.policy_file import PolicyFile
from evalq.producer.service.submit import SubmitRequest
from evalq.shared.access.policy import Tier
from evalq.shared.connection import connect
from evalq.shared.models import RunMeta
from evalq.shared.settings import Settings
from evalq.shared.store.runs import RunStore

console = Console(stderr=True)
DATASET = "share-arith"


@dataclass
class Stack:
    url: str
    runs: RunStore
    clients: dict[str, Client]

    def submit(self, principal: str, server: str, limit: int, **args: str) -> RunMeta:
        request = SubmitRequest(
            eval=DATASET, dataset=DATASET, split="test", limit=limit, model="openai/fake",
            model_args={"base_url": server, **args},
        )  # fmt: skip
        return self.clients[principal].submit(request)

    def timed(self, server: str, runs: int, samples: int) -> list[float]:
        """``runs`` of ``bob``'s, one after another: seconds from submit to completion."""
        took = []
        for _ in range(runs):
            started = time.time()
            final = completed(self.runs, self.submit("bob", server, samples))
            assert final.finished is not None
            took.append(final.finished - started)
        return took


@contextmanager
def stack(servers: list[str], threads: int) -> Iterator[Stack]:
    with tempfile.TemporaryDirectory(prefix="evalq-share-") as tmp, RedisServer(Path(tmp)) as s:
        admin = Client(Settings(redis_url=s.url), admin=True)
        folder = Path(tmp) / "arith"
        folder.mkdir()
        (folder / "test.jsonl").write_text((DATA / "arith.jsonl").read_text())
        admin.add_dataset(DATASET, str(folder))
        admin.set_tier(DATASET, "test", Tier.VIEWABLE)
        admin.add_task(DATASET, PLAIN)
        admin.apply_policy(PolicyFile.model_validate({"endpoints": {u: {} for u in servers}}))
        env = {"EVALQ_ENDPOINT_THREADS": str(threads)}
        pool = LocalWorkers(s.url, count=1, env=env).start(admin.app)
        clients = {
            p: Client(Settings(redis_url=s.url, principal=p), admin=True) for p in ("bob", "flood")
        }
        try:
            yield Stack(s.url, RunStore(connect(s.url)), clients)
        finally:
            pool.stop()
            for client in (admin, *clients.values()):
                client.close()


def control(server: str, **settings: Any) -> None:
    httpx.post(server.removesuffix("/v1") + "/control", json=settings, timeout=10)


@dataclass
class Case:
    case: str
    lane_threads: int
    runs: list[float]
    redis_peak_mib: float | None = None

    @property
    def p50(self) -> float:
        return statistics.median(self.runs)

    @property
    def p95(self) -> float:
        ordered = sorted(self.runs)
        return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def measure(args: argparse.Namespace, quick: str, noisy: str, threads: int) -> list[Case]:
    cases = []
    with stack([quick, noisy], threads) as here:
        here.timed(quick, 1, args.samples)  # the worker's first batch builds the shard
        cases.append(Case("alone", threads, here.timed(quick, args.runs, args.samples)))
        client = connect(here.url)
        before = int(client.info("memory")["used_memory"])
        control(noisy, pad=4_000_000)
        for _ in range(args.flood):
            here.submit("flood", noisy, args.samples)
        took = here.timed(quick, args.runs, args.samples)
        peak = int(client.info("memory")["used_memory_peak"]) - before
        cases.append(Case("4 MB", threads, took, peak / 2**20))
        control(noisy, pad=0, delay=args.delay)
        flood = [
            here.submit("flood", noisy, 64, concurrency="16", timeout="120")
            for _ in range(args.flood)
        ]
        cases.append(Case("slow", threads, here.timed(quick, args.runs, args.samples)))
        control(noisy, delay=0)
        for meta in flood:
            completed(here.runs, meta)
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--flood", type=int, default=3)
    parser.add_argument("--delay", type=float, default=5.0)
    args = parser.parse_args()
    cases: list[Case] = []
    with test_server(None) as quick, test_server(None) as noisy:
        for threads in (4, 0):
            cases += measure(args, quick, noisy, threads)
    table = Table(title="another caller's runs beside one caller's endpoint (seconds)")
    for column in ("case", "lane threads", "p50", "p95", "max", "Redis peak +MiB"):
        table.add_column(column)
    for c in cases:
        peak = "" if c.redis_peak_mib is None else f"{c.redis_peak_mib:.1f}"
        table.add_row(
            c.case, str(c.lane_threads), f"{c.p50:.2f}", f"{c.p95:.2f}", f"{max(c.runs):.2f}", peak
        )
    Console().print(table)
    figures = [{**asdict(c), "p50": c.p50, "p95": c.p95} for c in cases]
    save(Path("bench/results/endpoint_share.json"), {"args": vars(args), "cases": figures}, console)


if __name__ == "__main__":
    main()
