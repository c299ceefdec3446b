"""Language models side by side in one run: evalq's workers, a plain in-process loop over the
same runtime, and lm-evaluation-harness, on the same model, prompts and batch size.

On ``bench/lmeval/data`` (``make_data.py``: 200 arithmetic prompts, 100 four-option questions),
SmolLM2-135M-Instruct by default (``evalq.shared.lm.local.smollm2``; ``--model`` for another
folder):

  (a) loop: :class:`evalq.shared.lm.hf.HFModel` in this process, every prompt in one call (bucketed
      by length, ``--batch-size`` per forward pass), greedy: the model's own limit;
  (b) evalq: the same task registered as YAML and submitted with ``--model``, on 1 and 2 warm
      worker processes (``--workers``), timed from submit to the run's completion stamp;
  (c) lm-eval 0.4.13: ``bench/lmeval/run_lmeval.py`` in a subprocess (``hf`` backend, the same
      batch size and threads), its task YAMLs in ``bench/lmeval/tasks``.

Generation (chat template, ``max_new_tokens`` 8, stop at a newline): texts compared sample by
sample, samples/s and generated tokens/s, ratios to the loop and to lm-eval's model calls.
Multiple choice (plain prompt): each choice's log-likelihood against lm-eval's (largest
difference) and accuracy. Prints a table and writes JSON.

    python -m bench.generate [--workers 1,2] [--batch-size 16] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
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
from evalq.shared.models import SampleResult
from evalq.shared.settings import Settings
from evalq.shared.store.runs import RunStore

console = Console(stderr=True)
DATA = Path(__file__).parent / "lmeval" / "data"
ARITH = """
prompt: "What is {a} plus {b}? Answer with only the number."
chat: true
target: answer
generate: {max_new_tokens: 8, stop: ["\\n"]}
scorer: exact_match
"""
MC = """
prompt: "Question: {question}\\nAnswer:"
choices: choices
target: label
scorer: accuracy
"""


def rows(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (DATA / f"{name}.jsonl").read_text().splitlines()]


@dataclass
class Timed:
    """One side's generation: its texts in row order, completion tokens and seconds."""

    texts: list[str]
    tokens: int
    seconds: float

    @property
    def samples_per_s(self) -> float:
        return len(self.texts) / self.seconds

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def loop(model_dir: Path, batch_size: int, device: str) -> Timed:
    """The runtime evalq's workers run, called once in this process on every prompt."""
    from evalq.shared.lm.hf import HFModel
    from evalq.shared.lm.request import GenerationRequest
    from evalq.shared.lm.spec import ModelSpec

    model = HFModel.load(
        ModelSpec.parse(f"hf/{model_dir}", {"batch_size": str(batch_size)}), device
    )
    prompt = "What is {a} plus {b}? Answer with only the number."
    requests = [
        GenerationRequest(model.render(prompt.format(**row), chat=True), 8, ("\n",))
        for row in rows("arith")
    ]
    model.generate(requests[:batch_size])  # warm, as evalq's workers are
    started = time.perf_counter()
    found = model.generate(requests)
    seconds = time.perf_counter() - started
    return Timed([g.text for g in found], sum(g.completion_tokens for g in found), seconds)


@dataclass
class Evalq:
    """An admin client on a private stack, and its run records (polled without the gateway's
    aggregates while a run is timed)."""

    client: Client
    runs: RunStore

    def timed(self, request: SubmitRequest) -> tuple[list[SampleResult], float]:
        """Submit ``request`` and wait for its end: its results in row order and the seconds
        from submit to its completion stamp."""
        started = time.time()
        meta = self.client.submit(request)
        final = completed(self.runs, meta)
        assert final.finished is not None
        results = sorted(self.client.results(meta.run_id), key=lambda r: r.sample_id)
        return results, final.finished - started


@contextmanager
def stack(workers: int, model_dir: Path, batch_size: int) -> Iterator[Evalq]:
    """A private Redis with both tasks registered, ``workers`` warm worker processes."""
    with tempfile.TemporaryDirectory(prefix="evalq-gen-") as tmp, RedisServer(Path(tmp)) as s:
        client = Client(Settings(redis_url=s.url), admin=True)
        here = Evalq(client, RunStore(connect(s.url)))
        for name, task in (("arith", ARITH), ("mc", MC)):
            folder = Path(tmp) / name
            folder.mkdir()
            shutil.copy(DATA / f"{name}.jsonl", folder / "test.jsonl")
            client.add_dataset(f"gen-{name}", str(folder))
            client.set_tier(f"gen-{name}", "test", Tier.VIEWABLE)
            client.add_task(f"gen-{name}", task)
        pool = LocalWorkers(s.url, count=workers, env={"EVALQ_MAX_BATCH": "256"}).start(client.app)
        try:
            for _ in range(workers):  # each process loads the model
                run(here, "arith", model_dir, batch_size, limit=8 * workers)
            yield here
        finally:
            pool.stop()
            client.close()


