"""Sweeps: ``submit --sweep k=v1,v2 --sweep j=w1,w2`` (or ``--sweep-file``) submits the grid of
parameter values as runs sharing a sweep id, which ``runs --sweep`` and ``compare --sweep``
take."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from evalq.shared.errors import InputError

__all__ = ["MAX_GRID", "grid", "new_sweep_id", "parse_sweeps", "read_sweep_file"]

MAX_GRID = 256
"""Runs one sweep may submit at most (a typo in a grid should not submit thousands)."""


def parse_sweeps(pairs: Sequence[str]) -> dict[str, list[str]]:
    """``["k=v1,v2", ...]`` -> ``{"k": ["v1", "v2"]}``."""
    sweeps: dict[str, list[str]] = {}
    for pair in pairs:
        key, sep, values = pair.partition("=")
        key = key.strip()
        choices = [v.strip() for v in values.split(",")]
        if not sep or not key or not all(choices):
            raise InputError(f"--sweep takes key=value1,value2,..., got {pair!r}")
        if key in sweeps:
            raise InputError(f"--sweep {key} is given twice")
        sweeps[key] = choices
    return sweeps


def read_sweep_file(path: Path) -> dict[str, list[str]]:
    """A YAML (or JSON) mapping of parameter -> list of values (or one value), every value
    as written."""
    import yaml  # here: the CLI imports this module (for MAX_GRID) at every start

    try:  # BaseLoader: every scalar stays the text written (007, off, 12:30 are not cast)
        loaded = yaml.load(path.read_text(encoding="utf-8"), Loader=yaml.BaseLoader)
    except (OSError, yaml.YAMLError) as exc:
        raise InputError(f"cannot read sweep file {path}: {exc}") from exc
    if not isinstance(loaded, Mapping) or not loaded:
        raise InputError(f"sweep file {path}: expected a mapping of parameter -> values")
    sweeps: dict[str, list[str]] = {}
    for key, values in loaded.items():
        choices = values if isinstance(values, list) else [values]
        if (
            not isinstance(key, str)
            or not choices
            or any(isinstance(v, dict | list) for v in choices)
        ):
            raise InputError(f"sweep file {path}: {key!r} needs a value or a list of values")
        sweeps[key] = [str(v) for v in choices]
    return sweeps


def grid(params: Mapping[str, str], sweeps: Mapping[str, Sequence[str]]) -> list[dict[str, str]]:
    """Every combination of the swept values, each on top of ``params`` (a swept key wins)."""
    size = 1
    for values in sweeps.values():
        size *= len(values)
    if size > MAX_GRID:
        raise InputError(f"the sweep's grid has {size} runs; at most {MAX_GRID}")
    keys = list(sweeps)
    return [
        {**params, **dict(zip(keys, combination, strict=True))}
        for combination in itertools.product(*(sweeps[k] for k in keys))
    ]


def new_sweep_id() -> str:
    """A fresh sweep id."""
    return uuid.uuid4().hex[:12]
