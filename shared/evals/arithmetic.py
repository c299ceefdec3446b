"""``arithmetic``: a toy calculator model scored by a scorer script (the script-scorer example).

Rows are ``{"question": "17 * 58", "answer": "986"}`` (answers of divisions are fractions such as
``"7/3"``). The model answers in decimals and, like a careless student, drops a carry when it
multiplies two numbers of 50 or more. ``scripts/check_number.py`` compares answers numerically,
in warm subprocesses on the worker; the tolerance travels as the ``CHECK_TOLERANCE`` variable.
"""

from __future__ import annotations

import random
from fractions import Fraction
from pathlib import Path
from typing import Any

from evalq.shared.evaluation import Evaluation, Parameters, register
from evalq.shared.scorer import ScriptCall, ScriptScorer

__all__ = ["Arithmetic", "arithmetic_rows"]

_OPS = ("+", "-", "*", "/")


def _exact(a: int, op: str, b: int) -> Fraction:
    if op == "+":
        return Fraction(a + b)
    if op == "-":
        return Fraction(a - b)
    if op == "*":
        return Fraction(a * b)
    return Fraction(a, b)


def arithmetic_rows(n: int, seed: int = 0) -> list[dict[str, str]]:
    """``n`` questions with exact answers, the same for the same seed."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b, op = rng.randint(1, 99), rng.randint(1, 99), rng.choice(_OPS)
        rows.append({"question": f"{a} {op} {b}", "answer": str(_exact(a, op, b))})
    return rows


@register("arithmetic")
class Arithmetic(Evaluation):
    """A calculator scored within a relative tolerance."""

    class Params(Parameters):
        tolerance: float = 1e-6
        """Relative tolerance of the numeric comparison."""

    args: Params
    label_fields = ("answer",)
    scorer = ScriptScorer(path=str(Path(__file__).with_name("scripts") / "check_number.py"))

    def infer(self, model: Any, rows: list[dict[str, Any]]) -> list[Any]:
        outputs = []
        for row in rows:
            left, op, right = str(row["question"]).split()
            a, b = int(left), int(right)
            value = _exact(a, op, b) + (10 if op == "*" and min(a, b) >= 50 else 0)
            outputs.append(f"{float(value):.10g}")
        return outputs

    def script_call(self, row: dict[str, Any], output: Any) -> ScriptCall:
        return ScriptCall(
            argv=[str(output), str(row["answer"])],
            env={"CHECK_TOLERANCE": repr(self.args.tolerance)},
        )

    def script_score(self, answer: str) -> dict[str, float]:
        return {"correct": float(answer)}
