"""``evalq demo --lm`` beside the model's own limit: the demo's 100 sums prompts (chat template,
``max_new_tokens`` 64, stop at a blank line) generated in this process by the runtime evalq's
workers run, every prompt in one call, warm; then the demo itself in a subprocess
(``evalq demo --lm --json``: a private Redis, one worker, both tasks). Prints the demo's wall
time and its sums task's tokens/s beside the loop's, and their ratio.

    python -m bench.demo_lm [--workers 1]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from bench.result import save
from evalq.producer.operations.demo_lm import SUMS, write_language_data
from evalq.shared.lm.local import smollm2
from evalq.shared.lm.task import TaskSpec
from evalq.shared.settings import get_settings

RESULTS = Path(__file__).parent / "results"


def loop() -> tuple[int, float]:
    """The demo's sums prompts through :class:`evalq.shared.lm.hf.HFModel` in this process:
    completion tokens and seconds, warm."""
    from evalq.shared.lm.hf import HFModel
    from evalq.shared.lm.request import GenerationRequest
    from evalq.shared.lm.spec import ModelSpec

    task = TaskSpec.from_yaml(SUMS)
    assert task.generate is not None
    with tempfile.TemporaryDirectory() as folder:
        data = write_language_data(Path(folder))["sums"] / "validation.jsonl"
        rows = [json.loads(line) for line in data.read_text().splitlines() if line]
    model = HFModel.load(ModelSpec.parse(f"hf/{smollm2(get_settings().models)}"), "cpu")
    requests = [
        GenerationRequest(
            model.render(task.render(row), chat=True),
            task.generate.max_new_tokens,
            tuple(task.generate.stop),
        )
        for row in rows
    ]
    model.generate(requests[:8])  # warm, as a worker's model is
    started = time.perf_counter()
    found = model.generate(requests)
    return sum(g.completion_tokens for g in found), time.perf_counter() - started


def demo(workers: int) -> tuple[dict[str, dict[str, Any]], float]:
    """``evalq demo --lm --json``: its summaries and its wall time."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run(
            [sys.executable, "-c", "from evalq.shared.cli import main; main()", "demo", "--lm",
             "--workers", str(workers), "--out", out, "--json"],
            capture_output=True, text=True, check=True, timeout=3600,
        )  # fmt: skip
    wall = time.perf_counter() - started
    return {s["task"]: s for s in json.loads(done.stdout)}, wall


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args(argv)
    tokens, seconds = loop()
    summaries, wall = demo(args.workers)
    sums = summaries["sums"]
    demo_rate = float(sums["completion_tokens"]) / float(sums["seconds"])
    loop_rate = tokens / seconds
    print(f"in-process loop: {tokens} tokens in {seconds:.1f}s = {loop_rate:.1f} tokens/s")
    print(
        f"evalq demo --lm: {wall:.1f}s in all; sums {sums['completion_tokens']} tokens in "
        f"{float(sums['seconds']):.1f}s = {demo_rate:.1f} tokens/s "
        f"({demo_rate / loop_rate:.2f} of the loop)"
    )
    save(
        RESULTS / "demo_lm.json",
        {"loop_tokens_per_s": loop_rate, "demo_tokens_per_s": demo_rate, "demo_wall_s": wall,
         "workers": args.workers},
        Console(),
    )  # fmt: skip


if __name__ == "__main__":
    main()
