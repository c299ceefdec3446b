"""One page of a run's per-sample results, live or archived, without reading more of the run
than the page needs.

An unfiltered, unsorted page is a slice of the run's samples in submission order: a live run's
are read by id from Redis (and the spilled parts that hold them), an archived run's from the
one or two Parquet parts that hold those rows. A filtered or sorted page first reads only the
columns the question needs (``sample_id``, and ``error`` for failures, a metric's column to
sort by, the texts to search), picks the rows, then reads those rows whole. Whether a reader
may see per-sample results at all is not decided here: the caller asks the policy first
(:meth:`evalq.producer.service.direct.Direct.readable`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial

import pyarrow as pa
import pyarrow.compute as pc
import redis

from evalq.shared.errors import UnknownRunError
from evalq.shared.store.archive import ArchiveReader, Chunk
from evalq.shared.store.reader import ResultReader
from evalq.shared.store.runs import RunStore

__all__ = ["PageQuery", "PageReader"]

SEARCHED = ("output", "scores", "error")
"""The stored texts a search looks in."""

PAGE_BYTES = 8 << 20
"""The stored text a page holds at most: a page of large outputs is cut short there (never
before its first sample), and the caller pages on from where it was cut. Up to 500 outputs of
megabytes each were read, held and answered whole (the viewer's attack review: one page of 60 MB
took the gateway 400 MB; 4 at once, 1.3 GB)."""
PAGE_STEP = 32
"""Samples read at a time while a page fills."""


@dataclass(frozen=True)
class PageQuery:
    """Which samples a page is cut from (every condition given must hold), and in what order."""

    failed: bool = False
    q: str | None = None
    sort: str | None = None
    """A metric, lowest first; ``-metric``: highest first; samples without it last."""
    ids: tuple[int, ...] | None = None

    @property
    def plain(self) -> bool:
        """Every sample, in submission order."""
        return not (self.failed or self.q or self.sort or self.ids is not None)

    @property
    def metric(self) -> str | None:
        return None if self.sort is None else self.sort.removeprefix("-")

    def columns(self) -> tuple[str, ...]:
        """The columns that pick the rows."""
        needed = ["sample_id"]
        if self.failed:
            needed.append("error")
        if self.q:
            needed += [c for c in SEARCHED if c not in needed]
        if self.metric is not None:
            needed.append(f"score.{self.metric}")
        return tuple(needed)

    def positions(self, table: pa.Table, held: pa.ChunkedArray | None = None) -> list[int]:
        """The places (in ``table``, the run's rows in submission order) of the rows that
        match, in the page's order (``held``: which rows' texts hold ``q``, when already
        known; else ``table`` has the searched texts)."""
        keep = pa.array([True] * table.num_rows, pa.bool_())
        if self.ids is not None:
            keep = pc.and_(keep, pc.is_in(table["sample_id"], pa.array(self.ids, pa.int64())))
        if self.failed:
            keep = pc.and_(keep, pc.is_valid(table["error"]))
        if self.q:
            keep = pc.and_(keep, _holds(table, self.q) if held is None else held)
        found = pc.indices_nonzero(keep)
        if self.metric is None:
            return [int(i) for i in found.to_pylist()]
        values = pc.take(_metric_column(table, self.metric), found)
        valid = pc.is_valid(values)
        having, lacking = pc.filter(found, valid), pc.filter(found, pc.invert(valid))
        order = "descending" if self.sort and self.sort.startswith("-") else "ascending"
        ranked = pc.sort_indices(
            pa.table({"v": pc.filter(values, valid), "i": having}),
            sort_keys=[("v", order), ("i", "ascending")],
        )
        first = pc.take(having, ranked).to_pylist()
        return [int(i) for i in first + lacking.to_pylist()]  # samples without it last


def _metric_column(table: pa.Table, metric: str) -> pa.ChunkedArray | pa.Array:
    name = f"score.{metric}"
    if name in table.column_names:
        return table[name]
    return pa.nulls(table.num_rows, pa.float64())


def _holds(table: pa.Table, text: str) -> pa.ChunkedArray:
    """Which rows' stored texts hold ``text`` (any case), as written or as JSON escapes it
    (stored texts are ASCII JSON: ``é`` is ``\\u00e9`` there)."""
    needles = {text, json.dumps(text)[1:-1]}
    found = None
    for column in SEARCHED:
        for needle in needles:
            hit = pc.fill_null(pc.match_substring(table[column], needle, ignore_case=True), False)
            found = hit if found is None else pc.or_(found, hit)
    assert found is not None
    return found


class PageReader:
    """Pages of runs' per-sample results; see the module."""

    def __init__(self, client: redis.Redis, rows: int = PAGE_STEP) -> None:
        """``rows``: samples a filtered or sorted page of a live run reads at a time (it
        keeps of them only what picks the rows)."""
        self._results = ResultReader(client)
        self._runs = RunStore(client)
        self._rows = rows

    def page(self, run_id: str, offset: int, limit: int, query: PageQuery) -> tuple[int, Chunk]:
        """How many of the run's samples match ``query``, and the stored texts of those from
        ``offset`` on (at most ``limit``)."""
        archive = self._results.archive(run_id)
        if archive is None:
            found = self._live(run_id, offset, limit, query)
            if found is not None:
                return found
            archive = self._results.archive(run_id)
            if archive is None:  # neither live keys nor an archive: purged meanwhile
                raise UnknownRunError.named(run_id)
        return self._archived(archive, offset, limit, query)

    def _live(
        self, run_id: str, offset: int, limit: int, query: PageQuery
    ) -> tuple[int, Chunk] | None:
        """The page of a run whose results live in Redis; None when it was sealed meanwhile."""
        if query.plain or (query.ids is not None and not (query.failed or query.q or query.sort)):
            try:
                ids = self._runs.sample_ids(run_id)
            except UnknownRunError:
                return None  # sealed (its ids freed), or no run: the caller looks
            if query.ids is not None:
                wanted = set(query.ids)
                ids = [i for i in ids if i in wanted]
            chunk = _capped(partial(self._results.live_chunk, run_id), ids[offset : offset + limit])
            return None if chunk is None else (len(ids), chunk)
        try:
            tables = (chunk.table() for chunk in self._results.chunks(run_id, self._rows))
            picked = _picked(tables, query)
        except UnknownRunError:
            return None
        if picked is None:
            return 0, Chunk.empty()
        table, positions = picked
        ids = table["sample_id"].take(positions[offset : offset + limit]).to_pylist()
        found = _capped(partial(self._results.live_chunk, run_id), ids)
        return None if found is None else (len(positions), found)

    def _archived(
        self, archive: ArchiveReader, offset: int, limit: int, query: PageQuery
    ) -> tuple[int, Chunk]:
        """The page of an archived run, reading only what picks the rows, then the rows."""
        if query.plain:
            total = sum(int(part["rows"]) for part in archive.manifest["parts"])
            found = _capped(
                archive.rows, step=limit, keys=list(range(offset, min(total, offset + limit)))
            )
            assert found is not None
            return total, found
        batches = archive.batches(query.columns(), self._rows)
        picked = _picked((pa.Table.from_batches([b]) for b in batches), query)
        if picked is None:
            return 0, Chunk.empty()
        positions = picked[1]
        found = _capped(archive.rows, step=limit, keys=positions[offset : offset + limit])
        assert found is not None
        return len(positions), found


