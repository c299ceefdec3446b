"""Where a benchmark's figures go: indented JSON under ``bench/results/``, said on the console."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

__all__ = ["save"]


def save(path: Path, value: object, console: Console) -> None:
    """Write ``value`` to ``path`` as indented JSON (making its folder) and say where."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2) + "\n")
    console.print(f"wrote {path}")
