"""The two small datasets evalq and lm-evaluation-harness are compared on, written as JSONL.

Deterministic (one seeded ``random.Random``): the same rows, in the same order, every time, so
the prompts fed to lm-eval (``bench/lmeval/tasks/*.yaml``) can be fed to evalq unchanged.

- ``arith.jsonl``: 200 rows ``{"a", "b", "answer"}``; the prompt is "What is {a} plus {b}?
  Answer with only the number." (generative, exact match against ``str(answer)``).
- ``mc.jsonl``: 100 rows ``{"question", "choices", "label"}``: four options, ``label`` the index
  of the right one (multiple choice by log-likelihood).

    python -m bench.lmeval.make_data [--out bench/lmeval/data]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

SEED = 20261124
ARITH_ROWS = 200
DATA = Path(__file__).parent / "data"

# (question template, facts): each fact's answer is right for its own question and a wrong
# option for the others of its kind.
_CAPITALS = {
    "France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid",
    "Japan": "Tokyo", "China": "Beijing", "Russia": "Moscow", "Egypt": "Cairo",
    "Greece": "Athens", "Portugal": "Lisbon", "Austria": "Vienna", "Poland": "Warsaw",
    "Ireland": "Dublin", "Norway": "Oslo", "Sweden": "Stockholm", "Finland": "Helsinki",
    "Denmark": "Copenhagen", "Hungary": "Budapest", "Canada": "Ottawa", "Mexico": "Mexico City",
    "Argentina": "Buenos Aires", "Peru": "Lima", "Kenya": "Nairobi", "Thailand": "Bangkok",
    "the United Kingdom": "London",
}  # fmt: skip
_OPPOSITES = {
    "hot": "cold", "big": "small", "fast": "slow", "up": "down", "happy": "sad",
    "light": "dark", "open": "closed", "early": "late", "full": "empty", "old": "young",
    "strong": "weak", "wet": "dry", "high": "low", "loud": "quiet", "rich": "poor",
    "hard": "soft", "long": "short", "thick": "thin", "near": "far", "clean": "dirty",
    "inside": "outside", "first": "last", "heavy": "light", "win": "lose", "push": "pull",
}  # fmt: skip
_SOUNDS = {
    "dog": "bark", "cat": "meow", "cow": "moo", "sheep": "baa", "duck": "quack",
    "lion": "roar", "snake": "hiss", "horse": "neigh", "owl": "hoot", "pig": "oink",
    "bee": "buzz", "frog": "croak", "rooster": "crow", "mouse": "squeak", "wolf": "howl",
}  # fmt: skip
_COLOURS = {
    "the sky on a clear day": "blue", "grass": "green", "snow": "white", "coal": "black",
    "a ripe banana": "yellow", "blood": "red", "an orange": "orange", "a ripe tomato": "red",
    "milk": "white", "a lemon": "yellow", "a leaf in summer": "green", "the night sky": "black",
    "an eggplant": "purple", "chocolate": "brown", "a flamingo": "pink",
}  # fmt: skip
_PLURALS = {
    "mouse": "mice", "child": "children", "foot": "feet", "tooth": "teeth", "goose": "geese",
    "man": "men", "woman": "women", "person": "people", "cactus": "cacti", "ox": "oxen",
    "leaf": "leaves", "knife": "knives", "wolf": "wolves", "box": "boxes", "city": "cities",
    "baby": "babies", "fish": "fish", "sheep": "sheep", "bus": "buses", "potato": "potatoes",
}  # fmt: skip
_KINDS: list[tuple[str, dict[str, str]]] = [
    ("What is the capital of {}?", _CAPITALS),
    ("What is the opposite of {}?", _OPPOSITES),
    ("What sound does a {} make?", _SOUNDS),
    ("What colour is {}?", _COLOURS),
    ("What is the plural of {}?", _PLURALS),
]


def arithmetic(rng: random.Random, rows: int = ARITH_ROWS) -> list[dict[str, int]]:
    """Sums of two numbers below 100: easy enough that a 135M model gets some right."""
    out = []
    for _ in range(rows):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        out.append({"a": a, "b": b, "answer": a + b})
    return out


def multiple_choice(rng: random.Random) -> list[dict[str, object]]:
    """Every fact of every kind once (100 rows), options shuffled, distractors of its kind."""
    out: list[dict[str, object]] = []
    for template, facts in _KINDS:
        for subject, answer in facts.items():
            wrong = sorted({value for value in facts.values() if value != answer})
            choices = [answer, *rng.sample(wrong, 3)]
            rng.shuffle(choices)
            out.append(
                {
                    "question": template.format(subject),
                    "choices": choices,
                    "label": choices.index(answer),
                }
            )
    rng.shuffle(out)
    return out


def write(folder: Path = DATA) -> dict[str, Path]:
    """Both files under ``folder``; returns their paths by task."""
    rng = random.Random(SEED)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, rows in (("arith", arithmetic(rng)), ("mc", multiple_choice(rng))):
        path = folder / f"{name}.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        paths[name] = path
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DATA)
    for name, path in write(parser.parse_args().out).items():
        print(f"{name}: {sum(1 for _ in path.open())} rows in {path}")


if __name__ == "__main__":
    main()
