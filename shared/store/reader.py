"""Every read of a run's per-sample results, the same answer wherever they are: live in Redis
(:mod:`evalq.shared.store.live`), in a going run's spilled parts (:mod:`evalq.shared.store.spill`),
or in the archive of an ended one (:mod:`evalq.shared.store.archive`).

A run's results move under a reader: a spill frees a segment's values once its part is named,
a seal frees every per-sample key once the archive is named (and removes the spilled parts).
A live read sees the first (it reads, after the values, which samples are spilled) and stops at
the second; :meth:`ResultReader._overtaken` alone decides when the archive answers instead,
and a whole-run read goes on from the archive where it stood.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pyarrow as pa
import redis

from evalq.shared.errors import ArchiveUnreadableError, UnknownRunError
from evalq.shared.failures import Counted, FailureRule, metric_samples
from evalq.shared.keys import RunKeys
from evalq.shared.models import Progress, SampleResult, from_json
from evalq.shared.stats import Stat
from evalq.shared.store.archive import RAW_COLUMNS, ArchiveReader, Chunk, inside, run_folder
from evalq.shared.store.live import COLUMNS, SCAN_COUNT, LiveResults, Sealed, settled_ids
from evalq.shared.store.wire import error_kind, results_of, scores_of

__all__ = ["ResultReader"]

T = TypeVar("T")

_ARCHIVE_SCAN = 65_536
"""Samples looked at a time when a few are read back from an archive."""


class ResultReader:
    """Reads of runs' results, live, spilled or archived; see the module."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._live = LiveResults(client)

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

    def _sealed_archive(self, run_id: str) -> ArchiveReader:
        """The archive of a run whose live keys are gone: sealed, or there is no such run."""
        archive = self.archive(run_id)
        if archive is None:
            raise UnknownRunError.named(run_id)
        return archive

    def _overtaken(self, run_id: str, exc: Sealed | ArchiveUnreadableError) -> None:
        """Return when the live read that raised ``exc`` was overtaken by the run's seal (the
        archive answers now); raise otherwise: a spilled part that cannot be read while the
        run is not sealed is an error, or (its record gone with a purge) no run."""
        if isinstance(exc, Sealed) or self.archive_url(run_id) is not None:
            return
        if not self._client.exists(RunKeys(run_id).meta):
            raise UnknownRunError.named(run_id) from None
        raise exc

    def _either(self, run_id: str, live: Callable[[], T], archived: Callable[[], T]) -> T:
        """``live()``, unless the run was sealed before or while it read: ``archived()``."""
        try:
            return live()
        except (Sealed, ArchiveUnreadableError) as exc:
            self._overtaken(run_id, exc)
        return archived()

    def chunks(self, run_id: str, size: int = SCAN_COUNT) -> Iterator[Chunk]:
        """Every sample's stored texts, ``size`` samples at a time, in submission order."""
        done = 0
        try:
            for chunk in self._live.chunks(run_id, size):
                yield chunk
                done += len(chunk.sample_ids)
            return
        except (Sealed, ArchiveUnreadableError) as exc:
            self._overtaken(run_id, exc)
        for batch in self._sealed_archive(run_id).batches(rows=size):
            rows = batch.num_rows
            if done >= rows:
                done -= rows
                continue
            columns = batch.slice(done).to_pydict()
            done = 0
            for start in range(0, len(columns["sample_id"]), size):
                end = start + size
                yield Chunk(*(columns[c][start:end] for c in RAW_COLUMNS))

    def tables(self, run_id: str, size: int = 10_000) -> Iterator[pa.Table]:
        """Every sample's stored texts and metrics as tables of the archive's columns
        (:meth:`evalq.shared.store.archive.Chunk.table`), in submission order, live or archived."""
        archive = self.archive(run_id)
        if archive is None:
            for chunk in self.chunks(run_id, size):
                yield chunk.table()
            return
        metrics = tuple(f"score.{m}" for m in archive.manifest["metrics"])
        for batch in archive.batches((*RAW_COLUMNS, *metrics)):
            yield pa.Table.from_batches([batch])

    def results(self, run_id: str, size: int = SCAN_COUNT) -> Iterator[SampleResult]:
        """Every sample's stored result, in submission order, read ``size`` at a time."""
        for chunk in self.chunks(run_id, size):
            yield from results_of(chunk)

    def live_chunk(self, run_id: str, sample_ids: list[int]) -> Chunk | None:
        """The stored texts of ``sample_ids``, spilled or not; None if the run was sealed (its
        keys may be gone) by the time they were read."""
        return self._either(
            run_id,
            lambda: Chunk(list(sample_ids), *self._live.columns(run_id, sample_ids, COLUMNS)),
            lambda: None,
        )

    def fetch_live(self, run_id: str, sample_ids: list[int]) -> list[SampleResult] | None:
        """The stored results of ``sample_ids`` of a live run, in that order; None if the run
        was sealed by the time they were read (read its archive instead)."""
        if not sample_ids:
            return []
        chunk = self.live_chunk(run_id, sample_ids)
        return None if chunk is None else list(results_of(chunk))

    def fetch(self, run_id: str, sample_ids: list[int]) -> list[SampleResult]:
        """The stored results of ``sample_ids``, in that order, live or archived."""
        found = self.fetch_live(run_id, sample_ids)
        return list(results_of(self._archived(run_id, sample_ids))) if found is None else found

    def _archived(self, run_id: str, sample_ids: list[int]) -> Chunk:
        """``sample_ids``' stored texts, read from the run's archive."""
        wanted, found = set(sample_ids), dict[int, tuple[str | None, ...]]()
        for chunk in self.chunks(run_id, _ARCHIVE_SCAN):
            found.update(chunk.texts_of(wanted))
        none = (None,) * len(COLUMNS)
        return Chunk.of_rows(sample_ids, [found.get(i, none) for i in sample_ids])

    def _archived_columns(
        self, run_id: str, sample_ids: list[int], names: tuple[str, ...]
    ) -> list[list[str | None]]:
        """``sample_ids``' stored texts of the columns ``names`` (of
        :data:`evalq.shared.store.live.COLUMNS`) as read from the archive."""
        archived = self._archived(run_id, sample_ids)
        return [getattr(archived, name) for name in names]

    def outputs(self, run_id: str, sample_ids: list[int]) -> dict[int, Any]:
        """The stored outputs of those samples that have one."""
        return {i: from_json(v) for i, v in self.output_texts(run_id, sample_ids).items()}

    def output_texts(self, run_id: str, sample_ids: list[int]) -> dict[int, str]:
        """The stored outputs of those samples that have one, as stored (JSON text)."""
        (found,) = self._either(
            run_id,
            lambda: self._live.columns(run_id, sample_ids, ("outputs",)),
            lambda: self._archived_columns(run_id, sample_ids, ("outputs",)),
        )
        return {i: str(v) for i, v in zip(sample_ids, found, strict=True) if v is not None}

    def output_chunks(self, run_id: str, size: int = SCAN_COUNT) -> Iterator[dict[int, str]]:
        """Every stored output (JSON text) of a run, live or archived, by chunks in submission
        order."""
        for chunk in self.chunks(run_id, size):
            yield {
                i: out
                for i, out in zip(chunk.sample_ids, chunk.outputs, strict=True)
                if out is not None
            }

    def produced(self, run_id: str, sample_ids: list[int]) -> tuple[set[int], set[int]]:
        """Those samples with an output, and those settled without one or spilled (neither
        needs inference again)."""

        def archived() -> tuple[set[int], set[int]]:
            outputs, errors = self._archived_columns(run_id, sample_ids, ("outputs", "errors"))
            return (
                {i for i, o in zip(sample_ids, outputs, strict=True) if o is not None},
                {i for i, e in zip(sample_ids, errors, strict=True) if e is not None},
            )

        def live() -> tuple[set[int], set[int]]:
            inferred, done, spilled = self._live.marked(run_id, sample_ids)
            return inferred - spilled, (done - inferred) | spilled

        return self._either(run_id, live, archived)

    def inferred(self, run_id: str, sample_ids: list[int]) -> set[int]:
        """Those samples that already have an output."""
        return set(self.output_texts(run_id, sample_ids))

    def settled(self, run_id: str, sample_ids: list[int]) -> set[int]:
        """Those samples that already have a score or a terminal error (spilled ones too)."""

        def archived() -> set[int]:
            scores, errors = self._archived_columns(run_id, sample_ids, ("scores", "errors"))
            return {i for i, s, e in zip(sample_ids, scores, errors, strict=True) if s or e}

        return self._either(run_id, lambda: self._live.marked(run_id, sample_ids)[1], archived)

    def unsettled(self, run_id: str, sample_ids: list[int]) -> list[int]:
        """Those samples with neither a score nor a terminal error, nor spilled."""
        settled = self.settled(run_id, sample_ids)
        return [i for i in sample_ids if i not in settled]

    def scores(self, run_id: str) -> dict[int, dict[str, float]]:
        """Every scored sample's metrics, by sample id."""

        def archived() -> dict[int, dict[str, float]]:
            scores: dict[int, dict[str, float]] = {}
            for batch in self._sealed_archive(run_id).batches(("sample_id", "scores")):
                scores.update(scores_of(batch.column(0).to_pylist(), batch.column(1).to_pylist()))
            return scores

        return self._either(run_id, lambda: self._live.scores(run_id), archived)

    def failures(self, run_id: str) -> dict[int, str]:
        """Every failed sample's ``stage/kind`` (e.g. ``infer/RuntimeError``), by sample id."""

        def archived() -> dict[int, str]:
            found: dict[int, str] = {}
            for batch in self._sealed_archive(run_id).batches(("sample_id", "error")):
                pairs = zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(), strict=True)
                found.update((i, error_kind(e)) for i, e in pairs if e is not None)
            return found

        return self._either(run_id, lambda: self._live.failures(run_id), archived)

    def counted(self, run_id: str, rule: FailureRule) -> Counted:
        """The run's metric samples: every stored score, and its failed samples as ``rule``
        (the evaluation's declarations) counts them
        (:func:`evalq.shared.failures.metric_samples`)."""
        return metric_samples(self.scores(run_id), self.failures(run_id), rule)

    def timeline(self, run_id: str) -> list[tuple[float, int]]:
        """(Unix time, samples settled) of every write that settled samples, oldest first (the
        time is the settled stream's entry id; an archived run's, by the hundredth of a
        second)."""

        def archived() -> list[tuple[float, int]]:
            timeline = self._sealed_archive(run_id).manifest["timeline"]
            return [(float(at), int(count)) for at, count in timeline]

        return self._either(run_id, lambda: self._live.timeline(run_id), archived)

    def errors_by_kind(self, run_id: str) -> dict[str, int]:
        """Terminal errors counted by stage and exception class, e.g. ``infer/RuntimeError``,
        most common first (an archived run's were counted into ``evalq:{run}:errors`` at its
        seal)."""
        counts = self._either(
            run_id, lambda: self._live.errors_by_kind(run_id), lambda: self._live.kept(run_id)
        )
        return dict(counts.most_common())

    def progress(self, run_id: str) -> Progress:
        """The run's counters."""
        return Progress.model_validate(self._client.hgetall(RunKeys(run_id).progress))

    def aggregate(self, run_id: str) -> dict[str, float] | None:
        """The aggregate written at completion, if the run has completed."""
        raw = self._client.get(RunKeys(run_id).aggregate)
        return None if raw is None else dict(json.loads(raw))

    def stats(self, run_id: str) -> dict[str, Stat] | None:
        """Each metric's uncertainty, written with the aggregate (None before, or when it
        could not be computed)."""
        raw = self._client.get(RunKeys(run_id).stats)
        if raw is None:
            return None
        return {str(k): Stat.model_validate(v) for k, v in json.loads(raw).items()}

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
                ids.extend(settled_ids(fields))
        return cursor, ids
