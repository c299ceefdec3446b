"""lm-evaluation-harness tasks side by side in one run: lm-eval 0.4.13 itself, and the same
tasks registered in evalq (``tasks add --lm-eval``) and run by 1 and 2 warm workers, on the same
model, documents and batch size.

Two lm-eval tasks over ``bench/lmeval/data`` (``make_data.py``), written as lm-eval YAML into an
include folder: ``bench_mc``, multiple choice (100 four-option questions, ``acc`` and
``acc_norm``: 400 log-likelihood requests), and ``bench_arith``, ``generate_until`` (200
additions, greedy, 8 new tokens at most, stop at a newline, ``exact_match`` ignoring spaces).
SmolLM2-135M by default (``evalq.shared.lm.local.smollm2``; ``--model`` for another folder).

- lm-eval: ``simple_evaluate`` with lm-eval's ``HFLM`` (``--batch-size``) in a subprocess of its
  own with every core's thread, the model loaded before the clock starts (evalq's workers are
  warm too); timed around ``simple_evaluate``, which builds the task and its requests, runs the
  model and scores.
- evalq: a private Redis, ``--workers`` worker processes (each warmed with a short run of each
  task first), timed from submit (which builds the requests, as lm-eval's side does) to the
  run's completion stamp (every document scored and the run aggregated).

Prints documents/s per side and the ratio to lm-eval, and whether the metrics are equal; writes
JSON.

    python -m bench.harness [--workers 1,2] [--batch-size 16] [--limit N]
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
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.result import save
from bench.waiting import completed
from evalq.producer.operations.redis_server import RedisServer
from evalq.producer.operations.workers import LocalWorkers
from evalq.producer.service.client import Client
from evalq.producer.service.submit import SubmitRequest
from evalq.shared.access.policy import Tier
from evalq.shared.connection import connect
from evalq.shared.queue.sizing import MIN_MESSAGE_SAMPLES as MESSAGE
from evalq.shared.settings import Settings
from evalq.shared.store.runs import RunStore

console = Console(stderr=True)
DATA = Path(__file__).parent / "lmeval" / "data"
TASKS = {
    "bench_mc": ("mc", """
output_type: multiple_choice
doc_to_text: "Question: {{question}}\\nAnswer:"
doc_to_choice: "{{choices}}"
doc_to_target: label
metric_list:
  - {metric: acc, aggregation: mean, higher_is_better: true}
  - {metric: acc_norm, aggregation: mean, higher_is_better: true}
"""),
    "bench_arith": ("arith", """
output_type: generate_until
doc_to_text: "What is {{a}} plus {{b}}? Answer with only the number.\\nAnswer:"
doc_to_target: "{{answer}}"
target_delimiter: " "
generation_kwargs: {until: ["\\n"], max_gen_toks: 8, do_sample: false}
metric_list:
  - {metric: exact_match, aggregation: mean, higher_is_better: true, regexes_to_ignore: [" "]}
"""),
}  # fmt: skip
"""Each task: its data file's stem, and its config (its dataset lines are added per folder)."""


def write_tasks(folder: Path) -> None:
    """The tasks' YAML, each reading its data file from ``folder`` as its ``test`` split."""
    for task, (stem, body) in TASKS.items():
        data = folder / stem / "test.jsonl"
        data.parent.mkdir(parents=True, exist_ok=True)
        data.write_bytes((DATA / f"{stem}.jsonl").read_bytes())
        head = (
            f"task: {task}\ndataset_path: json\n"
            f"dataset_kwargs: {{data_files: {{test: {json.dumps(str(data))}}}}}\n"
            "test_split: test\n"
        )
        (folder / f"{task}.yaml").write_text(head + body.lstrip(), encoding="utf-8")


LMEVAL = """
import json, sys, time
import torch
from lm_eval import simple_evaluate
from lm_eval.models.huggingface import HFLM
from lm_eval.tasks import TaskManager
folder, model, batch, limit, threads = sys.argv[1:6]
torch.set_num_threads(int(threads))
lm = HFLM(pretrained=model, device="cpu", dtype="float32", batch_size=int(batch))
report = {}
for task in sys.argv[6:]:
    manager = TaskManager(include_path=folder, include_defaults=False)
    started = time.perf_counter()
    out = simple_evaluate(model=lm, tasks=[task], task_manager=manager,
                          limit=int(limit) if limit != "none" else None)
    seconds = time.perf_counter() - started
    results = {k: v for k, v in out["results"][task].items() if isinstance(v, float)}
    report[task] = {"seconds": seconds, "results": results,
                    "documents": out["n-samples"][task]["effective"]}
print(json.dumps(report))
"""


