"""A going run's spilled segments: its ids cut into segments of ``rows`` (``EVALQ_SPILL_ROWS``),
each whose every sample is settled moved to a Parquet part of its own while the run goes
(``evalq:{run}:spill`` names the parts, ``evalq:{run}:spilled`` marks their samples).

:class:`Spill` is how readers see them (and read a sample back from its part);
:class:`Spiller` names a part a worker wrote as its segment's and frees the segment's results
in Redis (``spill.lua``). Which segments to write, and when, is
:func:`evalq.worker.archiver.spill_run`'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import redis

from evalq.shared.errors import ArchiveUnreadableError, UnknownRunError
from evalq.shared.keys import LIVE_BYTES, RunKeys
from evalq.shared.store.aggregate import error_kinds
from evalq.shared.store.archive import Chunk, inside, read_part, read_part_group
from evalq.shared.store.runs import RunStore
from evalq.shared.store.scripts import flatten, register
from evalq.shared.store.wire import SPAN_MAX, consecutive

__all__ = ["Spill", "SpillOutcome", "Spiller"]


class SpillOutcome(IntEnum):
    """What ``spill.lua`` answered for a part (the numbers it returns)."""

    SPILLED = 1
    """The part is the segment's now: its samples' results were freed."""
    SPILLED_ON_RETRY = 2
    """The part was the segment's already: a retried call whose first reply was lost."""
    SPILLED_ELSEWHERE = 0
    """The segment went to another part before (the caller removes its own)."""
    NOT_GOING = -1
    """The run has ended, or is being finalized (its finalizer reads the store: nothing may
    move under it)."""
    NOT_THE_STORE_S = -2
    """The part is not what the store holds: a sample of the segment is not settled, one the
    part holds no output for has one now (a late attempt's), or the segment size is not the
    run's."""

    @property
    def taken(self) -> bool:
        """The part is the segment's (now, or on a retried call)."""
        return self in (SpillOutcome.SPILLED, SpillOutcome.SPILLED_ON_RETRY)


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
    _last: tuple[int, int, Chunk] | None = None
    """The row group read last: its segment, its first row in the segment, its texts."""

    @classmethod
    def of(cls, client: redis.Redis, run_id: str) -> Spill:
        """An empty view of the run's spilled segments, whose parts are read only from the
        spill folder under the archive location the run's facts name (fill it with
        :meth:`update`)."""
        try:
            return cls(run_id, f"{RunStore(client).folder(run_id)}/spill")
        except UnknownRunError:
            return cls(run_id, "")

    @classmethod
    def read(cls, client: redis.Redis, run_id: str) -> Spill:
        """The run's spilled segments as they are now."""
        spill = cls.of(client, run_id)
        spill.update(client.hgetall(RunKeys(run_id).spill))
        return spill

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

    def _row(self, index: int, row: int) -> tuple[str | None, ...]:
        """The texts of row ``row`` of segment ``index``'s part, read by row group (the group
        read last is kept: readers go through a segment in order)."""
        last = self._last
        if last is None or last[0] != index or not 0 <= row - last[1] < len(last[2].sample_ids):
            first, chunk = read_part_group(self.url(index), self.run_id, row)
            last = self._last = (index, first, chunk)
        chunk, at = last[2], row - last[1]
        return tuple(column[at] for column in chunk.columns())

    def column(self, index: int, name: str) -> Chunk:
        """Segment ``index``'s part with only the column ``name`` (``scores``, ``error``)
        read: the others are nulls."""
        return read_part(self.url(index), self.run_id, (name,))

    def texts(self, position: int) -> tuple[str | None, ...]:
        """The texts of the sample at ``position`` (in a spilled segment), in
        :data:`evalq.shared.store.archive.RAW_COLUMNS`' order."""
        index = self.segment(position)
        assert index is not None
        return self._row(index, position - index * self.rows)

    def by_id(self, sample_ids: Iterable[int]) -> dict[int, tuple[str | None, ...]]:
        """The texts of spilled samples known by id only, looked for part by part."""
        wanted, found = set(sample_ids), dict[int, tuple[str | None, ...]]()
        for index in sorted(self.parts):
            if len(found) == len(wanted):
                break
            ids = read_part(self.url(index), self.run_id, ()).sample_ids  # small: ids only
            for row, sample_id in enumerate(ids):
                if sample_id in wanted:
                    found[sample_id] = self._row(index, row)
        return found


def _listed(sample_ids: list[int]) -> list[int]:
    """A segment's ids as ``spill.lua`` takes them: ``-n, lo`` for the samples lo, lo + 1, ...,
    else each."""
    return [-len(sample_ids), sample_ids[0]] if consecutive(sample_ids) else sample_ids


class Spiller:
    """Names a written part as its segment's, once (owns ``spill.lua``)."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._spill = register(client, "evalq.shared.store", "spill")

    def spill(self, run_id: str, segment: int, rows: int, url: str, chunk: Chunk) -> SpillOutcome:
        """Name the part at ``url`` (``chunk``, the run's ids from ``segment * rows`` on, every
        one settled) as that segment's, free its samples' results, count its errors by kind
        into ``evalq:{run}:errors`` and mark its samples spilled (see :class:`SpillOutcome`)."""
        keys = RunKeys(run_id)
        kinds = flatten(error_kinds(e for e in chunk.errors if e is not None))
        bare = [i for i, o in zip(chunk.sample_ids, chunk.outputs, strict=True) if o is None]
        outcome = SpillOutcome(
            self._spill(
                keys=[
                    keys.meta,
                    keys.spill,
                    keys.spilled,
                    keys.out,
                    keys.score,
                    keys.err,
                    keys.errors,
                    keys.inferred,
                    keys.done,
                    keys.ranges_of("outputs"),
                    keys.ranges_of("scores"),
                    keys.usage,
                    keys.grade,
                ],
                args=[
                    segment,
                    rows,
                    url,
                    len(kinds) // 2,
                    SPAN_MAX,
                    *kinds,
                    len(bare),
                    *bare,
                    *_listed(chunk.sample_ids),
                ],
            )
        )
        if outcome is SpillOutcome.SPILLED:  # its outputs left Redis (a lost reply: counted on)
            freed = sum(len(o) for o in chunk.outputs if o is not None)
            self._client.hincrby(keys.progress, LIVE_BYTES, -freed)
        return outcome
