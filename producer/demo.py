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

from producer.demo_data import write_demo_dataset
from producer.export import ExportFormat, write_results
from producer.follow import follow
from producer.submit import SubmitRequest, submit
from producer.workers import LocalWorkers
from shared.celery_app import create_app
from shared.connection import connect
from shared.errors import EvalqError
from shared.models import RunMeta, RunStatus
from shared.redis_server import RedisServer
from shared.results import ResultStore
from shared.runs import RunStore
from shared.settings import Settings

__all__ = ["DemoSummary", "run_demo"]


@dataclass(frozen=True)
class DemoSummary:
    """What the demo reports at the end."""

    run: RunMeta
    aggregate: dict[str, float]
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
        console.print(f"[dim]private redis-server on {server.url}[/]")
        settings = Settings(redis_url=server.url)
        app = create_app(settings)
        client = connect(server.url)
        pool = LocalWorkers(server.url, count=workers, log_dir=out_dir)
        try:
            with console.status(f"starting {workers} worker(s)..."):
                pool.start(app)
            started = time.monotonic()
            meta = submit(
                client,
                app,
                SubmitRequest(eval="topic", data=str(data), split="validation", limit=samples),
            )
            console.print(f"run [bold]{meta.run_id}[/]: {meta.n} samples of {data}/validation")
            runs, results = RunStore(client), ResultStore(client)
            final = follow(runs, results, meta.run_id, console)
            seconds = time.monotonic() - started
            if final.status is not RunStatus.COMPLETED:
                raise EvalqError(f"demo run ended {final.status}")
            path = out_dir / "results.jsonl"
            write_results(
                results.results(meta.run_id, runs.sample_ids(meta.run_id)), ExportFormat.JSONL, path
            )
            counts = results.progress(meta.run_id)
            return DemoSummary(
                run=final,
                aggregate=results.aggregate(meta.run_id) or {},
                scored=counts.scored,
                failed=counts.failed,
                seconds=seconds,
                results_path=path,
            )
        finally:
            with console.status("stopping workers and redis..."):
                pool.stop()
                client.close()