def run(
    here: Evalq, name: str, model_dir: Path, batch_size: int, limit: int | None = None
) -> tuple[list[SampleResult], float]:
    """Submit task ``name`` and wait for its end: its results in row order and the seconds
    from submit to its completion stamp."""
    request = SubmitRequest(
        eval=f"gen-{name}", dataset=f"gen-{name}", split="test", limit=limit,
        model=f"hf/{model_dir}", model_args={"batch_size": str(batch_size)},
    )  # fmt: skip
    return here.timed(request)


def evalq(here: Evalq, model_dir: Path, batch_size: int) -> tuple[Timed, list[list[float]]]:
    results, seconds = run(here, "arith", model_dir, batch_size)
    tokens = sum(r.usage.completion_tokens for r in results if r.usage is not None)
    texts = [str(r.output) for r in results]
    choices, _ = run(here, "mc", model_dir, batch_size)
    return Timed(texts, tokens, seconds), [list(r.output) for r in choices]


def lmeval(model_dir: Path, batch_size: int, device: str) -> dict[str, Any]:
    """``run_lmeval.py``'s report (arith with the chat template, mc plain)."""
    out = Path(tempfile.mkdtemp(prefix="evalq-lmeval-")) / "lmeval.json"
    subprocess.run(
        [sys.executable, "-m", "bench.lmeval.run_lmeval", "--model", str(model_dir),
         "--batch-size", str(batch_size), "--threads", str(os.cpu_count() or 1),
         "--device", device, "--runs", "arith,mc", "--out", str(out)],
        check=True, cwd=Path(__file__).parents[1],
    )  # fmt: skip
    report: dict[str, Any] = json.loads(out.read_text())
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=Path("bench/results/generate.json"))
    args = parser.parse_args(argv)
    if args.model is None:
        from evalq.shared.lm.local import smollm2

        args.model = smollm2(Settings().models)
    model_dir = args.model.resolve()

    console.print("[bold]lm-eval[/]")
    ref = lmeval(model_dir, args.batch_size, args.device)
    theirs = ref["runs"]["arith"]
    their_texts = [s["generated"] for s in sorted(theirs["outputs"], key=lambda s: s["doc_id"])]
    their_rate = theirs["samples"] / theirs["model_s"]
    their_mc = sorted(ref["runs"]["mc"]["outputs"], key=lambda s: s["doc_id"])
    console.print("[bold]in-process loop[/]")
    own = loop(model_dir, args.batch_size, args.device)
    table = Table(title=f"evalq vs lm-eval 0.4.13, {model_dir.name}, batch {args.batch_size}")
    for column in ("side", "samples/s", "tokens/s", "vs loop", "vs lm-eval", "same texts"):
        table.add_column(column, justify="left" if column == "side" else "right")
    same = sum(a == b for a, b in zip(own.texts, their_texts, strict=True))
    table.add_row("lm-eval (model calls)", f"{their_rate:.2f}", "", "", "1.00", "")
    table.add_row(
        "loop", f"{own.samples_per_s:.2f}", f"{own.tokens_per_s:.1f}", "1.00",
        f"{own.samples_per_s / their_rate:.2f}", f"{same}/{len(own.texts)}",
    )  # fmt: skip
    measured: dict[str, Any] = {
        "loop": own.__dict__,
        "lmeval": {k: v for k, v in ref.items() if k != "runs"},
    }
    measured["lmeval"]["arith"] = {k: v for k, v in theirs.items() if k != "outputs"}
    for workers in [int(w) for w in args.workers.split(",")]:
        console.print(f"[bold]evalq, {workers} worker(s)[/]")
        with stack(workers, model_dir, args.batch_size) as here:
            mine, choices = evalq(here, model_dir, args.batch_size)
        same = sum(a == b for a, b in zip(mine.texts, their_texts, strict=True))
        table.add_row(
            f"evalq, {workers} worker(s)", f"{mine.samples_per_s:.2f}", f"{mine.tokens_per_s:.1f}",
            f"{mine.tokens_per_s / own.tokens_per_s:.2f}", f"{mine.samples_per_s / their_rate:.2f}",
            f"{same}/{len(mine.texts)}",
        )  # fmt: skip
        gaps = [
            abs(a - b) for mine_row, theirs_row in zip(choices, their_mc, strict=True)
            for a, b in zip(mine_row, theirs_row["loglikelihoods"], strict=True)
        ]  # fmt: skip
        right = [max(range(len(c)), key=c.__getitem__) for c in choices]
        their_right = [max(range(4), key=s["loglikelihoods"].__getitem__) for s in their_mc]
        measured[f"evalq_{workers}"] = {
            **mine.__dict__, "same_texts_as_lmeval": same, "mc_max_loglik_gap": max(gaps),
            "mc_same_choices": sum(a == b for a, b in zip(right, their_right, strict=True)),
        }  # fmt: skip
        console.print(
            f"multiple choice, {workers} worker(s): largest log-likelihood gap {max(gaps):.2e}, "
            f"same choice on {measured[f'evalq_{workers}']['mc_same_choices']}/{len(choices)}"
        )
    Console().print(table)
    save(args.out, {"args": {k: str(v) for k, v in vars(args).items()}, **measured}, Console())


if __name__ == "__main__":
    main()
