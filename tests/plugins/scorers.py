"""A Python scorer of a plugin module that the gateway and the workers load and a caller's CLI
need not (``EVALQ_PLUGINS=tests.plugins,tests.plugins.scorers``): kept out of
:mod:`tests.plugins`, which every test process imports, so the built-in scorers stay the only
ones registered there."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from evalq.shared.lm.scorers import last_number, register_scorer
from evalq.shared.lm.task import TaskSpec

__all__ = ["gsm8k_match"]


@register_scorer("gsm8k_match", metrics={"gsm8k_match": (0.0, 1.0)})
def gsm8k_match(output: Any, row: Mapping[str, Any], task: TaskSpec) -> dict[str, float]:
    """1 when the output's last number is the one after ``####`` in a GSM8K-style answer."""
    gold = last_number(str(task.label(row)).rsplit("####", 1)[-1])
    return {"gsm8k_match": float(gold is not None and last_number(str(output)) == gold)}