def lmeval(folder: Path, model: Path, batch: int, limit: int | None) -> dict[str, Any]:
    """lm-eval's report per task: seconds, results and documents."""
    done = subprocess.run(
        [sys.executable, "-c", LMEVAL, str(folder), str(model), str(batch),
         str(limit) if limit else "none", str(os.cpu_count() or 1), *TASKS],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


@contextmanager
def fleet(workers: int, folder: Path, model: Path) -> Iterator[tuple[Client, RunStore]]:
    """A private Redis with both tasks and their datasets registered, and ``workers`` worker
    processes."""
    with tempfile.TemporaryDirectory(prefix="evalq-harness-") as tmp, RedisServer(Path(tmp)) as s:
        settings = Settings(redis_url=s.url, model_roots=(model.parent,))
        client = Client(settings, admin=True)
        for task, (stem, _) in TASKS.items():
            client.add_dataset(task, str(folder / stem))
            client.set_tier(task, "test", Tier.VIEWABLE)
            client.add_lm_eval_task(task, task, include_path=str(folder))
        pool = LocalWorkers(s.url, count=workers, env={"EVALQ_MAX_BATCH": "256"})
        pool.start(client.app)
        try:
            yield client, RunStore(connect(s.url))
        finally:
            pool.stop()
            client.close()


def timed(
    client: Client, runs: RunStore, task: str, model: Path, *, batch: int, limit: int | None
) -> tuple[float, dict[str, float], int]:
    """Seconds from submit to the run's completion stamp, its metrics and documents."""
    request = SubmitRequest(
        eval=task, dataset=task, split="test", limit=limit,
        model=f"hf/{model}", model_args={"batch_size": str(batch)},
    )  # fmt: skip
    started = time.time()
    meta = client.submit(request)
    final = completed(runs, meta)
    assert final.finished is not None
    view = client.status(meta.run_id)
    stats = {name: stat.mean for name, stat in (view.stats or {}).items()}
    return final.finished - started, stats, meta.n


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--out", type=Path, default=Path("bench/results/harness.json"))
    args = parser.parse_args(argv)
    if args.model is None:
        from evalq.shared.lm.local import smollm2

        args.model = smollm2(Settings().models)
    model = args.model.resolve()
    folder = Path(tempfile.mkdtemp(prefix="evalq-harness-tasks-"))
    write_tasks(folder)
    console.print("[bold]lm-eval[/]")
    theirs = lmeval(folder, model, args.batch_size, args.limit)
    measured: dict[str, Any] = {"lmeval": theirs}
    table = Table(title=f"lm-eval tasks: evalq vs lm-eval 0.4.13, {model.name}, batch "
                        f"{args.batch_size}")  # fmt: skip
    for column in ("task", "side", "documents/s", "vs lm-eval", "same metrics"):
        table.add_column(column, justify="left" if column in ("task", "side") else "right")
    for task, report in theirs.items():
        rate = report["documents"] / report["seconds"]
        table.add_row(task, "lm-eval", f"{rate:.2f}", "1.00", "")
    for workers in [int(w) for w in args.workers.split(",")]:
        console.print(f"[bold]evalq, {workers} worker(s)[/]")
        with fleet(workers, folder, model) as (client, runs):
            for task in TASKS:  # a message per process: each loads the model and the task
                timed(client, runs, task, model, batch=args.batch_size, limit=MESSAGE * workers)
            for task, report in theirs.items():
                seconds, stats, n = timed(
                    client, runs, task, model, batch=args.batch_size, limit=args.limit
                )
                rate, their_rate = n / seconds, report["documents"] / report["seconds"]
                same = all(
                    report["results"].get(f"{metric},none", report["results"].get(metric)) == value
                    for metric, value in stats.items()
                )
                measured[f"evalq_{workers}_{task}"] = {
                    "seconds": seconds, "documents": n, "metrics": stats, "same_metrics": same,
                }  # fmt: skip
                table.add_row(
                    task, f"evalq, {workers} worker(s)", f"{rate:.2f}",
                    f"{rate / their_rate:.2f}", "yes" if same else "NO",
                )  # fmt: skip
    Console().print(table)
    save(args.out, {"args": {k: str(v) for k, v in vars(args).items()}, **measured}, Console())


if __name__ == "__main__":
    main()
