"""Whether cross-message buffering pays: this tree's worker against another revision's.

The same runs go through two fleets of one worker process each, one running this tree's code
and one running ``--against``'s (a revision of this repository, unpacked with ``git archive``
and imported in place of this tree by the worker's ``PYTHONPATH``; the third-party packages are
this interpreter's for both). Each run is recorded and opened as ``submit`` does, and its
messages are published straight to the ``infer`` queue in messages of exactly ``--sizes``
samples (``submit`` sizes them from the model's pace), so both fleets see the same messages;
its seconds run from the first message published to the run completed. Each fleet has a Redis
of its own, and the runs alternate between them in rounds (each configuration once a round), so
a change in the machine's speed reaches both alike; the ratio is the median of the per-round
ratios of this tree's samples/s to the other's.

Measured here to decide issue #45's "celery-batches": the other revision's worker buffers
messages (celery-batches) until they hold ``EVALQ_MAX_BATCH`` samples; this tree's runs each
message as a pool job of its own.

    python -m bench.batches --against REV [--null-samples N] [--real-samples N]
        [--sizes 64,256,2048] [--max-batch 64] [--repeat R] [--out PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import redis
from celery import Celery
from rich.console import Console
from rich.table import Table

from bench.result import save
from evalq.producer.operations.demo_data import write_demo_dataset
from evalq.producer.operations.redis_server import RedisServer
from evalq.producer.operations.workers import LocalWorkers
from evalq.shared.access.ledger import Ledger
from evalq.shared.connection import connect
from evalq.shared.data.loading import build_spec
from evalq.shared.data.spec import publish_spec
from evalq.shared.evaluation import load_plugins
from evalq.shared.models import RunMeta, RunStatus
from evalq.shared.queue.celery_app import INFER_TASK, create_app
from evalq.shared.queue.sizing import publish, split
from evalq.shared.settings import Settings
from evalq.shared.store.runs import RunStore

console = Console(stderr=True)

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("shared", "worker", "producer")
"""This repository's folders that are ``evalq.<name>``; ``shared/public`` is ``evalq`` itself."""


@dataclass
class Row:
    model: str
    size: int
    samples: int
    this: list[float] = field(default_factory=list)
    """Seconds per round, this tree's fleet."""
    other: list[float] = field(default_factory=list)
    """Seconds per round, ``--against``'s fleet."""

    def rate(self, seconds: list[float]) -> float:
        return self.samples / statistics.median(seconds)

    @property
    def ratio(self) -> float:
        """Median over rounds of this tree's samples/s over the other's."""
        return statistics.median(o / t for t, o in zip(self.this, self.other, strict=True))


def unpack(rev: str, into: Path) -> Path:
    """``rev``'s files under ``into/tree``, and a folder to put on ``PYTHONPATH`` in which
    ``evalq`` is that tree's code (returned)."""
    tree = into / "tree"
    tree.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    package = into / "path" / "evalq"
    package.mkdir(parents=True)
    for entry in (tree / "shared" / "public").iterdir():
        (package / entry.name).symlink_to(entry)
    for name in PACKAGES:
        (package / name).symlink_to(tree / name)
    found = subprocess.run(
        [sys.executable, "-P", "-c", "import evalq.worker; print(evalq.worker.__file__)"],
        env={**os.environ, "PYTHONPATH": str(package.parent)}, check=True, capture_output=True,
        text=True,
    ).stdout  # fmt: skip
    if not Path(found.strip()).is_relative_to(package):
        raise RuntimeError(f"{rev}'s tree is not what a worker imports: {found.strip()}")
    return package.parent


@dataclass
class Fleet:
    """One worker process on a Redis of its own."""

    app: Celery
    client: redis.Redis
    archive: str


@contextmanager
def fleet(root: Path, max_batch: int, python_path: Path | None) -> Iterator[Fleet]:
    """A Redis and one worker (this tree's, or the one on ``python_path``)."""
    with RedisServer(root / f"redis-{uuid.uuid4().hex[:6]}") as server:
        settings = Settings(redis_url=server.url, max_batch=max_batch)
        app = create_app(settings)
        client = connect(server.url)
        env = {"EVALQ_MAX_BATCH": str(max_batch)}
        if python_path is not None:
            env["PYTHONPATH"] = str(python_path)
        workers = LocalWorkers(server.url, env=env, log_dir=root).start(app, timeout=120)
        try:
            yield Fleet(app, client, str(root / "archive"))
        finally:
            workers.stop()
            client.close()


