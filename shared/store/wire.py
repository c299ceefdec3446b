"""The texts the result store holds, and what they travel as: a sample's JSON line (``evalq
results``, the gateway's streams and export), its :class:`SampleResult`, and back.

The store keeps each sample's output, scores and error as JSON text (:func:`to_json` and
``model_dump_json`` wrote them), and a language model's usage and a grader's grade as texts of
their own beside them (never inside an output or scores: a plugin's output shaped like usage
stays an output); a line is built from those texts without parsing them, and gives exactly
the text a result's line gives.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import cast

from evalq.shared.models import (
    ErrorRecord,
    Grade,
    SampleResult,
    Usage,
    from_json,
    scores_values,
    to_json,
)
from evalq.shared.store.archive import Chunk

__all__ = [
    "SPAN_MAX",
    "as_chunks",
    "chunk_lines",
    "consecutive",
    "error_kind",
    "result_line",
    "result_of",
    "results_of",
    "scores_of",
    "span_bounds",
    "span_of",
    "spans",
    "text_line",
]

SPAN_MAX = 4096
"""The most samples one span holds: a batch's texts for samples ``lo`` to ``hi``, every one,
stored as one field ``lo-hi`` of a run's ``out`` or ``score`` hash (joined by newlines, which
no JSON text holds unescaped), so that a batch costs Redis a few calls and one field however
many samples it has. Readers look for the spans that may hold an id ``i`` among those starting
from ``i - SPAN_MAX + 1`` on."""


def text_line(
    sample_id: int,
    output: str | None,
    scores: str | None,
    error: str | None,
    *,
    usage: str | None = None,
    grade: str | None = None,
) -> str:
    """One sample's JSON line (``evalq results``) from the texts the store holds: absent values
    (and an output of JSON ``null``) left out; the members in :class:`SampleResult`'s order."""
    line = f'{{"sample_id":{sample_id}'
    if output is not None and output != "null":
        line += f',"output":{output}'
    if usage is not None:
        line += f',"usage":{usage}'
    if scores is not None:
        line += f',"scores":{scores}'
    if grade is not None:
        line += f',"grade":{grade}'
    if error is not None:
        line += f',"error":{error}'
    return line + "}\n"


def _rows(
    chunk: Chunk,
) -> Iterator[tuple[int, str | None, str | None, str | None, str | None, str | None]]:
    """A chunk's samples: id, output, scores, error, usage, grade (:func:`text_line`'s order)."""
    return zip(
        chunk.sample_ids,
        chunk.outputs,
        chunk.scores,
        chunk.errors,
        chunk.usages,
        chunk.grades,
        strict=True,
    )


def chunk_lines(chunk: Chunk) -> Iterator[str]:
    """The JSON lines of a chunk's samples."""
    for sample_id, output, scores, error, usage, grade in _rows(chunk):
        yield text_line(sample_id, output, scores, error, usage=usage, grade=grade)


def result_line(result: SampleResult) -> str:
    """A result's JSON line, the same text :func:`text_line` gives for the texts it was read
    from (those were written by :func:`to_json` and ``model_dump_json``); with its input, as
    pydantic writes it."""
    if result.input is not None:
        return result.model_dump_json(exclude_none=True) + "\n"
    return text_line(
        result.sample_id,
        None if result.output is None else to_json(result.output),
        None if result.scores is None else to_json(result.scores),
        None if result.error is None else result.error.model_dump_json(),
        usage=None if result.usage is None else result.usage.stored(),
        grade=None if result.grade is None else result.grade.stored(),
    )


def result_of(
    sample_id: int,
    output: str | None,
    scores: str | None,
    error: str | None,
    *,
    usage: str | None = None,
    grade: str | None = None,
) -> SampleResult:
    """A sample's result from the texts the store holds."""
    return SampleResult(
        sample_id=sample_id,
        output=None if output is None else from_json(output),
        usage=None if usage is None else Usage.model_validate_json(usage),
        scores=None if scores is None else dict(from_json(scores)),
        grade=None if grade is None else Grade.model_validate_json(grade),
        error=None if error is None else ErrorRecord.model_validate_json(error),
    )


