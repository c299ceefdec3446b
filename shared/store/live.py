"""A run's stored results while they live in Redis: read from its hashes (pipelines and scans)
and, for its spilled segments (:mod:`evalq.shared.store.spill`), from their parts.

Every read here raises :class:`Sealed` when it sees the run sealed (its keys may be gone
under it), and lets :class:`ArchiveUnreadableError` out when a part cannot be read (the seal's
tidy-up may have removed it); :class:`evalq.shared.store.reader.ResultReader` decides, in one place,
whether the archive answers instead.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, cast

import redis
from redis.client import NEVER_DECODE, Pipeline

from evalq.shared.errors import UnknownRunError
from evalq.shared.keys import RunKeys
from evalq.shared.store.aggregate import error_kinds
from evalq.shared.store.archive import Chunk
from evalq.shared.store.runs import RunStore
from evalq.shared.store.spill import Spill
from evalq.shared.store.wire import SPAN_MAX, error_kind, scores_of, span_bounds, spans

__all__ = ["COLUMNS", "SCAN_COUNT", "LiveResults", "Present", "Sealed", "settled_ids"]

SCAN_COUNT = 1000
"""Samples read at a time when a whole run is read."""
COLUMNS = ("outputs", "scores", "errors", "usages", "grades")
"""The texts the store holds of each sample, in :class:`Chunk`'s order."""
_BITMAP_SPAN = 65_536
"""Bytes of the spilled bitmap read at once for ids close together; ids further apart have
their bits read one by one."""
_SPANNED = frozenset({"outputs", "scores"})
"""The columns whose hashes hold spans as well as single samples."""
_STABLE_TRIES = 5
"""Reads of a going run before one nothing overlapped is given up on: of its error counts (a
spill), of its texts (a span or hash that came meanwhile)."""


class Sealed(Exception):
    """A live read saw its run sealed: what it read may be gone; the archive holds it now."""


@dataclass(frozen=True)
class Present:
    """Samples' values in some of a run's hashes, read in one pipeline."""

    values: list[list[str | None]]
    spilled: set[int]
    """Those of the samples moved to a spilled part (their values are there, not here)."""


class _Bits:
    """Some samples' bits in one of a run's bitmaps, read in a pipeline: the bytes that hold
    them when they are close together, else each bit."""

    def __init__(self, sample_ids: list[int]) -> None:
        self.sample_ids = sample_ids
        self.first, last = min(sample_ids) >> 3, max(sample_ids) >> 3
        self.dense = last - self.first < _BITMAP_SPAN
        self._last = last

    def read(self, pipe: Pipeline, key: str) -> None:
        raw = cast(Any, pipe)  # redis-py leaves execute_command untyped
        if self.dense:
            raw.execute_command("GETRANGE", key, self.first, self._last, **{NEVER_DECODE: True})
        else:
            gets = [arg for i in self.sample_ids for arg in ("GET", "u1", i)]
            raw.execute_command("BITFIELD_RO", key, *gets)

    def set_in(self, reply: Any) -> set[int]:
        """Those of the samples whose bit the reply to :meth:`read` has set."""
        if not self.dense:
            return {i for i, bit in zip(self.sample_ids, reply, strict=True) if bit}
        bitmap = bytes(reply or b"")
        if not any(bitmap):
            return set()
        first = self.first
        return {  # Redis's bit order: bit 0 is the highest bit of byte 0
            i
            for i in self.sample_ids
            if (at := (i >> 3) - first) < len(bitmap) and bitmap[at] >> (7 - (i & 7)) & 1
        }


def _holding(fields: list[str], ordered: list[int]) -> tuple[list[str], set[int]]:
    """Those of the spans ``fields`` (``lo-hi``) that hold one of the sorted ids ``ordered``
    at least, and the ids they hold."""
    holding: list[str] = []
    covered: set[int] = set()
    for field in fields:
        lo, hi = span_bounds(field) or (0, -1)
        first, last = bisect_left(ordered, lo), bisect_right(ordered, hi)
        if first < last:
            holding.append(field)
            covered.update(ordered[first:last])
    return holding, covered


def _hash(keys: RunKeys, name: str) -> str:
    """The run's hash that holds the column ``name`` (one of :data:`COLUMNS`)."""
    return {
        "outputs": keys.out,
        "scores": keys.score,
        "errors": keys.err,
        "usages": keys.usage,
        "grades": keys.grade,
    }[name]


