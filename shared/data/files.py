"""Data file names: which ``datasets`` builder reads a file, and which split a file holds.

The same rules name the splits of a local folder and of an object-store prefix:
``test.jsonl`` holds split ``test``; ``validation-00001-of-00002.parquet`` is one of the files
of split ``validation``; ``test-hard.jsonl`` holds split ``test-hard``, never part of ``test``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import PurePath
from typing import TypeVar

from evalq.shared.data.spec import LocalFormat
from evalq.shared.errors import DataError

__all__ = ["FORMATS", "by_split", "format_of", "split_of"]

P = TypeVar("P", bound=PurePath)

FORMATS: dict[str, LocalFormat] = {
    ".parquet": "parquet",
    ".jsonl": "json",
    ".json": "json",
    ".csv": "csv",
    ".arrow": "arrow",
}
"""The builder that reads each file suffix; files of other suffixes are not data."""

_SHARD_FILE = re.compile(r"^(?P<split>.+)-\d{5}-of-\d{5}$")
"""A split stored in several files, the Hugging Face way: ``validation-00001-of-00002``."""


def split_of(path: PurePath) -> str:
    """The split a file holds: its stem, without a ``-NNNNN-of-NNNNN`` shard suffix. Nothing
    else is cut off: ``test-hard.jsonl`` holds split ``test-hard``, never part of ``test``."""
    stem = path.name.removesuffix(path.suffix)
    shard = _SHARD_FILE.match(stem)
    return shard["split"] if shard else stem


def by_split(files: Iterable[P]) -> dict[str, list[P]]:
    """``files`` grouped by the split each holds, splits sorted, files in the order given."""
    grouped: dict[str, list[P]] = {}
    for path in files:
        grouped.setdefault(split_of(path), []).append(path)
    return dict(sorted(grouped.items()))


def format_of(where: str, split: str, chosen: Sequence[PurePath]) -> LocalFormat:
    """The one format of a split's files; a split whose files mix formats is a
    :class:`DataError` naming ``where`` they are."""
    formats = {FORMATS[p.suffix] for p in chosen}
    if len(formats) > 1:
        raise DataError(f"split '{split}' in {where} mixes formats: {', '.join(sorted(formats))}")
    return formats.pop()