def results_of(chunk: Chunk) -> Iterator[SampleResult]:
    """Each of a chunk's samples' result, from the texts the store holds."""
    for sample_id, output, scores, error, usage, grade in _rows(chunk):
        yield result_of(sample_id, output, scores, error, usage=usage, grade=grade)


def as_chunks(results: Iterable[SampleResult], size: int) -> Iterator[Chunk]:
    """Results read back (from the gateway, say) as the store's texts (:func:`to_json`, as
    they were written), ``size`` at a time; an output of JSON ``null`` reads as no output: a
    result does not tell them apart."""
    batch: list[SampleResult] = []
    for result in results:
        batch.append(result)
        if len(batch) >= size:
            yield _texts(batch)
            batch = []
    if batch:
        yield _texts(batch)


def _texts(results: list[SampleResult]) -> Chunk:
    return Chunk(
        [r.sample_id for r in results],
        [None if r.output is None else to_json(r.output) for r in results],
        [None if r.scores is None else to_json(r.scores) for r in results],
        [None if r.error is None else r.error.model_dump_json() for r in results],
        [None if r.usage is None else r.usage.stored() for r in results],
        [None if r.grade is None else r.grade.stored() for r in results],
    )


def scores_of(sample_ids: list[int], texts: list[str | None]) -> dict[int, dict[str, float]]:
    """The metrics of the scored ones of ``sample_ids``, from their scores' JSON ``texts``."""
    if len(sample_ids) != len(texts):
        raise ValueError(f"{len(sample_ids)} sample ids for {len(texts)} texts")
    if None not in texts:
        return dict(zip(sample_ids, scores_values(cast(list[str], texts)), strict=True))
    scored = [(i, text) for i, text in zip(sample_ids, texts, strict=True) if text is not None]
    values = scores_values([text for _, text in scored])
    return {i: value for (i, _), value in zip(scored, values, strict=True)}


SPAN_BYTES = 2**20
"""The most characters a span's joined texts take: a reader of one sample of a span reads the
whole span, so large outputs go one by one (a results stream reading 16 outputs of 250 KB
read their 50 MB span each time: the gateway's 8 unread streams grew it by 2.4 GB)."""


def error_kind(raw: str) -> str:
    """An error record's (JSON) stage and exception class, e.g. ``infer/RuntimeError``."""
    return ErrorRecord.model_validate_json(raw).stage_kind


def span_of(texts: dict[int, str]) -> tuple[int, str] | None:
    """``texts`` (sample id -> JSON text, in id order) as one span (its first id, its texts
    joined), when they are the samples ``lo`` to ``lo + n - 1`` (2 to :data:`SPAN_MAX` of
    them), none holds a newline and they take at most :data:`SPAN_BYTES`; else None: they go
    one by one (so do a batch's texts that have usages or grades beside them: the scripts
    read those one by one)."""
    n = len(texts)
    if n < 2 or n > SPAN_MAX:
        return None
    ids = list(texts)
    if not consecutive(ids):
        return None
    joined = "\n".join(texts.values())
    if len(joined) > SPAN_BYTES or joined.count("\n") != n - 1:
        return None
    return ids[0], joined


def consecutive(ids: Sequence[int]) -> bool:
    """``ids`` are ``lo``, ``lo + 1``, ... (one at least): a span's samples, or a message's
    that travels as ``-n, lo``."""
    return bool(ids) and list(ids) == list(range(ids[0], ids[0] + len(ids)))


def span_bounds(field: str) -> tuple[int, int] | None:
    """The first and last sample of the span ``field`` (``lo-hi``, as a span's field and a
    settled-stream entry name it); None for a single sample's id."""
    lo, dash, hi = field.partition("-")
    return (int(lo), int(hi)) if dash else None


def spans(fields: Iterable[str], texts: Iterable[str | None]) -> Iterator[tuple[int, str]]:
    """(sample id, text) of every sample of the spans named by ``fields`` (``lo-hi``), whose
    ``texts`` were read with them (None: gone meanwhile, spilled)."""
    for field, joined in zip(fields, texts, strict=True):
        bounds = span_bounds(field)
        if joined is not None and bounds is not None:
            yield from enumerate(joined.split("\n"), bounds[0])