def _picked(tables: Iterable[pa.Table], query: PageQuery) -> tuple[pa.Table, list[int]] | None:
    """The run's rows (``tables``, in submission order) that ``query`` picks: the table of
    what picks them (the searched texts replaced by whether they hold ``q``: a page held the
    whole run's outputs to search them) and the picked rows' places in it, in the page's
    order; None for a run with no rows."""
    picking, held = [], []
    for table in tables:
        if query.q:
            held.append(_holds(table, query.q))
        kept = [c for c in query.columns() if c in table.column_names and c not in SEARCHED]
        picking.append(table.select([*kept, *(["error"] if query.failed else [])]))
    if not picking:
        return None
    table = pa.concat_tables(picking, promote_options="default")
    return table, query.positions(table, pa.chunked_array(held) if query.q else None)


def _capped(
    read: Callable[[list[int]], Chunk | None], keys: Sequence[int], step: int = PAGE_STEP
) -> Chunk | None:
    """``read(keys)``, ``step`` keys at a time, until :data:`PAGE_BYTES` of stored text are in
    (at least one sample: the page may end short of ``keys``); None as ``read`` answers it (the
    run was sealed meanwhile). An archived page is read in one step (its part is read whole
    either way: reading it again for every :data:`PAGE_STEP` rows only repeated the I/O)."""
    page = Chunk.empty()
    size = 0
    for start in range(0, len(keys), step):
        chunk = read(list(keys[start : start + step]))
        if chunk is None:
            return None
        for sample_id, *texts in zip(chunk.sample_ids, *chunk.columns(), strict=True):
            size += sum(len(text) for text in texts if text is not None)
            if page.sample_ids and size > PAGE_BYTES:
                return page
            page.sample_ids.append(sample_id)
            for column, text in zip(page.columns(), texts, strict=True):
                column.append(text)
    return page
