"""Parts written before usage and grades had columns of their own (a part without a ``usage``
column): a language model's usage inside its output's JSON text, ``{"usage": {...}, "output":
...}``, a grader's grade inside the scores', ``{"grade": {...}, "scores": {...}}``; how their
readers (:mod:`evalq.shared.store.archive`) take them apart. In such a part, an output a plugin
shaped exactly like that is read as usage, as it was then; parts written since have none.
"""

from __future__ import annotations

from collections.abc import Container, Iterable

import pyarrow as pa

from evalq.shared.models import from_json, to_json

__all__ = ["enveloped_columns", "opened"]

OLD_USAGE = '{"usage":{"prompt_tokens":'
"""How an output stored with its usage began in a part written before usage had a column of
its own (no ``usage`` column): ``{"usage": {...}, "output": ...}``, as one JSON text."""
OLD_GRADE = '{"grade":{'
"""How scores stored with their grade began in such a part: ``{"grade": {...}, "scores":
{...}}``."""


def _unwrapped(
    text: str | None, prefix: str, inner: str, outer: str
) -> tuple[str | None, str | None]:
    """A text of a part written before usage and grades had columns of their own, taken apart
    when it begins with ``prefix``: (its member ``inner`` as JSON text, its member ``outer``),
    else (the text, None)."""
    if text is None or not text.startswith(prefix):
        return text, None
    value = from_json(text)
    if not isinstance(value, dict) or set(value) != {inner, outer}:
        return text, None
    return to_json(value[inner]), to_json(value[outer])


def opened(
    texts: dict[str, list[str | None]], read: Container[str], columns: Container[str]
) -> None:
    """Take the usage out of each output and the grade out of each scores of ``texts`` (a
    part's texts by column, those ``read`` from it), into ``texts["usage"]`` and
    ``texts["grade"]`` when ``columns`` asks for them."""
    if "output" in read:
        pairs = [_unwrapped(t, OLD_USAGE, "output", "usage") for t in texts["output"]]
        texts["output"] = [p[0] for p in pairs]
        if "usage" in columns:
            texts["usage"] = [p[1] for p in pairs]
    if "scores" in read:
        pairs = [_unwrapped(t, OLD_GRADE, "scores", "grade") for t in texts["scores"]]
        texts["scores"] = [p[0] for p in pairs]
        if "grade" in columns:
            texts["grade"] = [p[1] for p in pairs]


def enveloped_columns(columns: Iterable[str], schema: pa.Schema) -> list[str]:
    """The columns to read from a part for ``columns``: those it has, and in a part without
    a ``usage`` column, ``output`` for ``usage`` and ``scores`` for ``grade`` (they were stored
    inside those)."""
    wanted = set(columns)
    if "usage" not in schema.names:
        wanted |= {"output"} if "usage" in wanted else set()
        wanted |= {"scores"} if "grade" in wanted else set()
    return [c for c in schema.names if c in wanted]
