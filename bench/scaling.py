"""Horizontal scaling of score-bound work: evalq with 1, 2 and 4 worker processes.

The ``arithmetic`` evaluation's inference is trivial and its scorer is a script (run warm in
each worker process, one scorer subprocess per process), so throughput is bound by scoring.
Side by side in one run: the in-process baseline (the same eval in a plain loop, scored by one
warm scorer subprocess) and evalq end to end (submit -> every sample scored) with N separate
``evalq worker`` processes, N = 1, 2, 4. Prints samples/s, the ratio to the baseline and the
speed-up over one worker; writes JSON.

    python -m bench.scaling [--samples N] [--workers 1,2,4] [--repeat R] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from dataclasses import asdict
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.result import save
from bench.throughput import measure
from evalq.shared.evals.arithmetic import arithmetic_rows
from evalq.shared.evaluation import load_plugins

console = Console()


def _write_data(folder: Path, n: int) -> Path:
    lines = [json.dumps(row) for row in arithmetic_rows(n, seed=0)]
    (folder / "validation.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=4000)
    parser.add_argument("--workers", default="1,2,4", help="worker process counts")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3, help="rounds (each config once a round)")
    parser.add_argument("--out", type=Path, default=Path("bench/results/scaling.json"))
    args = parser.parse_args()

    load_plugins([])
    data = _write_data(Path(tempfile.mkdtemp(prefix="evalq-scaling-")), args.samples)
    env = {"EVALQ_SCORER_PROCS": "1", "EVALQ_TORCH_THREADS": "1"}
    counts = [int(w) for w in args.workers.split(",")]
    console.print(f"baseline and evalq with {counts} workers, {args.repeat} rounds")
    rows = measure(
        "arithmetic", "arithmetic", data, n=args.samples, batch=args.batch, device="cpu",
        repeat=args.repeat, worker_counts=counts, env=env,
    )  # fmt: skip
    base = rows[0]
    one = rows[1].rate
    title = f"score-bound scaling ({os.cpu_count()} cores, {args.repeat} rounds, medians)"
    table = Table(title=title)
    for column in ("configuration", "samples", "samples/s", "ratio to baseline", "vs 1 worker"):
        table.add_column(column, justify="left" if column == "configuration" else "right")
    for row in rows:
        speedup = "" if row is base else f"{row.rate / one:.2f}"
        table.add_row(row.config, str(row.samples), f"{row.rate:,.0f}", f"{row.ratio:.2f}", speedup)
    console.print(table)
    result = {
        "cores": os.cpu_count(),
        "rows": [{**asdict(r), "samples_per_s": r.rate} for r in rows],
    }
    save(args.out, result, console)


if __name__ == "__main__":
    main()
