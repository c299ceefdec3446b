"""Isolated inference versus in-process inference, side by side in one run.

The demo's ``topic`` evaluation (all-MiniLM-L6-v2; ``--eval null`` for a model that answers
instantly, which leaves only isolation's own cost) infers the demo's validation texts,
label-free, in batches of ``--batch``, two ways, batch by batch (the one that goes first
alternating) so both see the same machine:

  in-process: ``evaluation.infer(model, rows)`` in this process (what a worker does by default);
  isolated:   the same call in a warm model subprocess (``evalq.worker.model_proxy.ModelProxy``):
              rows and outputs cross a pipe as JSON.

Both load the model once (timed apart) and use ``--threads`` torch threads. Prints samples/s,
the ratio and the per-batch overhead, checks both gave the same outputs, and writes JSON.

    python -m bench.isolation [--eval topic|null] [--samples N] [--batch B] [--threads T]
                              [--device D] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from bench.result import save
from evalq.producer.operations.demo_data import write_demo_dataset
from evalq.shared.evaluation import Evaluation, create, load_plugins, scrub
from evalq.worker.model_proxy import ModelProxy
from evalq.worker.runtime_pool import resolve_device

console = Console()


def _rows(samples: int) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as folder:
        path = write_demo_dataset(Path(folder), validation_size=samples) / "validation.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [scrub(row, ("label",)) for row in rows[:samples]]


def _race(
    evaluation: Evaluation, model: Any, proxy: ModelProxy, batches: list[list[dict[str, Any]]]
) -> tuple[dict[str, float], int]:
    """Seconds each way spent inferring every batch, and how many outputs differ. The bar is
    redrawn between timed calls only (no refresh thread competing with them)."""
    calls: dict[str, Callable[[list[dict[str, Any]]], list[Any]]] = {
        "in-process": partial(evaluation.infer, model),
        "isolated": proxy.infer,
    }
    spent = dict.fromkeys(calls, 0.0)
    mismatches = 0
    with Progress(console=console, auto_refresh=False) as progress:
        bar = progress.add_task("batches", total=len(batches))
        for number, batch in enumerate(batches):
            order = list(calls) if number % 2 == 0 else list(reversed(calls))
            answers: dict[str, list[Any]] = {}
            for name in order:  # who goes first alternates: neither always warms up
                start = time.perf_counter()
                answers[name] = calls[name](batch)
                spent[name] += time.perf_counter() - start
            pairs = zip(answers["in-process"], answers["isolated"], strict=True)
            mismatches += sum(a != b for a, b in pairs)
            progress.update(bar, advance=1, refresh=True)
    return spent, mismatches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eval", choices=("topic", "null"), default="topic")
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", type=Path, default=Path("bench/results/isolation.json"))
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    load_plugins([])
    evaluation = create(args.eval)
    rows = _rows(args.samples)
    batches = [rows[i : i + args.batch] for i in range(0, len(rows), args.batch)]

    start = time.perf_counter()
    model = evaluation.load(device)
    load_in = time.perf_counter() - start
    start = time.perf_counter()
    proxy = ModelProxy(evaluation, device=device, plugins=[], threads=args.threads, timeout=600)
    proxy.start()
    load_iso = time.perf_counter() - start

    try:
        spent, mismatches = _race(evaluation, model, proxy, batches)
    finally:
        proxy.close()

    title = f"{args.eval} on {device}: {len(rows)} texts, batches of {args.batch}"
    table = Table(title=title)
    for column in ("inference", "model load s", "infer s", "samples/s", "vs in-process"):
        table.add_column(column, justify="left" if column == "inference" else "right")
    for name, load in (("in-process", load_in), ("isolated", load_iso)):
        table.add_row(
            name, f"{load:.2f}", f"{spent[name]:.2f}", f"{len(rows) / spent[name]:,.1f}",
            f"{spent['in-process'] / spent[name]:.3f}",
        )  # fmt: skip
    console.print(table)
    overhead_ms = 1000 * (spent["isolated"] - spent["in-process"]) / len(batches)
    console.print(f"isolation overhead per batch: {overhead_ms:.2f} ms")
    console.print(f"outputs that differ between the two: {mismatches}")
    result = {
        "eval": args.eval,
        "device": device,
        "samples": len(rows),
        "batch": args.batch,
        "threads": args.threads,
        "load_seconds": {"in_process": load_in, "isolated": load_iso},
        "infer_seconds": {"in_process": spent["in-process"], "isolated": spent["isolated"]},
        "throughput_ratio": spent["in-process"] / spent["isolated"],
        "overhead_ms_per_batch": overhead_ms,
        "mismatches": mismatches,
    }
    save(args.out, result, console)


if __name__ == "__main__":
    main()
