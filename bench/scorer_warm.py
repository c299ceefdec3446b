"""Script scoring cold versus warm, side by side in one run.

The ``arithmetic`` evaluation's scorer script (``check_number.py``, which imports sympy) scores
the same samples two ways, each with ``--procs`` calls in flight:

  cold: one ``python check_number.py OUTPUT EXPECTED`` per sample
  (``evalq.shared.scorer.run_cold``); warm: the worker's pool of warm subprocesses
        (``evalq.worker.script_pool.ScriptPool``), each of which imports the script once; starting
        the pool is inside the timed span.

Prints samples/s and the ratio, checks both gave the same answers, and writes JSON.

    python -m bench.scorer_warm [--samples N] [--procs P] [--out PATH]
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rich.console import Console
from rich.progress import track
from rich.table import Table

from bench.result import save
from evalq.shared.evals.arithmetic import Arithmetic, arithmetic_rows
from evalq.shared.scorer import ScriptCall, ScriptScorer, run_cold
from evalq.worker.script_pool import ScriptPool

console = Console()


def _cold(scorer: ScriptScorer, calls: list[ScriptCall], procs: int) -> tuple[float, list[str]]:
    start = time.perf_counter()
    with ThreadPoolExecutor(procs) as executor:
        answers = list(
            track(
                executor.map(lambda call: run_cold(scorer, call), calls),
                total=len(calls),
                description="cold",
                console=console,
            )
        )
    return time.perf_counter() - start, answers


def _warm(scorer: ScriptScorer, calls: list[ScriptCall], procs: int) -> tuple[float, list[str]]:
    start = time.perf_counter()
    pool = ScriptPool(scorer, procs)
    try:
        answers = [str(a) for a in pool.map(calls)]
    finally:
        pool.close()
    return time.perf_counter() - start, answers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--procs", type=int, default=2, help="calls in flight (pool size)")
    parser.add_argument("--out", type=Path, default=Path("bench/results/scorer_warm.json"))
    args = parser.parse_args()

    evaluation = Arithmetic()
    scorer = Arithmetic.scorer
    assert scorer is not None
    rows = arithmetic_rows(args.samples, seed=0)
    outputs = evaluation.infer(None, rows)
    calls = [evaluation.script_call(r, o) for r, o in zip(rows, outputs, strict=True)]

    warm_s, warm = _warm(scorer, calls, args.procs)
    cold_s, cold = _cold(scorer, calls, args.procs)
    mismatches = sum(a != b for a, b in zip(cold, warm, strict=True))

    table = Table(title=f"scorer script: {args.samples} samples, {args.procs} in flight")
    for column in ("path", "seconds", "samples/s", "ratio"):
        table.add_column(column, justify="left" if column == "path" else "right")
    table.add_row("cold: python script.py per sample", f"{cold_s:.2f}",
                  f"{args.samples / cold_s:,.1f}", "1.0")  # fmt: skip
    table.add_row("warm: evalq scorer pool", f"{warm_s:.2f}",
                  f"{args.samples / warm_s:,.1f}", f"{cold_s / warm_s:,.1f}")  # fmt: skip
    console.print(table)
    console.print(f"answers that differ between cold and warm: {mismatches}")
    result = {
        "samples": args.samples,
        "procs": args.procs,
        "cold_seconds": cold_s,
        "warm_seconds": warm_s,
        "ratio": cold_s / warm_s,
        "mismatches": mismatches,
    }
    save(args.out, result, console)


if __name__ == "__main__":
    main()
