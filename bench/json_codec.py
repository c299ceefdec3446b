"""The worker's JSON encoding and decoding (``evalq.shared.jsontext.to_json`` / ``from_json``) on
the values it stores, beside the standard library's ``json.dumps`` / ``json.loads`` with the same
options, in one process: microseconds per call, the best of several repeats.

Run as ``python -m bench.json_codec`` (figures in bench/README.md).
"""

from __future__ import annotations

import json
import timeit
from collections.abc import Callable
from functools import partial
from typing import Any

from evalq.shared.models import from_json, to_json

REPEATS = 7
"""Timed repeats of each measurement; the best is reported (the others wait on the machine)."""

_ANSWER = (
    "Let me work this out step by step. Sarah has 12 apples and gives away 5, so she has 7 left. "
    "Then she buys 3 times as many as she has: 7 \u00d7 3 = 21, which makes 28 in all. Answer: 28"
)

VALUES: dict[str, Any] = {
    "generated text (180 chars)": _ANSWER,
    "generated text (4 KB)": _ANSWER * 23,
    "label (short str)": "sports",
    "scores (2 metrics)": {"acc": 1.0, "exact_match": 0.0},
    "choice log-likelihoods (4 floats)": [-12.53125, -9.0625, -15.21875, -11.796875],
    "usage": {"prompt_tokens": 412, "completion_tokens": 57},
    "grade": {
        "grader": "openai/judge",
        "prompt": "Question: ...\nAnswer: " + _ANSWER + "\nGrade it.",
        "verdict": "The answer is right. GRADE: C",
        "usage": {"prompt_tokens": 128, "completion_tokens": 9, "cached": False},
    },
    "python output (nested dict)": {
        "label": "business",
        "probs": [0.01, 0.02, 0.9, 0.07],
        "meta": {"tokens": 31, "truncated": False, "lang": "en"},
    },
}


def _best(call: Callable[[], object], number: int) -> float:
    """Microseconds per call of ``call``, the best of :data:`REPEATS` timings of ``number``."""
    return min(timeit.repeat(call, number=number, repeat=REPEATS)) / number * 1e6


def main() -> None:
    print("| value | to_json µs | json.dumps µs | from_json µs | json.loads µs |")
    print("|---|---:|---:|---:|---:|")
    for name, value in VALUES.items():
        text = to_json(value)
        assert from_json(text) == value
        number = 20_000
        row = [
            _best(partial(to_json, value), number),
            _best(partial(json.dumps, value, separators=(",", ":"), allow_nan=False), number),
            _best(partial(from_json, text), number),
            _best(partial(json.loads, text), number),
        ]
        print(f"| {name} | " + " | ".join(f"{r:.2f}" for r in row) + " |")


if __name__ == "__main__":
    main()
