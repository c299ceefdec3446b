"""``null``: a model that answers instantly, to measure evalq's own overhead per sample."""

from __future__ import annotations

from typing import Any

from evalq.shared.evaluation import Evaluation, register

__all__ = ["NullModel"]


@register("null")
class NullModel(Evaluation):
    """Outputs ``0`` for every row and scores every sample ``1.0``."""

    label_fields = ("label",)

    def infer(self, model: Any, rows: list[dict[str, Any]]) -> list[Any]:
        return [0] * len(rows)

    def score(self, row: dict[str, Any], output: Any) -> dict[str, float]:
        return {"ok": 1.0}
