"""lm-evaluation-harness on the two bench tasks, per-sample outputs and wall time to JSON.

The reference evalq's language-model evaluations are compared against: lm-eval's ``hf`` model
(``lm_eval.simple_evaluate``, CPU, float32) on ``bench/lmeval/tasks``, whose rows
``bench/lmeval/make_data.py`` writes. Three runs, each its own ``simple_evaluate``:

- ``arith``: generative, with the chat template (``apply_chat_template=True``);
- ``mc``: multiple choice, plain prompt;
- ``mc_chat``: the same multiple choice with the chat template.

Per sample it keeps the exact prompt string lm-eval built, the generated text or each choice's
log-likelihood (and whether it was the greedy continuation), the target and the metrics. Times:
``wall_s`` is the whole ``simple_evaluate`` (model load, task build, inference, metrics);
``model_s`` only lm-eval's ``generate_until`` / ``loglikelihood`` calls.

Needs lm-eval (``pip install lm_eval==0.4.13 accelerate``), not part of evalq's environment:

    python -m bench.lmeval.run_lmeval [--model DIR] [--batch-size 16] [--threads 2]
        [--runs arith,mc,mc_chat] [--limit N] [--out bench/results/lmeval.json]

Without ``--model`` it evaluates SmolLM2-135M-Instruct (``evalq.shared.lm.local.smollm2``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TASKS = Path(__file__).parent / "tasks"
RUNS = {  # run name: (task, apply_chat_template)
    "arith": ("evalq_arith", True),
    "mc": ("evalq_mc", False),
    "mc_chat": ("evalq_mc", True),
}


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="a transformers model folder")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda:0 on a GPU")
    parser.add_argument("--runs", default=",".join(RUNS))
    parser.add_argument("--limit", type=int, default=None, help="rows per task (a smoke test)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "lmeval.json")
    return parser.parse_args()


def main() -> None:
    args = _parse()
    # before torch is imported: its thread pools are sized once
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = str(args.threads)
    # offline: the model is a local folder, the data local JSONL; nothing may be fetched
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ.setdefault(name, "1")
    os.chdir(REPO)  # the task YAMLs name their data files relative to the repository root

    import lm_eval
    import torch
    import transformers
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    torch.set_num_threads(args.threads)
    if args.model is not None:
        model = args.model.resolve()
    else:
        from evalq.shared.lm.local import smollm2
        from evalq.shared.settings import get_settings

        model = smollm2(get_settings().models)
    timers = _time_model_calls(HFLM)
    manager = TaskManager(include_path=str(TASKS))
    report: dict[str, Any] = {
        "model": str(model),
        "batch_size": args.batch_size,
        "threads": args.threads,
        "limit": args.limit,
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
        },
        "versions": {
            "lm_eval": lm_eval.__version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
        "offline_env": {k: os.environ[k] for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")},
        "runs": {},
    }
    for run in args.runs.split(","):
        task, chat = RUNS[run]
        timers.clear()
        started = time.perf_counter()
        results = lm_eval.simple_evaluate(
            model="hf",
            model_args=f"pretrained={model},dtype=float32",
            tasks=[task],
            batch_size=args.batch_size,
            device=args.device,
            log_samples=True,
            apply_chat_template=chat,
            task_manager=manager,
            limit=args.limit,
        )
        wall = time.perf_counter() - started
        assert results is not None
        samples = [_sample(s) for s in results["samples"][task]]
        model_s = sum(timers.values())
        report["runs"][run] = {
            "task": task,
            "apply_chat_template": chat,
            "samples": len(samples),
            "wall_s": round(wall, 3),
            "model_s": round(model_s, 3),
            "samples_per_s_model": round(len(samples) / model_s, 3) if model_s else None,
            "metrics": _plain(results["results"][task]),
            "outputs": samples,
        }
        print(
            f"{run}: {len(samples)} samples, wall {wall:.1f} s, model calls {model_s:.1f} s "
            f"({len(samples) / model_s:.2f} samples/s), {report['runs'][run]['metrics']}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")


def _time_model_calls(cls: Any) -> dict[str, float]:
    """Seconds spent in ``cls.generate_until`` and ``cls.loglikelihood``, by method."""
    spent: dict[str, float] = {}
    for name in ("generate_until", "loglikelihood"):
        original = getattr(cls, name)

        def timed(self: Any, *a: Any, _original: Any = original, _name: str = name, **k: Any):
            started = time.perf_counter()
            try:
                return _original(self, *a, **k)
            finally:
                spent[_name] = spent.get(_name, 0.0) + time.perf_counter() - started

        setattr(cls, name, timed)
    return spent


def _sample(sample: dict[str, Any]) -> dict[str, Any]:
    """One logged sample: its prompt(s), what the model answered, the target, the metrics."""
    arguments = [list(arg) for arg in sample["arguments"]]  # one (prompt, ...) per request
    out: dict[str, Any] = {"doc_id": sample["doc_id"], "target": sample["target"]}
    if arguments and isinstance(arguments[0][1], dict):  # generate_until: (prompt, gen_kwargs)
        out["prompt"] = arguments[0][0]
        out["generation_kwargs"] = arguments[0][1]
        out["raw"] = sample["resps"][0][0]
        out["generated"] = sample["filtered_resps"][0]
    else:  # loglikelihood per choice: (prompt, continuation) -> (logprob, is_greedy)
        out["prompt"] = arguments[0][0]
        out["continuations"] = [cont for _, cont in arguments]
        out["loglikelihoods"] = [float(resp[0][0]) for resp in sample["resps"]]
        out["is_greedy"] = [bool(resp[0][1]) for resp in sample["resps"]]
    for metric in ("exact_match", "acc", "acc_norm"):
        if metric in sample:
            out[metric] = float(sample[metric])
    return out


def _plain(value: Any) -> Any:
    """A results dict as JSON (numpy scalars to floats, ``N/A`` strings kept)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item"):
        return value.item()
    return value


if __name__ == "__main__":
    main()
