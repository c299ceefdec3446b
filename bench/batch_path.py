"""The batch path alone: what evalq's own writes cost Redis and a worker per sample.

``infer_batch`` is driven in this process, as a worker that consumes both queues runs it (the
fused path: attempt, outputs, scores, in three Lua calls per message), over a run of the null
model in messages of 256 samples, on a fresh Redis with AOF ``appendfsync always``; no broker,
no Celery, no dispatcher. With ``spill`` each complete segment of 16,384 samples is spilled
inline (read back, written as a Parquet part, freed in Redis), as the worker's archive task
does; ``no spill`` leaves every result in Redis. Each configuration runs ``--repeat`` times,
alternating. Printed per sample: this process's CPU, Redis's CPU (``INFO cpu``) and the wall
time. ``bench/scale.py`` measures the whole system, broker included.

    python -m bench.batch_path [--samples N] [--repeat R] [--out PATH]
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

import redis
from rich.console import Console
from rich.table import Table

from bench.result import save
from evalq.producer.operations.redis_server import RedisServer
from evalq.shared.connection import connect
from evalq.shared.data.loading import build_spec
from evalq.shared.data.spec import publish_spec
from evalq.shared.models import RunMeta, RunStatus, SampleTask
from evalq.shared.queue.sizing import MESSAGE_SAMPLES
from evalq.shared.services import Services
from evalq.shared.settings import Settings
from evalq.shared.store.labels import LabelFields
from evalq.shared.store.reader import ResultReader
from evalq.shared.store.runs import RunStore
from evalq.shared.store.writer import ResultWriter
from evalq.worker.archiver import spill_run
from evalq.worker.batch import Resources
from evalq.worker.inference import infer_batch
from evalq.worker.runtime_pool import RuntimePool
from evalq.worker.shard_cache import ShardCache

console = Console(stderr=True)

ROWS = 16_384
"""Samples per spilled segment (``EVALQ_SPILL_ROWS``'s default)."""
WARM = 2
"""Messages run before the clock starts (the model's load, the scripts' first calls)."""


@dataclass
class Measured:
    spill: bool
    samples: int
    process_us: float
    redis_us: float
    wall_us: float


def _redis_cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def measure(root: Path, samples: int, spill: bool) -> Measured:
    """One run of ``samples`` null samples through ``infer_batch`` on a fresh Redis."""
    with RedisServer(root / f"redis-{uuid.uuid4().hex[:6]}", appendonly=True) as server:
        client = connect(server.url)
        data = root / "data"
        path = data / "validation.jsonl"
        if not path.exists():
            data.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(f'{{"text": "{i}"}}\n' for i in range(samples)))
        spec, _ = build_spec(str(data), "validation")
        publish_spec(client, spec)
        meta = RunMeta(
            run_id=uuid.uuid4().hex[:16], eval="null", spec=spec.fingerprint, dataset_id="bench",
            split="validation", n=samples, status=RunStatus.QUEUED, created=time.time(),
        )  # fmt: skip
        ids = list(range(samples))
        RunStore(client).create(meta, ids, str(root / "archive"))
        runtimes = RuntimePool(Services(Settings(device="cpu", max_models=1), client))

        def spill_now(run_id: str) -> None:
            spill_run(client, run_id, ROWS, ids)

        res = Resources(
            runs=RunStore(client), reader=ResultReader(client), writer=ResultWriter(client),
            shards=ShardCache(client, capacity=4), runtimes=runtimes,
            publish=lambda _name, tasks: len(tasks), stage_scoring=lambda _meta, _ids: 0,
            labels=LabelFields(client), max_batch=64, max_attempts=3, fuse=True,
            spill=spill_now if spill else None,
            spill_rows=ROWS,
        )  # fmt: skip
        messages = [
            SampleTask(
                run_id=meta.run_id, eval="null", spec=meta.spec,
                sample_ids=list(range(start, min(samples, start + MESSAGE_SAMPLES))),
            ).delivered_as(f"m{start}")
            for start in range(0, samples, MESSAGE_SAMPLES)
        ]  # fmt: skip
        for message in messages[:WARM]:
            infer_batch(res, [message])
        timed = sum(len(m.sample_ids) for m in messages[WARM:])
        redis_before, cpu_before, started = _redis_cpu(client), time.process_time(), time.time()
        for message in messages[WARM:]:
            infer_batch(res, [message])
        wall = time.time() - started
        per = 1e6 / timed
        measured = Measured(
            spill, timed, (time.process_time() - cpu_before) * per,
            (_redis_cpu(client) - redis_before) * per, wall * per,
        )  # fmt: skip
        if res.runs.get(meta.run_id).status is not RunStatus.COMPLETED:
            raise RuntimeError(f"run {meta.run_id} did not complete")
        runtimes.close()
        client.close()
        return measured


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("bench/results/batch_path.json"))
    args = parser.parse_args(argv)
    rows: list[Measured] = []
    with tempfile.TemporaryDirectory(prefix="evalq-batch-path-") as folder:
        for _ in range(args.repeat):
            for spill in (True, False):
                rows.append(measure(Path(folder), args.samples, spill))
                console.print(rows[-1])
    table = Table(title=f"{args.samples:,} null samples through infer_batch, µs per sample")
    for name in ("run", "spill", "process CPU", "Redis CPU", "wall"):
        table.add_column(name, justify="right")
    for n, row in enumerate(rows, 1):
        table.add_row(
            str(n), "yes" if row.spill else "no", f"{row.process_us:.1f}", f"{row.redis_us:.1f}",
            f"{row.wall_us:.1f}",
        )  # fmt: skip
    console.print(table)
    save(args.out, [asdict(r) for r in rows], console)


if __name__ == "__main__":
    main()
