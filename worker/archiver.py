"""Archiving an ended run to Parquet and freeing its per-sample keys in Redis.

A worker runs it (the ``evalq.archive`` task, sent by the finalizer when a run completes and
by the janitor for every ended run that is due and not archived yet). One attempt:

1. reads the run's samples from Redis in submission order, ``PART_ROWS`` at a time, and writes
   each as a Parquet part in a folder of its own under ``<archive>/<run>/`` (``<archive>``:
   the location the run's facts name, which the gateway chose at submit);
2. writes the manifest last (the run record, progress, aggregate, stats, provenance, the
   settled timeline by the hundredth of a second, the error counts);
3. seals (``seal.lua``, atomic): if no attempt sealed the run before and the rows and counts it
   wrote are the run's own, the run's record names its folder and the per-sample keys are
   unlinked; then it removes every other attempt's folder.

Killed anywhere before the seal, an attempt leaves Redis as it was and a folder nobody reads;
the janitor sends the run again and the next attempt finishes (and removes that folder). Killed
after it, the run is archived; a later attempt only tidies. Two attempts at once both write, one
seals, the other removes its own folder.

While a run goes, the same message spills it (:func:`spill_run`, sent each time a write takes
the run's settled samples past a multiple of ``EVALQ_SPILL_ROWS``): each segment of that many
of its ids whose every sample is settled goes to a part of its own, then ``spill.lua`` names
the part and frees the segment's results in Redis, once. Killed before that, the part is a file
nobody reads (the seal's tidy-up removes it) and the segment stays live until the next spill or
the archive.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import redis

from evalq.shared.store.aggregate import error_kinds
from evalq.shared.store.archive import (
    PART_ROWS,
    ArchiveWriter,
    remove_others,
    remove_part,
    spill_url,
    write_part,
)
from evalq.shared.store.provenance import ProvenanceStore
from evalq.shared.store.reader import ResultReader
from evalq.shared.store.runs import RunStore
from evalq.shared.store.seal import Sealer, SealOutcome, bucketed
from evalq.shared.store.spill import Spill, Spiller, SpillOutcome

__all__ = ["Archived", "archive_run", "spill_run"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Archived:
    """How one attempt ended: ``sealed`` (:attr:`SealOutcome.SEALED` for a seal of this
    attempt's, whether or not a retried call saw it; :attr:`SealOutcome.SEALED_ELSEWHERE` when
    the run was sealed before it began); ``rows`` written by this attempt."""

    sealed: SealOutcome
    rows: int
    url: str


def archive_run(client: redis.Redis, run_id: str) -> Archived:
    """One attempt at archiving ``run_id`` under the archive location its facts name; see the
    module."""
    runs, results = RunStore(client), ResultReader(client)
    meta = runs.get(run_id)
    folder = runs.folder(run_id)
    sealed = results.archive_url(run_id)
    if sealed is not None:
        remove_others(folder, sealed.rstrip("/").rsplit("/", 1)[-1])
        return Archived(SealOutcome.SEALED_ELSEWHERE, 0, sealed)
    if meta.status.active:
        return Archived(SealOutcome.NOT_ENDED, 0, "")
    attempt = uuid.uuid4().hex[:12]
    writer = ArchiveWriter(f"{folder}/{attempt}")
    try:
        timeline = bucketed(results.timeline(run_id))
        scored = failed = inferred = 0
        errors: list[str] = []
        for chunk in results.chunks(run_id, PART_ROWS):
            writer.write(chunk)
            scored += sum(s is not None for s in chunk.scores)
            inferred += sum(o is not None for o in chunk.outputs)
            errors += [e for e in chunk.errors if e is not None]
            failed = len(errors)
        kinds = error_kinds(errors)
        record = {
            "run": meta.model_dump(mode="json"),
            "progress": results.progress(run_id).model_dump(mode="json"),
            "aggregate": results.aggregate(run_id),
            "stats": {
                k: v.model_dump(mode="json") for k, v in (results.stats(run_id) or {}).items()
            },
            "provenance": ProvenanceStore(client).of_run(run_id, meta.spec).model_dump(mode="json"),
            "timeline": timeline,
            "errors": kinds,
        }
        writer.finish(record)
        counts = (writer.rows, scored, failed, inferred)
        outcome = Sealer(client).seal(run_id, writer.url, counts, kinds)
    except BaseException:
        _abandon(results, run_id, writer)
        raise
    if not outcome.ours:
        _abandon(results, run_id, writer)
        if outcome is SealOutcome.COUNTS_DIFFER:
            log.warning("archive of run %s lost to another attempt; it was removed", run_id)
        return Archived(outcome, writer.rows, writer.url)
    remove_others(folder, attempt)  # the spill folder among them
    log.info("archived run %s: %d samples to %s", run_id, writer.rows, writer.url)
    return Archived(SealOutcome.SEALED, writer.rows, writer.url)


def _abandon(results: ResultReader, run_id: str, writer: ArchiveWriter) -> None:
    """Remove an attempt's folder, unless the run's record names it (the seal happened though
    its reply was lost): that folder is the run's archive now."""
    try:
        if results.archive_url(run_id) == writer.url:
            return
    except redis.RedisError:
        log.warning("archive of run %s: cannot tell whether it sealed; its folder stays", run_id)
        return
    writer.remove()


PROBES = 8
"""Samples of a segment looked at before the whole of it is: most segments not spilled yet are
not complete either, and one unsettled probe tells."""


def spill_run(client: redis.Redis, run_id: str, rows: int, ids: Sequence[int] | None = None) -> int:
    """Spill each complete segment of the going run ``run_id`` not spilled yet (``rows``
    samples each, unless the run's first spill chose another size); return how many went.
    ``ids``: the run's sample ids, when the caller holds them (they never change)."""
    runs, results, spiller = RunStore(client), ResultReader(client), Spiller(client)
    ids = runs.sample_ids(run_id) if ids is None else ids
    folder = runs.folder(run_id)
    spill = Spill.read(client, run_id)
    rows = spill.rows or rows
    segments = [s for s in range(-(-len(ids) // rows)) if s not in spill.parts]
    probes = {s: _probes(ids[s * rows : (s + 1) * rows]) for s in segments}
    unsettled = set(results.unsettled(run_id, [i for p in probes.values() for i in p]))
    moved = 0
    for segment in (s for s in segments if unsettled.isdisjoint(probes[s])):
        chunk = results.live_chunk(run_id, list(ids[segment * rows : (segment + 1) * rows]))
        if chunk is None:
            break  # archived meanwhile
        if any(s is None and e is None for s, e in zip(chunk.scores, chunk.errors, strict=True)):
            continue
        url = write_part(spill_url(folder, segment), chunk)
        outcome = spiller.spill(run_id, segment, rows, url, chunk)
        if outcome.taken:
            moved += 1
            continue
        remove_part(url, run_id)
        if outcome is SpillOutcome.NOT_GOING:
            break  # the run ended, or its finalizer reads the store
    if moved:
        log.info("run %s: %d segments of %d samples spilled", run_id, moved, rows)
    return moved


def _probes(segment: Sequence[int]) -> list[int]:
    """Up to :data:`PROBES` of a segment's ids, spread over it, its last among them."""
    step = max(1, len(segment) // PROBES)
    return sorted({*segment[::step][:PROBES], segment[-1]})
