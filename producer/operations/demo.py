"""``evalq demo``: a private Redis, local workers, the demo dataset, the MiniLM topic eval.

Everything it starts it also stops, on success, on error and on Ctrl-C. What stays behind is the
demo data and the exported per-sample results in ``./evalq-demo/``.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from evalq.producer.operations.demo_data import write_demo_dataset
from evalq.producer.operations.redis_server import RedisServer
from evalq.producer.operations.workers import LocalWorkers
from evalq.producer.reports.export import ExportFormat, write_results
from evalq.producer.reports.follow import follow
from evalq.producer.service.client import Client
from evalq.producer.service.submit import SubmitRequest
from evalq.shared.access.policy import Tier
from evalq.shared.errors import EvalqError
from evalq.shared.models import RunMeta, RunStatus
from evalq.shared.settings import Settings
from evalq.shared.stats import Stat

__all__ = ["DEMO_DATASET", "DemoSummary", "run_demo"]

DEMO_DATASET = "evalq-demo"
DEMO_TIERS = {"train": Tier.VIEWABLE, "validation": Tier.VIEWABLE, "test": Tier.NO_ACCESS}


@dataclass(frozen=True)
class DemoSummary:
    """What the demo reports at the end."""

    run: RunMeta
    aggregate: dict[str, float]
    stats: dict[str, Stat]
    """Each metric's mean with its 95% interval."""
    scored: int
    failed: int
    seconds: float
    results_path: Path

    @property
    def samples_per_second(self) -> float:
        return (self.scored + self.failed) / self.seconds if self.seconds else 0.0


def run_demo(samples: int, workers: int, out_dir: Path, console: Console) -> DemoSummary:
    """Run the whole demo and return its summary."""
    data = write_demo_dataset(out_dir / "data", validation_size=max(samples, 1000))
    with tempfile.TemporaryDirectory(prefix="evalq-demo-") as tmp, RedisServer(Path(tmp)) as server:
        console.print(f"private redis-server on {server.url}", style="dim")
        settings = Settings(redis_url=server.url)
        client = Client(settings)
        pool = LocalWorkers(server.url, count=workers, log_dir=out_dir)
        try:
            with console.status(f"starting {workers} worker(s)..."):
                pool.start(client.app)
            client.add_dataset(DEMO_DATASET, str(data))
            for split, tier in DEMO_TIERS.items():
                client.set_tier(DEMO_DATASET, split, tier)
            listed = ", ".join(f"{split} {tier}" for split, tier in DEMO_TIERS.items())
            console.print(f"tiers of {DEMO_DATASET}: {listed}", highlight=False)
            started = time.monotonic()
            meta = client.submit(
                SubmitRequest(
                    eval="topic",
                    dataset=DEMO_DATASET,
                    split="validation",
                    limit=samples,
                )
            )
            console.print(f"run {meta.run_id}: {meta.n} samples of {DEMO_DATASET}/validation")
            final = follow(client, meta.run_id, console)
            seconds = time.monotonic() - started
            if final.status is not RunStatus.COMPLETED:
                raise EvalqError(f"demo run ended {final.status}")
            path = out_dir / "results.jsonl"
            write_results(client.results(meta.run_id), ExportFormat.JSONL, path)
            view = client.status(meta.run_id)
            counts = view.progress
            return DemoSummary(
                run=final,
                aggregate=view.aggregate or {},
                stats=view.stats or {},
                scored=counts.scored,
                failed=counts.failed,
                seconds=seconds,
                results_path=path,
            )
        finally:
            with console.status("stopping workers and redis..."):
                pool.stop()
                client.close()