def timed_run(at: Fleet, eval_name: str, data: Path, samples: int, size: int) -> float:
    """Seconds from publishing a run of ``samples`` samples, in messages of ``size``, to its
    completion."""
    spec, _ = build_spec(str(data), "validation")
    publish_spec(at.client, spec)
    meta = RunMeta(
        run_id=uuid.uuid4().hex[:16], eval=eval_name, spec=spec.fingerprint, dataset_id="bench",
        split="validation", n=samples, status=RunStatus.QUEUED, created=time.time(),
    )  # fmt: skip
    ids = list(range(samples))
    runs = RunStore(at.client)
    runs.create(meta, ids, at.archive)
    Ledger(at.client).reserve(meta)
    started = time.perf_counter()
    publish(at.app, INFER_TASK, split(meta, ids, size=size))
    deadline = time.monotonic() + 900
    while (status := runs.get(meta.run_id).status).active:
        if time.monotonic() > deadline:
            raise TimeoutError(f"run {meta.run_id} did not end")
        time.sleep(0.02)
    seconds = time.perf_counter() - started
    if status is not RunStatus.COMPLETED:
        raise RuntimeError(f"run {meta.run_id} ended {status}")
    return seconds


def measure(  # noqa: PLR0913 - one benchmark's whole configuration, every knob named
    root: Path,
    other: Path,
    model: str,
    eval_name: str,
    data: Path,
    *,
    samples: int,
    sizes: list[int],
    max_batch: int,
    repeat: int,
) -> list[Row]:
    """Both fleets warm, then ``repeat`` rounds of every size on each."""
    rows = [Row(model, size, samples) for size in sizes]
    with ExitStack() as stack:
        this = stack.enter_context(fleet(root / "this", max_batch, None))
        that = stack.enter_context(fleet(root / "other", max_batch, other))
        for at in (this, that):
            timed_run(at, eval_name, data, min(samples, 4 * min(sizes)), min(sizes))  # warm-up
        for _ in range(repeat):
            for row in rows:
                row.this.append(timed_run(this, eval_name, data, samples, row.size))
                row.other.append(timed_run(that, eval_name, data, samples, row.size))
                console.print(
                    f"{model} {row.size}: this {samples / row.this[-1]:,.0f} samples/s, "
                    f"other {samples / row.other[-1]:,.0f}"
                )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--against", required=True, help="the revision to compare with")
    parser.add_argument("--null-samples", type=int, default=32768)
    parser.add_argument("--real-samples", type=int, default=4096)
    parser.add_argument("--sizes", default="64,256,2048")
    parser.add_argument("--max-batch", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("bench/results/batches.json"))
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    load_plugins([])
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="evalq-bench-batches-") as folder:
        root = Path(folder)
        other = unpack(args.against, root)
        data = write_demo_dataset(root / "data", max(args.null_samples, args.real_samples))
        for model, eval_name, samples in (
            ("null", "null", args.null_samples),
            ("MiniLM", "topic", args.real_samples),
        ):
            if samples:
                rows += measure(
                    root / model, other, model, eval_name, data, samples=samples, sizes=sizes,
                    max_batch=args.max_batch, repeat=args.repeat,
                )  # fmt: skip
    title = (
        f"samples/s, this tree against {args.against} ({os.cpu_count()} cores, "
        f"EVALQ_MAX_BATCH={args.max_batch}, {args.repeat} rounds, medians)"
    )
    table = Table(title=title)
    for column in ("model", "message samples", "run samples", "this tree", "other", "ratio"):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(
            row.model, str(row.size), str(row.samples), f"{row.rate(row.this):,.0f}",
            f"{row.rate(row.other):,.0f}", f"{row.ratio:.2f}",
        )  # fmt: skip
    Console().print(table)
    result = {
        "machine": {"cores": os.cpu_count(), "python": sys.version},
        "against": args.against,
        "max_batch": args.max_batch,
        "rows": [{**asdict(r), "ratio": r.ratio} for r in rows],
    }
    save(args.out, result, Console())


if __name__ == "__main__":
    main()
