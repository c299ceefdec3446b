"""lm-eval's hf rules re-implemented on plain transformers, checked against its own outputs.

``run_lmeval.py`` writes what lm-evaluation-harness produced; this script rebuilds the same
prompts from ``bench/lmeval/data`` by the rules written down in ``NOTES.md`` (no lm_eval import),
runs them through the same model with the same batching, and reports how far its outputs are
from lm-eval's: the generated texts must be equal, the log-likelihoods within float noise, and
acc / acc_norm / exact_match equal. It also times the plain loop, the floor for what evalq's
language-model evaluation costs per sample.

    python -m bench.lmeval.replay [--lmeval bench/results/lmeval.json] [--model DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data"
ARITH_PROMPT = "What is {a} plus {b}? Answer with only the number."
MC_PROMPT = "Question: {question}\nAnswer:"


def _rows(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (DATA / f"{name}.jsonl").read_text().splitlines()]


def _chat(tokenizer: Any, text: str) -> str:
    # lm-eval: one user turn, no system message (the template adds its default one)
    out: str = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}],
        tokenize=False,
        add_generation_prompt=True,
        continue_final_message=False,
    )
    return out


def _encode(tokenizer: Any, text: str) -> list[int]:
    # lm-eval's tok_encode: no special tokens when the text already starts with BOS; else the
    # tokenizer's default (this one adds none either way)
    bos = tokenizer.bos_token
    special = not (bos is not None and text.startswith(bos))
    ids: list[int] = tokenizer.encode(text, add_special_tokens=special)
    return ids


def generate(model: Any, tokenizer: Any, prompts: list[str], batch: int) -> list[str]:
    """generate_until with until=["\\n"], max_gen_toks=8, greedy."""
    import torch

    stops = ["\n", tokenizer.decode(tokenizer.eos_token_id, skip_special_tokens=False)]
    order = sorted(
        range(len(prompts)), key=lambda i: (-len(_encode(tokenizer, prompts[i])), prompts[i])
    )
    out: dict[int, str] = {}
    tokenizer.padding_side = "left"
    for start in range(0, len(order), batch):
        chunk = order[start : start + batch]
        texts = [prompts[i] for i in chunk]
        special = not texts[0].startswith(tokenizer.bos_token or "\0")
        enc = tokenizer(texts, padding="longest", return_tensors="pt", add_special_tokens=special)
        width = enc["input_ids"].shape[1]
        with torch.no_grad():
            seqs = model.generate(
                input_ids=enc["input_ids"],
                attention_mask=enc["attention_mask"],
                max_length=width + 8,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
                use_cache=True,
            )
        for i, seq in zip(chunk, seqs.tolist(), strict=True):
            text = tokenizer.decode(seq[width:], skip_special_tokens=True)
            for stop in stops:
                text = text.split(stop)[0]
            out[i] = text
    return [out[i] for i in range(len(prompts))]


def loglikelihoods(
    model: Any, tokenizer: Any, pairs: list[tuple[str, str]], batch: int
) -> list[tuple[float, bool]]:
    """lm-eval's loglikelihood: (sum of log p(continuation tokens), all of them greedy)."""
    import torch
    import torch.nn.functional as F

    encoded = []
    for given, answer in pairs:
        # trailing whitespace of the context moves to the continuation
        context = given.rstrip()
        continuation = given[len(context) :] + answer
        whole = _encode(tokenizer, context + continuation)
        ctx = _encode(tokenizer, context)
        encoded.append((ctx, whole[len(ctx) :]))
    # one forward per distinct ctx + cont[:-1] (lm-eval's logits cache), longest first
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, (ctx, cont) in enumerate(encoded):
        groups.setdefault(tuple(ctx + cont[:-1]), []).append(i)
    heads = [max(members, key=lambda i: len(encoded[i][1])) for members in groups.values()]
    heads.sort(
        key=lambda i: (-len(encoded[i][0] + encoded[i][1]), tuple(encoded[i][0] + encoded[i][1]))
    )
    results: dict[int, tuple[float, bool]] = {}
    for start in range(0, len(heads), batch):
        chunk = heads[start : start + batch]
        inputs = [(encoded[i][0] + encoded[i][1])[:-1] for i in chunk]
        width = max(map(len, inputs))
        padded = torch.tensor([ids + [0] * (width - len(ids)) for ids in inputs])  # right, id 0
        with torch.no_grad():
            logprobs = F.log_softmax(model(padded).logits, dim=-1)
        for row, i, ids in zip(logprobs, chunk, inputs, strict=True):
            ctx, cont = encoded[i]
            for member in groups[tuple(ctx + cont[:-1])]:
                member_cont = encoded[member][1]
                picked = row[len(ids) - len(member_cont) : len(ids)]
                target = torch.tensor(member_cont)
                greedy = bool((picked.argmax(dim=-1) == target).all())
                results[member] = (float(picked.gather(1, target[:, None]).sum()), greedy)
    return [results[i] for i in range(len(pairs))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lmeval", type=Path, default=REPO / "bench" / "results" / "lmeval.json")
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    reference = json.loads(args.lmeval.read_text())
    folder = args.model or Path(reference["model"])
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    batch = reference["batch_size"]
    for run, result in reference["runs"].items():
        chat = result["apply_chat_template"]
        ref = {o["doc_id"]: o for o in result["outputs"]}
        if result["task"] == "evalq_arith":
            rows = _rows("arith")[: len(ref)]
            prompts = [_chat(tokenizer, ARITH_PROMPT.format(**r)) for r in rows]
            started = time.perf_counter()
            texts = generate(model, tokenizer, prompts, batch)
            took = time.perf_counter() - started
            same_prompt = sum(p == ref[i]["prompt"] for i, p in enumerate(prompts))
            same = sum(t == ref[i]["generated"] for i, t in enumerate(texts))
            em = [float(t == str(r["answer"])) for t, r in zip(texts, rows, strict=True)]
            same_em = sum(e == ref[i]["exact_match"] for i, e in enumerate(em))
            print(
                f"{run}: prompts equal {same_prompt}/{len(rows)}, generations equal "
                f"{same}/{len(rows)}, exact_match equal {same_em}/{len(rows)}; plain loop "
                f"{took:.1f} s ({len(rows) / took:.2f} samples/s; lm-eval {result['model_s']} s)"
            )
            continue
        rows = _rows("mc")[: len(ref)]
        pairs, delimiter = [], "" if chat else " "
        for row in rows:
            text = MC_PROMPT.format(question=row["question"])
            context = _chat(tokenizer, text) if chat else text
            pairs += [(context, f"{delimiter}{choice}") for choice in row["choices"]]
        started = time.perf_counter()
        scored = loglikelihoods(model, tokenizer, pairs, batch)
        took = time.perf_counter() - started
        worst, same_greedy, same_acc, same_prompt = 0.0, 0, 0, 0
        for i, row in enumerate(rows):
            mine = scored[4 * i : 4 * i + 4]
            lls = np.array([ll for ll, _ in mine])
            worst = max(worst, float(np.abs(lls - np.array(ref[i]["loglikelihoods"])).max()))
            same_greedy += [g for _, g in mine] == ref[i]["is_greedy"]
            same_prompt += pairs[4 * i][0] == ref[i]["prompt"]
            acc = float(np.argmax(lls) == row["label"])
            lengths = np.array([float(len(c)) for c in row["choices"]])
            acc_norm = float(np.argmax(lls / lengths) == row["label"])
            same_acc += (acc, acc_norm) == (ref[i]["acc"], ref[i]["acc_norm"])
        print(
            f"{run}: prompts equal {same_prompt}/{len(rows)}, max |loglikelihood - lm-eval's| "
            f"{worst:.2e}, is_greedy equal {same_greedy}/{len(rows)}, acc and acc_norm equal "
            f"{same_acc}/{len(rows)}; plain loop {took:.1f} s ({len(rows) / took:.2f} samples/s; "
            f"lm-eval {result['model_s']} s)"
        )


if __name__ == "__main__":
    main()
