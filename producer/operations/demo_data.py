"""The demo dataset: short texts over six topics, deterministic for a given size and seed.

Written as one jsonl file per split (``train``, ``validation``, ``test``), each row
``{"text": ..., "label": ...}``, so it reads like any local ``--data`` folder.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from evalq.shared.evals.topic import DEFAULT_TOPICS

__all__ = ["write_demo_dataset"]

_SUBJECTS: dict[str, tuple[str, ...]] = {
    "sports": (
        "the striker",
        "the home team",
        "the goalkeeper",
        "the coach",
        "the sprinter",
        "the tennis champion",
        "the league leaders",
        "the marathon runner",
    ),
    "politics": (
        "the senator",
        "the prime minister",
        "the parliament",
        "the opposition party",
        "the governor",
        "the election committee",
        "the cabinet",
        "the mayor",
    ),
    "technology": (
        "the new smartphone",
        "the chip maker",
        "the software update",
        "the startup's app",
        "the cloud provider",
        "the laptop",
        "the AI model",
        "the open-source project",
    ),
    "food": (
        "the chef",
        "the bakery",
        "the new restaurant",
        "the pasta recipe",
        "the street food stall",
        "the pastry cook",
        "the vegan menu",
        "the food critic",
    ),
    "weather": (
        "the storm",
        "the heatwave",
        "the forecast",
        "the heavy rain",
        "the snowfall",
        "the cold front",
        "the hurricane",
        "the morning fog",
    ),
    "music": (
        "the band",
        "the orchestra",
        "the singer",
        "the new album",
        "the guitarist",
        "the jazz trio",
        "the concert tour",
        "the pianist",
    ),
}
_EVENTS: dict[str, tuple[str, ...]] = {
    "sports": (
        "scored twice in the final minutes",
        "won the championship match",
        "broke the world record at the stadium",
        "was injured during training",
        "signed a new contract with the club",
        "lost the semi-final on penalties",
    ),
    "politics": (
        "proposed a new tax law",
        "won the vote in the assembly",
        "faced criticism over the budget",
        "called for early elections",
        "signed a treaty with neighbouring countries",
        "debated the healthcare bill",
    ),
    "technology": (
        "released a faster processor",
        "fixed a security vulnerability",
        "launched a new operating system",
        "crashed after the latest patch",
        "doubled the battery life",
        "shipped a developer toolkit",
    ),
    "food": (
        "served a spicy curry with fresh herbs",
        "baked sourdough bread every morning",
        "opened a kitchen serving grilled fish",
        "won an award for its chocolate cake",
        "added a seasonal soup to the menu",
        "cooked dumplings with garlic sauce",
    ),
    "weather": (
        "brought strong winds to the coast",
        "pushed temperatures above forty degrees",
        "flooded several streets overnight",
        "left a thick layer of ice on the roads",
        "is expected to clear by the weekend",
        "caused thunder and lightning all night",
    ),
    "music": (
        "played a sold-out show",
        "recorded a song with a famous drummer",
        "topped the charts with a ballad",
        "performed a symphony by Beethoven",
        "released a live album",
        "rehearsed the melody for hours",
    ),
}
_TEMPLATES = ("{s} {e}.", "Yesterday {s} {e}.", "Reports say {s} {e}.", "{S} {e}, fans said.")
SPLITS = (("train", 0.4), ("validation", 0.4), ("test", 0.2))


def _row(rng: random.Random) -> dict[str, str]:
    topic = rng.choice(DEFAULT_TOPICS)
    subject = rng.choice(_SUBJECTS[topic])
    text = rng.choice(_TEMPLATES).format(
        s=subject, S=subject.capitalize(), e=rng.choice(_EVENTS[topic])
    )
    return {"text": text[0].upper() + text[1:], "label": topic}


def write_demo_dataset(folder: Path, validation_size: int = 2000, seed: int = 0) -> Path:
    """Write the demo splits into ``folder`` (same bytes for the same size and seed)."""
    folder.mkdir(parents=True, exist_ok=True)
    total = max(1, round(validation_size / 0.4))
    rng = random.Random(seed)
    for split, share in SPLITS:
        rows = validation_size if split == "validation" else max(1, round(total * share))
        lines = [json.dumps(_row(rng), sort_keys=True) for _ in range(rows)]
        (folder / f"{split}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder
