"""The per-sample result store: outputs, scores and errors written once each, progress counters
bumped only by real writes, and the run's aggregate computed once from what is stored.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import pyarrow as pa
import redis
from redis.client import NEVER_DECODE

from shared.errors import ArchiveUnreadableError, UnknownRunError, first_line
from shared.evaluation import Evaluation
from shared.failures import Counted, FailureRule, metric_samples
from shared.keys import RunKeys
from shared.models import ErrorRecord, Progress, RunStatus, SampleResult, Stage, to_json
from shared.stats import Stat, describe
from shared.store.archive import RAW_COLUMNS, ArchiveReader, Chunk, inside, read_part, run_folder
from shared.store.runs import RunStore
from shared.store.scripts import register

log = logging.getLogger(__name__)

T = TypeVar("T")

Clusters = Callable[[list[int]], Mapping[int, str] | None]
"""Sample ids -> each one's cluster (read from the rows when the finalizer asks)."""

__all__ = [
    "Finished",
    "ResultStore",
    "Settled",
    "as_chunks",
    "bucketed",
    "chunk_lines",
    "error_kinds",
    "result_line",
    "result_of",
    "text_line",
    "to_json",
]

_SCAN_COUNT = 1000
_BITMAP_SPAN = 65_536
"""Bytes of the spilled bitmap read at once for ids close together; ids further apart have
their bits read one by one."""
_STABLE_TRIES = 5
"""Reads of a going run's error counts before one no spill overlapped is given up on."""
_ARCHIVE_SCAN = 65_536
"""Samples looked at a time when a few are read back from an archive."""


def _flatten(values: Mapping[Any, str | int]) -> list[Any]:
    """``{key: value}`` as the flat ``key1, value1, key2, value2, ...`` the scripts take."""
    return [item for pair in values.items() for item in pair]


@dataclass(frozen=True)
class Settled:
    """What one settling write did."""

    finalize: bool
    """This caller must finalize the run."""
    written: int
    """Samples it settled."""
    settled: int
    """The run's samples settled so far."""

    def filled(self, rows: int) -> bool:
        """This write took the run's settled samples past a multiple of ``rows``: a segment
        may be complete (see ``EVALQ_SPILL_ROWS``)."""
        before = self.settled - self.written
        return rows > 0 and self.written > 0 and before // rows < self.settled // rows


@dataclass(frozen=True)
class Finished:
    """How :meth:`ResultStore.finalize` ended a run."""

    status: RunStatus
    aggregate: dict[str, float]
    reason: str | None


def text_line(sample_id: int, output: str | None, scores: str | None, error: str | None) -> str:
    """One sample's JSON line (``evalq results``) from the texts the store holds: absent values
    (and an output of JSON ``null``) left out."""
    line = f'{{"sample_id":{sample_id}'
    if output is not None and output != "null":
        line += f',"output":{output}'
    if scores is not None:
        line += f',"scores":{scores}'
    if error is not None:
        line += f',"error":{error}'
    return line + "}\n"


def chunk_lines(chunk: Chunk) -> Iterator[str]:
    """The JSON lines of a chunk's samples."""
    for values in zip(chunk.sample_ids, chunk.outputs, chunk.scores, chunk.errors, strict=True):
        yield text_line(*values)


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
    )


def error_kinds(records: Iterable[str]) -> dict[str, int]:
    """Error records (JSON) counted by stage and exception class, e.g. ``infer/RuntimeError``,
    most common first."""
    return dict(Counter(_kind(raw) for raw in records).most_common())


def _kind(raw: str) -> str:
    """An error record's (JSON) stage and exception class, e.g. ``infer/RuntimeError``."""
    error = ErrorRecord.model_validate_json(raw)
    return f"{error.stage.value}/{error.kind}"


TIMELINE_STEP = 0.01
"""Seconds: the settled timeline an archive keeps is summed by this step."""


def bucketed(timeline: Iterable[tuple[float, int]]) -> list[tuple[float, int]]:
    """A timeline summed by :data:`TIMELINE_STEP` (how an archive keeps it)."""
    steps: Counter[int] = Counter()
    for at, count in timeline:
        steps[int(at / TIMELINE_STEP)] += count
    return [(step * TIMELINE_STEP, count) for step, count in sorted(steps.items())]


def _settled_ids(fields: Any) -> list[int]:
    """The sample ids of one entry of a run's settled stream (written by ``settle.lua``)."""
    return [int(i) for i in str(fields["ids"]).split(",")]


def result_of(
    sample_id: int, output: str | None, scores: str | None, error: str | None
) -> SampleResult:
    """A sample's result from the texts the store holds."""
    return SampleResult(
        sample_id=sample_id,
        output=None if output is None else json.loads(output),
        scores=None if scores is None else json.loads(scores),
        error=None if error is None else ErrorRecord.model_validate_json(error),
    )


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
    )


def _results(chunk: Chunk) -> Iterator[SampleResult]:
    """Each sample's result from the texts the store holds."""
    for values in zip(chunk.sample_ids, chunk.outputs, chunk.scores, chunk.errors, strict=True):
        yield result_of(*values)


@dataclass
class Spill:
    """A going run's spilled segments as a reader last saw them (``evalq:{run}:spill``), and
    the last part it read back (readers go through a run in order)."""

    run_id: str
    folder: str
    """The only folder a part is read from (workers name the parts)."""
    rows: int = 0
    """Samples per segment (0: nothing spilled yet)."""
    samples: int = 0
    """Samples spilled."""
    parts: dict[int, str] = field(default_factory=dict)
    """Segment index -> its part's URL."""
    _last: tuple[int, Chunk] | None = None

    def update(self, raw: Mapping[Any, Any]) -> None:
        """Take the hash as read now (spills only add segments)."""
        self.rows = int(raw.get("rows", 0))
        self.samples = int(raw.get("samples", 0))
        self.parts = {int(k): str(v) for k, v in raw.items() if str(k).isdigit()}

    def segment(self, position: int) -> int | None:
        """The spilled segment holding the sample at ``position`` of the run's ids, if any."""
        if not self.rows:
            return None
        index = position // self.rows
        return index if index in self.parts else None

    def url(self, index: int) -> str:
        """Segment ``index``'s part, where the record (which workers write) names it: only
        inside the run's spill folder, else :class:`ArchiveUnreadableError`."""
        url = self.parts[index]
        if not self.folder or not inside(url, self.folder):
            raise ArchiveUnreadableError(
                f"run {self.run_id}: its record names a spilled part outside the run's own "
                "folder; it is not read"
            )
        return url

    def part(self, index: int) -> Chunk:
        """Segment ``index``'s texts, read back from its part."""
        if self._last is None or self._last[0] != index:
            self._last = (index, read_part(self.url(index), self.run_id))
        return self._last[1]

    def texts(self, position: int) -> tuple[str | None, str | None, str | None]:
        """The texts of the sample at ``position`` (in a spilled segment)."""
        index = self.segment(position)
        assert index is not None
        chunk, row = self.part(index), position - index * self.rows
        return chunk.outputs[row], chunk.scores[row], chunk.errors[row]

    def by_id(self, sample_ids: Iterable[int]) -> dict[int, tuple[str | None, ...]]:
        """The texts of spilled samples known by id only, looked for part by part."""
        wanted, found = set(sample_ids), dict[int, tuple[str | None, ...]]()
        for index in sorted(self.parts):
            if len(found) == len(wanted):
                break
            if self._last is None or self._last[0] != index:  # its ids first: they are small
                ids = read_part(self.url(index), self.run_id, ()).sample_ids
                if wanted.isdisjoint(ids):
                    continue
            found.update(self.part(index).texts_of(wanted))
        return found


@dataclass(frozen=True)
class _Live:
    """Samples' values in some of a run's hashes, read in one pipeline."""

    values: list[list[str | None]]
    spilled: set[int]
    """Those of the samples moved to a spilled part (their values are there, not here)."""


def _parse_scores(
    sample_ids: list[int], texts: list[str | None], into: dict[int, dict[str, float]]
) -> None:
    """Add the scored ones of ``sample_ids`` (their scores' JSON ``texts``) to ``into``."""
    for i, text in zip(sample_ids, texts, strict=True):
        if text is not None:
            into[i] = json.loads(text)


def _bits(sample_ids: list[int]) -> tuple[int, int]:
    """The byte range of a bitmap that holds ``sample_ids``' bits."""
    return min(sample_ids) >> 3, max(sample_ids) >> 3


def _set(bitmap: bytes, first: int, sample_id: int) -> bool:
    """Redis's bit order: bit 0 is the highest bit of byte 0."""
    at = (sample_id >> 3) - first
    return at < len(bitmap) and bool(bitmap[at] >> (7 - (sample_id & 7)) & 1)


_SIZES = 4096
"""Runs whose sample count a :class:`ResultStore` keeps (oldest dropped first)."""


class ResultStore:
    """Per-sample writes (through Lua) and reads for runs, live (pipelines and scans) or, once
    a run is archived (:mod:`shared.store.archive`), from its Parquet folder: every read below gives
    the same answer either way, and a read that a seal overtakes goes on from the archive where
    it stood. A going run's spilled segments (:class:`Spill`) read from their parts, and
    every write skips a spilled sample. Owns ``attempt.lua``, ``record_outputs.lua``,
    ``settle.lua``, ``finish.lua``, ``recover.lua``, ``spill.lua`` and ``seal.lua``."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._attempt = register(client, "shared.store", "attempt")
        self._record_outputs = register(client, "shared.store", "record_outputs")
        self._settle_script = register(client, "shared.store", "settle")
        self._finish = register(client, "shared.store", "finish")
        self._recover = register(client, "shared.store", "recover")
        self._seal = register(client, "shared.store", "seal")
        self._spill = register(client, "shared.store", "spill")
        self._sizes: dict[str, int] = {}

    def _size(self, run_id: str) -> int:
        """The run's sample count, from its facts (-1: no such run). Passed to the scripts that
        need it as an argument: a key the caller may only read cannot be a script's key
        (Redis's ACL asks for write access to every key of ``EVALSHA``). Facts never change,
        so each run's is read once."""
        size = self._sizes.get(run_id)
        if size is None:
            found = self._client.hget(RunKeys(run_id).facts, "n")
            if found is None:
                return -1
            size = self._sizes[run_id] = int(found)
            if len(self._sizes) > _SIZES:
                del self._sizes[next(iter(self._sizes))]
        return size

    def archive_url(self, run_id: str) -> str | None:
        """The folder the run's record names as its archive (None while its results live in
        Redis). Workers write that name, so it is followed only inside the run's folder under
        the archive location its facts name; anything else raises
        :class:`ArchiveUnreadableError`."""
        keys = RunKeys(run_id)
        with self._client.pipeline(transaction=False) as pipe:
            pipe.hget(keys.meta, "archive_url")
            pipe.hget(keys.facts, "archive")
            url, base = pipe.execute()
        if url is None:
            return None
        if base is None or not inside(str(url), run_folder(str(base), run_id)):
            raise ArchiveUnreadableError(
                f"run {run_id}: its record names an archive outside the run's own folder; "
                "it is not read (an operator should look at evalq:{run}:meta)"
            )
        return str(url)

    def archive(self, run_id: str) -> ArchiveReader | None:
        """The run's archive, once it is sealed (None while its results live in Redis)."""
        url = self.archive_url(run_id)
        return None if url is None else ArchiveReader(url, run_id)

    def _archive_after_seal(self, run_id: str) -> ArchiveReader:
        """The archive of a run whose live keys are gone: sealed, or there is no such run."""
        archive = self.archive(run_id)
        if archive is None:
            raise UnknownRunError(f"no run '{run_id}'")
        return archive

    def chunks(self, run_id: str, size: int = _SCAN_COUNT) -> Iterator[Chunk]:
        """Every sample's stored texts, ``size`` samples at a time, in submission order."""
        done = 0
        if self.archive_url(run_id) is None:
            try:
                ids = RunStore(self._client).sample_ids(run_id)
            except UnknownRunError:
                ids = []  # archived since, or no such run
            spill = self._spill_of(run_id)
            for start in range(0, len(ids), size):
                chunk = self._positioned(run_id, ids[start : start + size], start, spill)
                if chunk is None:
                    break
                yield chunk
                done += len(chunk.sample_ids)
            else:
                if ids:
                    return
        for batch in self._archive_after_seal(run_id).batches():
            rows = batch.num_rows
            if done >= rows:
                done -= rows
                continue
            columns = batch.slice(done).to_pydict()
            done = 0
            for start in range(0, len(columns["sample_id"]), size):
                end = start + size
                yield Chunk(
                    columns["sample_id"][start:end], columns["output"][start:end],
                    columns["scores"][start:end], columns["error"][start:end],
                )  # fmt: skip

    def tables(self, run_id: str, size: int = 10_000) -> Iterator[pa.Table]:
        """Every sample's stored texts and metrics as tables of the archive's columns
        (:meth:`shared.store.archive.Chunk.table`), in submission order, live or archived."""
        archive = self.archive(run_id)
        if archive is None:
            for chunk in self.chunks(run_id, size):
                yield chunk.table()
            return
        metrics = tuple(f"score.{m}" for m in archive.manifest["metrics"])
        for batch in archive.batches((*RAW_COLUMNS, *metrics)):
            yield pa.Table.from_batches([batch])

    def live_chunk(self, run_id: str, sample_ids: list[int]) -> Chunk | None:
        """The stored texts of ``sample_ids``, spilled or not; None if the run was sealed (its
        keys may be gone) by the time they were read."""
        found = self._live_columns(run_id, sample_ids, ("outputs", "scores", "errors"))
        return None if found is None else Chunk(list(sample_ids), *found)

    def _live_columns(
        self, run_id: str, sample_ids: list[int], names: tuple[str, ...]
    ) -> list[list[str | None]] | None:
        """``sample_ids``' stored texts of the columns ``names`` (``outputs``, ``scores``,
        ``errors``), spilled samples' from their parts; None if the run was sealed by the time
        they were read."""
        live = self._hmget(run_id, [self._hash(run_id, name) for name in names], sample_ids)
        if live is None or not live.spilled:
            return None if live is None else live.values
        spilled = live.spilled
        found = self._sealed_or(run_id, lambda: self.spill_map(run_id).by_id(spilled))
        if found is None:
            return None
        at = [("outputs", "scores", "errors").index(name) for name in names]
        for position, sample_id in enumerate(sample_ids):
            if sample_id in found:
                for column, index in zip(live.values, at, strict=True):
                    column[position] = found[sample_id][index]
        return live.values

    def _positioned(
        self, run_id: str, sample_ids: list[int], start: int, spill: Spill
    ) -> Chunk | None:
        """The stored texts of ``sample_ids``, the run's ids from position ``start`` on: those
        of spilled segments from their parts (``spill`` is updated by the same read); None if
        the run was sealed by the time they were read."""
        keys = RunKeys(run_id)
        live = [i for n, i in enumerate(sample_ids) if spill.segment(start + n) is None]
        with self._client.pipeline(transaction=False) as pipe:
            for key in (keys.out, keys.score, keys.err):
                pipe.hmget(key, live)
            pipe.hgetall(keys.spill)  # after: what spilled while the values were read shows
            pipe.hexists(keys.meta, "archive_url")
            *found, spilled, sealed = pipe.execute() if live else [[], [], [], {}, False]
        if sealed:
            return None
        if live:
            spill.update(cast(Mapping[Any, Any], spilled))
        values: dict[int, tuple[str | None, ...]] = {
            i: tuple(texts) for i, *texts in zip(live, *found, strict=True)
        }

        def texts(n: int, sample_id: int) -> tuple[str | None, ...]:
            return values[sample_id] if spill.segment(start + n) is None else spill.texts(start + n)

        rows = self._sealed_or(run_id, lambda: [texts(n, i) for n, i in enumerate(sample_ids)])
        if rows is None:
            return None
        return Chunk(list(sample_ids), *(list(column) for column in zip(*rows, strict=True)))

    def _sealed_or(self, run_id: str, read: Callable[[], T]) -> T | None:
        """``read()`` of spilled parts; None if it failed because the run was sealed meanwhile
        (the seal's tidy-up removes the spill folder)."""
        try:
            return read()
        except ArchiveUnreadableError:
            if self.archive_url(run_id) is not None:
                return None
            raise

    def _spill_of(self, run_id: str) -> Spill:
        """An empty view of the run's spilled segments, whose parts are read only from the
        spill folder under the archive location the run's facts name."""
        try:
            return Spill(run_id, f"{RunStore(self._client).folder(run_id)}/spill")
        except UnknownRunError:
            return Spill(run_id, "")

    def spill_map(self, run_id: str) -> Spill:
        """A going run's spilled segments as they are now."""
        spill = self._spill_of(run_id)
        spill.update(self._client.hgetall(RunKeys(run_id).spill))
        return spill

    def spill(self, run_id: str, segment: int, rows: int, url: str, chunk: Chunk) -> int:
        """Name the part at ``url`` (``chunk``, the run's ids from ``segment * rows`` on, every
        one settled) as that segment's, free its samples' results and mark them spilled:
        1 now, 2 before with this part, 0 before with another, -1 the run is not going (or is
        being finalized), -2 the part is not what the store holds (see ``spill.lua``)."""
        keys = RunKeys(run_id)
        kinds = _flatten(error_kinds(e for e in chunk.errors if e is not None))
        bare = [i for i, o in zip(chunk.sample_ids, chunk.outputs, strict=True) if o is None]
        return int(
            self._spill(
                keys=[
                    keys.meta, keys.spill, keys.spilled, keys.out, keys.score, keys.err,
                    keys.errors,
                ],
                args=[
                    segment, rows, url, len(kinds) // 2, *kinds, len(bare), *bare,
                    *chunk.sample_ids,
                ],
            )
        )  # fmt: skip

    def seal(
        self,
        run_id: str,
        url: str,
        chunk_counts: tuple[int, int, int, int],
        errors: Mapping[str, int] | None = None,
    ) -> int:
        """Make the archive attempt at ``url`` the run's archive and free the run's per-sample
        keys, unless it is sealed already; ``chunk_counts`` = (rows, scores, errors, outputs)
        the attempt wrote, ``errors`` its error counts by kind (kept in Redis). 1 sealed
        now, 2 before with this folder, 0 before with another, -1 the run is going or gone, -2
        the counts disagree with the run's (see ``seal.lua``)."""
        keys = RunKeys(run_id)
        kinds = _flatten(errors or {})
        return int(
            self._seal(
                keys=[keys.meta, keys.progress, keys.errors, *keys.per_sample],
                args=[url, self._size(run_id), *chunk_counts, *kinds],
            )
        )

    def outputs(self, run_id: str, sample_ids: list[int]) -> dict[int, Any]:
        """The stored outputs of those samples that have one."""
        return {i: json.loads(v) for i, v in self.output_texts(run_id, sample_ids).items()}

    def output_texts(self, run_id: str, sample_ids: list[int]) -> dict[int, str]:
        """The stored outputs of those samples that have one, as stored (JSON text)."""
        (found,) = self._columns(run_id, sample_ids, ("outputs",))
        return {i: str(v) for i, v in zip(sample_ids, found, strict=True) if v is not None}

    def _hmget(self, run_id: str, keys: list[str], sample_ids: list[int]) -> _Live | None:
        """``sample_ids``' values in each of the run's hashes ``keys``, and which of them were
        spilled; None if the run was sealed by the time they were read."""
        if not sample_ids:
            return _Live([[] for _ in keys], set())
        first, last = _bits(sample_ids)
        dense = last - first < _BITMAP_SPAN
        with self._client.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.hmget(key, sample_ids)
            spilled_key = RunKeys(run_id).spilled  # after the values: see live_chunk
            raw = cast(Any, pipe)  # redis-py leaves execute_command untyped
            if dense:  # the bytes that hold their bits
                raw.execute_command("GETRANGE", spilled_key, first, last, **{NEVER_DECODE: True})
            else:  # ids far apart: their bits, one by one
                gets = [arg for i in sample_ids for arg in ("GET", "u1", i)]
                raw.execute_command("BITFIELD_RO", spilled_key, *gets)
            pipe.hexists(RunKeys(run_id).meta, "archive_url")
            *found, bits, sealed = pipe.execute()
        if sealed:
            return None
        if not dense:
            return _Live(found, {i for i, bit in zip(sample_ids, bits, strict=True) if bit})
        bitmap = bytes(bits or b"")
        spilled = {i for i in sample_ids if _set(bitmap, first, i)} if any(bitmap) else set()
        return _Live(found, spilled)

    def _archived(self, run_id: str, sample_ids: list[int]) -> Chunk:
        """``sample_ids``' stored texts, read from the run's archive."""
        wanted, found = set(sample_ids), dict[int, tuple[str | None, ...]]()
        for chunk in self.chunks(run_id, _ARCHIVE_SCAN):
            found.update(chunk.texts_of(wanted))
        rows = [found.get(i, (None, None, None)) for i in sample_ids]
        return Chunk(list(sample_ids), *([row[k] for row in rows] for k in range(3)))

    def output_chunks(self, run_id: str, size: int = _SCAN_COUNT) -> Iterator[dict[int, str]]:
        """Every stored output (JSON text) of a run, live or archived, by chunks in submission
        order."""
        for chunk in self.chunks(run_id, size):
            yield {
                i: out
                for i, out in zip(chunk.sample_ids, chunk.outputs, strict=True)
                if out is not None
            }

    def produced(self, run_id: str, sample_ids: list[int]) -> tuple[set[int], set[int]]:
        """Those samples with an output, and those settled with an error or spilled (neither
        needs inference again)."""
        (outputs, errors), spilled = self._present(run_id, sample_ids, ("outputs", "errors"))
        return (
            {i for i, o in zip(sample_ids, outputs, strict=True) if o is not None},
            {i for i, e in zip(sample_ids, errors, strict=True) if e is not None} | spilled,
        )

    def inferred(self, run_id: str, sample_ids: list[int]) -> set[int]:
        """Those samples that already have an output."""
        return set(self.output_texts(run_id, sample_ids))

    def unsettled(self, run_id: str, sample_ids: list[int]) -> list[int]:
        """Those samples with neither a score nor a terminal error, nor spilled."""
        settled = self.settled(run_id, sample_ids)
        return [i for i in sample_ids if i not in settled]

    def settled(self, run_id: str, sample_ids: list[int]) -> set[int]:
        """Those samples that already have a score or a terminal error (spilled ones too)."""
        (scores, errors), spilled = self._present(run_id, sample_ids, ("scores", "errors"))
        return {i for i, s, e in zip(sample_ids, scores, errors, strict=True) if s or e} | spilled

    def _present(
        self, run_id: str, sample_ids: list[int], names: tuple[str, ...]
    ) -> tuple[list[list[str | None]], set[int]]:
        """``sample_ids``' texts of the columns ``names`` as live (spilled ones' left out) and
        which were spilled; an archived run's from its archive."""
        live = self._hmget(run_id, [self._hash(run_id, name) for name in names], sample_ids)
        if live is None:
            return self._columns(run_id, sample_ids, names), set()
        return live.values, live.spilled

    @staticmethod
    def _hash(run_id: str, name: str) -> str:
        """The run's hash that holds the column ``name`` (outputs, scores, errors)."""
        keys = RunKeys(run_id)
        return {"outputs": keys.out, "scores": keys.score, "errors": keys.err}[name]

    def _columns(
        self, run_id: str, sample_ids: list[int], names: tuple[str, ...]
    ) -> list[list[str | None]]:
        """``sample_ids``' stored texts of the columns ``names`` (``outputs``, ``scores``,
        ``errors``), live or archived."""
        live = self._live_columns(run_id, sample_ids, names)
        if live is not None:
            return live
        archived = self._archived(run_id, sample_ids)
        return [getattr(archived, name) for name in names]

    def attempt(
        self, run_id: str, samples: dict[int, bool], stage: Stage = Stage.INFER
    ) -> dict[int, int]:
        """Count attempts at ``stage`` (infer or score) of samples (sample id -> arrived alone);
        a negative count marks a sample tried before that arrived with others and must be sent
        on alone."""
        if not samples:
            return {}
        flat = _flatten({sample_id: int(solo) for sample_id, solo in samples.items()})
        keys = RunKeys(run_id)
        counts = self._attempt(keys=[keys.attempts_of(stage), keys.meta, keys.spilled], args=flat)
        return dict(zip(samples, (int(c) for c in counts), strict=True))

    def reset_attempts(self, run_id: str, sample_ids: list[int]) -> None:
        """Forget the attempt counts of samples at both stages (``evalq resume`` gives them a
        fresh start)."""
        if sample_ids:
            keys = RunKeys(run_id)
            fields = [str(i) for i in sample_ids]
            with self._client.pipeline(transaction=False) as pipe:
                pipe.hdel(keys.attempts_of(Stage.INFER), *fields)
                pipe.hdel(keys.attempts_of(Stage.SCORE), *fields)
                pipe.execute()

    def record_outputs(self, run_id: str, outputs: dict[int, str]) -> int:
        """Write each output (JSON text, see :func:`to_json`) unless one exists; return how many
        were new."""
        if not outputs:
            return 0
        keys = RunKeys(run_id)
        return int(
            self._record_outputs(
                keys=[keys.out, keys.progress, keys.meta, keys.spilled], args=_flatten(outputs)
            )
        )

    def record_scores(self, run_id: str, scores: dict[int, dict[str, float]]) -> Settled:
        """Settle samples with their scores."""
        return self._settle(run_id, "score", {i: to_json(s) for i, s in scores.items()})

    def record_errors(self, run_id: str, errors: dict[int, ErrorRecord]) -> Settled:
        """Settle samples with terminal errors."""
        encoded = {i: e.model_dump_json() for i, e in errors.items()}
        return self._settle(run_id, "err", encoded)

    def claim_finalize(self, run_id: str, stale_after: float) -> bool:
        """True if every sample is settled, the run is going, and nobody holds a claim to
        finalize it younger than ``stale_after`` seconds: the caller must finalize it."""
        return self._settle(run_id, "score", {}, stale_after).finalize

    def _settle(
        self, run_id: str, kind: str, values: dict[int, str], stale_after: float | None = None
    ) -> Settled:
        if not values and stale_after is None:
            return Settled(False, 0, 0)
        keys = RunKeys(run_id)
        written, finalize, settled = self._settle_script(
            keys=[
                keys.score,
                keys.err,
                keys.progress,
                keys.meta,
                keys.settled,
                keys.attempts_of(Stage.INFER),
                keys.attempts_of(Stage.SCORE),
                keys.spilled,
            ],
            args=[
                kind,
                "" if stale_after is None else stale_after,
                self._size(run_id),
                *_flatten(values),
            ],
        )
        return Settled(bool(finalize), int(written), int(settled))

    def counted(self, run_id: str, rule: FailureRule) -> Counted:
        """The run's metric samples: every stored score, and its failed samples as ``rule``
        (the evaluation's declarations) counts them (:func:`shared.failures.metric_samples`)."""
        return metric_samples(self.scores(run_id), self.failures(run_id), rule)

    def finalize(
        self, run_id: str, evaluation: Evaluation, clusters: Clusters | None = None
    ) -> Finished | None:
        """Compute the aggregate, and each metric's uncertainty (:func:`shared.stats.describe`,
        clustered by what ``clusters`` gives for the counted ids, when the evaluation declares
        a cluster field), from every stored score and failure (:meth:`counted`) and end the
        run: completed, or failed when no sample could be scored or ``aggregate()`` raised.
        None if the run had ended already (cancelled meanwhile, or finished by another
        finalizer)."""
        counted = self.counted(run_id, evaluation.failure_rule())
        scores = counted.scores
        finished = Finished(RunStatus.FAILED, {}, "no sample could be scored")
        encoded, stats = to_json(finished.aggregate), ""
        if counted.scored:
            try:
                values = list(scores.values())
                aggregate = {str(k): float(v) for k, v in evaluation.aggregate(values).items()}
                encoded = to_json(aggregate)  # refuses NaN: a failed aggregate like any other
                finished = Finished(RunStatus.COMPLETED, aggregate, None)
            except Exception as exc:
                reason = f"aggregate() failed: {type(exc).__name__}: {first_line(exc)}"
                finished = Finished(RunStatus.FAILED, {}, reason)
            else:
                stats = self._stats(run_id, counted, evaluation, clusters)
        keys = RunKeys(run_id)
        ended = self._finish(
            keys=[keys.meta, keys.aggregate, keys.stats],
            args=[finished.status.value, encoded, finished.reason or "", stats],
        )
        return finished if ended else None

    @staticmethod
    def _stats(
        run_id: str, counted: Counted, evaluation: Evaluation, clusters: Clusters | None
    ) -> str:
        """The stats JSON, or '' (logged) when they cannot be computed (the clusters' rows
        unreadable, say): the run still completes with its aggregate."""
        custom = evaluation.aggregate if evaluation.custom_aggregate() else None
        try:
            grouped = None
            if evaluation.cluster_field is not None:
                if clusters is None:
                    raise ValueError("its clusters were not given")
                grouped = clusters(sorted(counted.scores))
            stats = counted.noted(describe(counted.scores, custom, grouped, counted.ranges))
            return json.dumps(
                {name: stat.model_dump(mode="json") for name, stat in stats.items()},
                allow_nan=False,
            )
        except Exception as exc:
            log.warning("run %s: no error bars: %s", run_id, first_line(exc))
            return ""

    def stats(self, run_id: str) -> dict[str, Stat] | None:
        """Each metric's uncertainty, written with the aggregate (None before, or when it
        could not be computed)."""
        raw = self._client.get(RunKeys(run_id).stats)
        if raw is None:
            return None
        return {str(k): Stat.model_validate(v) for k, v in json.loads(raw).items()}

    def recovered(self, run_id: str, samples: int) -> int:
        """Count ``samples`` sent again by the janitor and stamp the run as touched; return
        the run's total."""
        return int(self._recover(keys=[RunKeys(run_id).progress], args=[samples]))

    def scores(self, run_id: str) -> dict[int, dict[str, float]]:
        """Every scored sample's metrics, by sample id."""

        def live() -> dict[int, dict[str, float]]:
            scores = {int(i): json.loads(v) for i, v in self._scan(RunKeys(run_id).score)}
            spill = self.spill_map(run_id)  # after the scan: what spilled during it is here
            for index in spill.parts:
                chunk = read_part(spill.url(index), run_id, ("scores",))
                _parse_scores(chunk.sample_ids, chunk.scores, scores)
            return scores

        def archived() -> dict[int, dict[str, float]]:
            scores: dict[int, dict[str, float]] = {}
            for batch in self._archive_after_seal(run_id).batches(("sample_id", "scores")):
                _parse_scores(batch.column(0).to_pylist(), batch.column(1).to_pylist(), scores)
            return scores

        return self._live_or_archived(run_id, live, archived)

    def failures(self, run_id: str) -> dict[int, str]:
        """Every failed sample's ``stage/kind`` (e.g. ``infer/RuntimeError``), by sample id."""

        def kinds(sample_ids: list[int], texts: list[str | None], into: dict[int, str]) -> None:
            into.update({i: _kind(t) for i, t in zip(sample_ids, texts, strict=True) if t})

        def live() -> dict[int, str]:
            found: dict[int, str] = {}
            scanned = list(self._scan(RunKeys(run_id).err))
            kinds([int(i) for i, _ in scanned], [raw for _, raw in scanned], found)
            spill = self.spill_map(run_id)  # after the scan: what spilled during it is here
            for index in spill.parts:
                chunk = read_part(spill.url(index), run_id, ("error",))
                kinds(chunk.sample_ids, chunk.errors, found)
            return found

        def archived() -> dict[int, str]:
            found: dict[int, str] = {}
            for batch in self._archive_after_seal(run_id).batches(("sample_id", "error")):
                kinds(batch.column(0).to_pylist(), batch.column(1).to_pylist(), found)
            return found

        return self._live_or_archived(run_id, live, archived)

    def _live_or_archived(self, run_id: str, live: Callable[[], T], archived: Callable[[], T]) -> T:
        """``live()`` while the run's results live in Redis (and spilled parts) and were not
        sealed while it read them; ``archived()`` otherwise. A spilled part gone as it was
        read (the seal's tidy-up, a purge) is the archive's turn, or no run."""
        if self.archive_url(run_id) is None:
            try:
                found = live()
            except ArchiveUnreadableError:
                if not self._client.exists(RunKeys(run_id).meta):
                    raise UnknownRunError(f"no run '{run_id}'") from None
                if self.archive_url(run_id) is None:
                    raise
            else:
                if self.archive_url(run_id) is None:
                    return found
        return archived()

    def progress(self, run_id: str) -> Progress:
        """The run's counters."""
        return Progress.model_validate(self._client.hgetall(RunKeys(run_id).progress))

    def aggregate(self, run_id: str) -> dict[str, float] | None:
        """The aggregate written at completion, if the run has completed."""
        raw = self._client.get(RunKeys(run_id).aggregate)
        return None if raw is None else dict(json.loads(raw))

    def fetch_live(self, run_id: str, sample_ids: list[int]) -> list[SampleResult] | None:
        """The stored results of ``sample_ids`` of a live run, in that order; None if the run
        was sealed by the time they were read (read its archive instead)."""
        if not sample_ids:
            return []
        chunk = self.live_chunk(run_id, sample_ids)
        return None if chunk is None else list(_results(chunk))

    def fetch(self, run_id: str, sample_ids: list[int]) -> list[SampleResult]:
        """The stored results of ``sample_ids``, in that order, live or archived."""
        found = self.fetch_live(run_id, sample_ids)
        return list(_results(self._archived(run_id, sample_ids))) if found is None else found

    def results(self, run_id: str) -> Iterator[SampleResult]:
        """Every sample's stored result, in submission order."""
        for chunk in self.chunks(run_id):
            yield from _results(chunk)

    def settled_since(
        self, run_id: str, cursor: str, block_ms: int | None
    ) -> tuple[str, list[int]]:
        """Ids settled after ``cursor`` in the run's settled stream (waiting up to ``block_ms``,
        not at all when None), and the new cursor."""
        reply: Any = self._client.xread(
            {RunKeys(run_id).settled: cursor}, count=1000, block=block_ms
        )
        ids: list[int] = []
        for _, entries in reply or []:
            for entry_id, fields in entries:
                cursor = str(entry_id)
                ids.extend(_settled_ids(fields))
        return cursor, ids

    def timeline(self, run_id: str) -> list[tuple[float, int]]:
        """(Unix time, samples settled) of every write that settled samples, oldest first (the
        time is the settled stream's entry id; an archived run's, by the hundredth of a
        second)."""

        def live() -> list[tuple[float, int]]:
            entries: Any = self._client.xrange(RunKeys(run_id).settled)
            return [
                (int(str(entry_id).split("-")[0]) / 1000, len(_settled_ids(fields)))
                for entry_id, fields in entries or []
            ]

        def archived() -> list[tuple[float, int]]:
            timeline = self._archive_after_seal(run_id).manifest["timeline"]
            return [(float(at), int(count)) for at, count in timeline]

        return self._live_or_archived(run_id, live, archived)

    def errors_by_kind(self, run_id: str) -> dict[str, int]:
        """Terminal errors counted by stage and exception class, e.g. ``infer/RuntimeError``
        (an archived run's were counted into ``evalq:{run}:errors`` at its seal)."""
        keys = RunKeys(run_id)

        def kept() -> Counter[str]:
            return Counter({str(k): int(v) for k, v in self._client.hgetall(keys.errors).items()})

        def live() -> dict[str, int]:
            """Those in Redis and those spilled (counted into ``evalq:{run}:errors``), read
            again if a spill moved some while they were counted."""
            for _ in range(_STABLE_TRIES):
                before = self._client.hlen(keys.spill)
                counts = Counter(error_kinds(raw for _, raw in self._scan(keys.err))) + kept()
                if self._client.hlen(keys.spill) == before:
                    break
            return dict(counts.most_common())

        return self._live_or_archived(run_id, live, lambda: dict(kept().most_common()))

    def _scan(self, key: str) -> Iterator[tuple[str, str]]:
        yield from self._client.hscan_iter(key, count=_SCAN_COUNT)