class LiveResults:
    """Reads of a run's results in Redis and its spilled parts; see the module."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._runs = RunStore(client)

    def present(self, run_id: str, sample_ids: list[int], names: tuple[str, ...]) -> Present:
        """``sample_ids``' values of the columns ``names`` (of :data:`COLUMNS`) in Redis, and
        which of them were spilled, read in one pipeline (two when spans are read) that ends by
        checking the seal."""
        if not sample_ids:
            return Present([[] for _ in names], set())
        keys = RunKeys(run_id)
        bits = _Bits(sample_ids)

        def after(pipe: Pipeline) -> None:
            # the bits after the values: a sample spilled while they were read shows as spilled
            bits.read(pipe, keys.spilled)
            pipe.hexists(keys.meta, "archive_url")

        found, (spilled, sealed) = self._read(keys, sample_ids, names, after)
        if sealed:
            raise Sealed(run_id)
        return Present(found, bits.set_in(spilled))

    def marked(self, run_id: str, sample_ids: list[int]) -> tuple[set[int], set[int], set[int]]:
        """Those of ``sample_ids`` with an output, those settled and those spilled (a spilled
        one is in the other two as well), from the run's bitmaps, read in one pipeline that
        ends by checking the seal."""
        if not sample_ids:
            return set(), set(), set()
        keys = RunKeys(run_id)
        bits = _Bits(sample_ids)
        with self._client.pipeline(transaction=False) as pipe:
            for key in (keys.inferred, keys.done, keys.spilled):
                bits.read(pipe, key)
            pipe.hexists(keys.meta, "archive_url")
            inferred, done, spilled, sealed = pipe.execute()
        if sealed:
            raise Sealed(run_id)
        return bits.set_in(inferred), bits.set_in(done), bits.set_in(spilled)

    def columns(
        self, run_id: str, sample_ids: list[int], names: tuple[str, ...]
    ) -> list[list[str | None]]:
        """``sample_ids``' texts of the columns ``names``, spilled samples' from their parts."""
        live = self.present(run_id, sample_ids, names)
        if not live.spilled:
            return live.values
        found = Spill.read(self._client, run_id).by_id(live.spilled)
        at = [COLUMNS.index(name) for name in names]
        for position, sample_id in enumerate(sample_ids):
            if sample_id in found:
                for column, index in zip(live.values, at, strict=True):
                    column[position] = found[sample_id][index]
        return live.values

    def chunks(self, run_id: str, size: int) -> Iterator[Chunk]:
        """Every sample's texts, ``size`` samples at a time, in submission order; a run whose
        ids are gone was sealed (or is no run: the archive tells)."""
        try:
            ids = self._runs.sample_ids(run_id)
        except UnknownRunError:
            raise Sealed(run_id) from None
        spill = Spill.of(self._client, run_id)
        for start in range(0, len(ids), size):
            yield self._positioned(run_id, ids[start : start + size], start, spill)

    def _positioned(self, run_id: str, sample_ids: list[int], start: int, spill: Spill) -> Chunk:
        """The texts of ``sample_ids``, the run's ids from position ``start`` on: those of
        spilled segments from their parts (``spill`` is updated by the same read)."""
        keys = RunKeys(run_id)
        live = [i for n, i in enumerate(sample_ids) if spill.segment(start + n) is None]
        found: list[list[str | None]] = [[] for _ in COLUMNS]
        if live:

            def after(pipe: Pipeline) -> None:
                pipe.hgetall(keys.spill)  # after: what spilled while the values were read shows
                pipe.hexists(keys.meta, "archive_url")

            found, (spilled, sealed) = self._read(keys, live, COLUMNS, after)
            if sealed:
                raise Sealed(run_id)
            spill.update(cast(Mapping[Any, Any], spilled))
        values: dict[int, tuple[str | None, ...]] = {
            i: tuple(texts) for i, *texts in zip(live, *found, strict=True)
        }
        rows = [
            values[i] if spill.segment(start + n) is None else spill.texts(start + n)
            for n, i in enumerate(sample_ids)
        ]
        return Chunk.of_rows(sample_ids, rows)

    def _read(
        self,
        keys: RunKeys,
        sample_ids: list[int],
        names: tuple[str, ...],
        after: Callable[[Pipeline], None],
    ) -> tuple[list[list[str | None]], list[Any]]:
        """``sample_ids``' texts of the columns ``names`` (held one by one, or in spans: see
        :data:`SPAN_MAX`), and the replies of the commands ``after`` adds to a pipeline, read
        after every text. Once the run's spans and hashes are known, one pipeline reads each
        sample's text from its span or its own field, then the spans and hashes again, then
        ``after``'s commands: a span or hash that came meanwhile makes it read again (up to
        :data:`_STABLE_TRIES` times), so that the texts are those of one moment."""
        low, high = min(sample_ids), max(sample_ids)
        spanned = [name for name in names if name in _SPANNED]
        ordered = sorted(set(sample_ids))

        def layout(pipe: Pipeline) -> None:
            for name in spanned:
                pipe.zrangebyscore(keys.ranges_of(name), low - SPAN_MAX + 1, high)
            for name in names:
                pipe.exists(_hash(keys, name))

        with self._client.pipeline(transaction=False) as pipe:
            layout(pipe)
            seen = pipe.execute()
        for _ in range(_STABLE_TRIES):
            asked: list[tuple[str, bool, list[Any]]] = []  # (column, spans?, fields)
            with self._client.pipeline(transaction=False) as pipe:
                for n, name in enumerate(names):
                    if not seen[len(spanned) + n]:
                        continue
                    listed = seen[spanned.index(name)] if name in spanned else []
                    spanning, covered = _holding(listed, ordered)
                    alone = [i for i in sample_ids if i not in covered] if covered else sample_ids
                    for is_span, wanted in ((True, spanning), (False, alone)):
                        if wanted:
                            pipe.hmget(_hash(keys, name), wanted)
                            asked.append((name, is_span, wanted))
                layout(pipe)
                after(pipe)
                replies = pipe.execute()
            now = replies[len(asked) : len(asked) + len(seen)]
            if now == seen:
                break
            seen = now
        found: dict[str, dict[int, str]] = {name: {} for name in names}
        for (name, is_span, of), texts in zip(asked, replies, strict=False):
            if is_span:
                found[name].update(spans(of, texts))
            else:
                found[name].update((i, t) for i, t in zip(of, texts, strict=True) if t is not None)
        values = [[found[name].get(i) for i in sample_ids] for name in names]
        return values, replies[len(asked) + len(seen) :]

    def scores(self, run_id: str) -> dict[int, dict[str, float]]:
        """Every scored sample's metrics, by sample id."""
        pairs = list(self._scan_texts(RunKeys(run_id).score))
        scores = scores_of([i for i, _ in pairs], [text for _, text in pairs])
        spill = Spill.read(self._client, run_id)  # after the scan: what spilled during it is here
        for index in spill.parts:
            chunk = spill.column(index, "scores")
            scores.update(scores_of(chunk.sample_ids, chunk.scores))
        self._unsealed(run_id)
        return scores

    def failures(self, run_id: str) -> dict[int, str]:
        """Every failed sample's ``stage/kind``, by sample id."""
        found = {int(i): error_kind(raw) for i, raw in self._scan(RunKeys(run_id).err)}
        spill = Spill.read(self._client, run_id)  # after the scan: what spilled during it is here
        for index in spill.parts:
            chunk = spill.column(index, "error")
            found.update(
                (i, error_kind(e))
                for i, e in zip(chunk.sample_ids, chunk.errors, strict=True)
                if e is not None
            )
        self._unsealed(run_id)
        return found

    def timeline(self, run_id: str) -> list[tuple[float, int]]:
        """(Unix time, samples settled) of every write that settled samples, oldest first (the
        time is the settled stream's entry id)."""
        entries: Any = self._client.xrange(RunKeys(run_id).settled)
        found = [
            (int(str(entry_id).split("-")[0]) / 1000, len(settled_ids(fields)))
            for entry_id, fields in entries or []
        ]
        self._unsealed(run_id)
        return found

    def errors_by_kind(self, run_id: str) -> Counter[str]:
        """Terminal errors by kind: those in Redis and those spilled (counted into
        ``evalq:{run}:errors``), read again if a spill moved some while they were counted."""
        keys = RunKeys(run_id)
        for _ in range(_STABLE_TRIES):
            before = self._client.hlen(keys.spill)
            live = error_kinds(raw for _, raw in self._scan(keys.err))
            counts = Counter(live) + self.kept(run_id)
            if self._client.hlen(keys.spill) == before:
                break
        self._unsealed(run_id)
        return counts

    def kept(self, run_id: str) -> Counter[str]:
        """The error counts by kind kept in ``evalq:{run}:errors`` (those of spilled segments,
        and once the run is sealed, all of them)."""
        raw = self._client.hgetall(RunKeys(run_id).errors)
        return Counter({str(k): int(v) for k, v in raw.items()})

    def _unsealed(self, run_id: str) -> None:
        """:class:`Sealed` if the run is sealed (after a read that checked nothing itself)."""
        if self._client.hexists(RunKeys(run_id).meta, "archive_url"):
            raise Sealed(run_id)

    def _scan(self, key: str) -> Iterator[tuple[str, str]]:
        yield from self._client.hscan_iter(key, count=SCAN_COUNT)

    def _scan_texts(self, key: str) -> Iterator[tuple[int, str]]:
        """(sample id, text) of every sample the hash ``key`` holds, one by one or in spans."""
        for field, text in self._scan(key):
            if span_bounds(field) is None:
                yield int(field), text
            else:
                yield from spans([field], [text])


def settled_ids(fields: Any) -> list[int]:
    """The sample ids of one entry of a run's settled stream (written by ``settle.lua``: ids
    separated by commas, or a span's ``lo-hi``)."""
    listed = str(fields["ids"])
    bounds = span_bounds(listed)
    if bounds is not None:
        return list(range(bounds[0], bounds[1] + 1))
    return [int(i) for i in listed.split(",")]
