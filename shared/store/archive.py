"""Ended runs' per-sample results as Parquet at ``EVALQ_ARCHIVE_URL`` (any fsspec URL).

One attempt at archiving a run writes into a folder of its own,
``<archive>/<run>/<attempt>/``: ``part-00000.parquet``, ``part-00001.parquet``, … (columns
``sample_id``; ``output`` as a column of its values where they have one Arrow type that gives
each stored text back exactly, else their JSON text (:func:`typed_output`); ``scores``,
``error``, ``usage`` (a language model's tokens) and ``grade`` (a grader's verdict) as the live
store holds them, JSON text; ``score.<metric>`` as float64 for analysis), then
``manifest.json`` last (the parts, their rows, and the run record with its progress,
aggregate, stats, provenance, timeline and error counts). A folder without a
manifest is an attempt that died: it is never read, and the attempt that wins removes it.
Which attempt won is decided in Redis (:meth:`evalq.shared.store.seal.Sealer.seal`), not here: a
folder is the run's archive once the run's record names it.

While a run goes, its complete segments are spilled (``EVALQ_SPILL_ROWS``): each to one part
of its own, ``<archive>/<run>/spill/segment-<k>-<token>.parquet`` (the same columns), which
the run's record in Redis names (:meth:`evalq.shared.store.spill.Spiller.spill`); the attempt that
archives the run reads them back like the rest, and the seal's tidy-up removes the spill
folder.

This module knows Parquet and fsspec; it never touches Redis.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Container, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from evalq.shared.errors import ArchiveUnreadableError, first_line
from evalq.shared.models import from_json, scores_values, to_json
from evalq.shared.store.envelopes import enveloped_columns, opened

__all__ = [
    "MANIFEST",
    "OUTPUT_ENCODING",
    "PART_ROWS",
    "RAW_COLUMNS",
    "ArchiveReader",
    "ArchiveWriter",
    "Chunk",
    "inside",
    "read_part",
    "read_part_group",
    "remove_others",
    "remove_part",
    "remove_run",
    "run_folder",
    "spill_url",
    "table_of",
    "typed_output",
    "typed_table",
    "write_part",
]

MANIFEST = "manifest.json"
PART_ROWS = 131_072
"""Rows per Parquet file: what an archiver holds in memory at once."""
GROUP_BYTES = 4 * 2**20
"""Bytes of a part's row group, about: what a reader of the part holds at once (a part of
200 outputs of 250 KB in one row group was read whole by each results stream)."""
READ_ROWS = 65_536
"""Rows per batch when a reader streams an archive."""
RAW_COLUMNS = ("sample_id", "output", "scores", "error", "usage", "grade")
"""The columns that give back exactly what the live store held (in :class:`Chunk`'s order)."""
_TEXTS = RAW_COLUMNS[1:]
OUTPUT_ENCODING = b"evalq.output"
"""The ``output`` field's metadata key: ``value`` (a column of the outputs' values) or
``json`` (their JSON text). A file without it (written before outputs were typed) holds JSON
text."""


def _writable(kind: pa.DataType) -> bool:
    """Whether Parquet stores ``kind``: no null column, no struct without fields, anywhere."""
    if pa.types.is_null(kind) or (pa.types.is_struct(kind) and kind.num_fields == 0):
        return False
    return all(_writable(kind.field(i).type) for i in range(kind.num_fields))


def _values(texts: list[str | None]) -> pa.Array | None:
    """Outputs' JSON texts as one column of their values, or None where no Arrow type gives
    every text back exactly (and no output as null)."""
    values = [None if t is None else from_json(t) for t in texts]
    try:
        typed = pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return None
    if not _writable(typed.type):
        return None
    for value, text in zip(typed.to_pylist(), texts, strict=True):
        if (value is None) != (text is None) or (text is not None and to_json(value) != text):
            return None
    return typed


def typed_output(texts: pa.Array | pa.ChunkedArray) -> tuple[pa.Field, pa.Array]:
    """Outputs' JSON texts (None: no output) as a column of their values when pyarrow infers
    one type (string, int64, double, bool, list, struct) in which every value reads back as
    exactly its text, else the texts themselves (a mix of types, dicts with other keys, an
    output of JSON ``null``); the field's metadata says which (:data:`OUTPUT_ENCODING`)."""
    found = texts.to_pylist()
    typed = _values(found)
    column = pa.array(found, pa.string()) if typed is None else typed
    encoding = b"json" if typed is None else b"value"
    return pa.field("output", column.type, metadata={OUTPUT_ENCODING: encoding}), column


def typed_table(table: pa.Table) -> pa.Table:
    """``table`` (an ``output`` column of JSON texts) with its outputs typed
    (:func:`typed_output`)."""
    field, column = typed_output(table.column("output"))
    return table.set_column(table.column_names.index("output"), field, column)


def _output_texts(table: pa.Table | pa.RecordBatch, schema: pa.Schema) -> list[str | None]:
    """A table's outputs as JSON texts, whichever layout ``schema`` (the file's) says they
    were written in."""
    metadata = schema.field("output").metadata or {}
    values: list[Any] = table.column("output").to_pylist()
    if metadata.get(OUTPUT_ENCODING) != b"value":
        return values
    return [None if v is None else to_json(v) for v in values]


def _texts_of(
    table: pa.Table | pa.RecordBatch, schema: pa.Schema, columns: Container[str] = _TEXTS
) -> dict[str, list[str | None]]:
    """A part's texts (its raw columns but ``sample_id``) as the store holds them, whichever
    layout ``schema`` (the file's) says it was written in: outputs typed or not; a part
    without a ``usage`` column (written before usage and grades had their own) holds them
    inside the outputs' and the scores' texts, taken apart here. Columns not in ``columns``
    (or not read) are nulls."""
    rows = table.num_rows
    read = set(table.schema.names)
    texts: dict[str, list[str | None]] = {
        c: (_output_texts(table, schema) if c == "output" else table.column(c).to_pylist())
        if c in columns and c in read
        else [None] * rows
        for c in _TEXTS
    }
    if "usage" not in schema.names:
        opened(texts, read, columns)
    return texts


def run_folder(archive_url: str, run_id: str) -> str:
    """Where ``run_id``'s archive attempts go under ``archive_url``."""
    return f"{archive_url.rstrip('/')}/{run_id}"


def inside(url: str, folder: str) -> bool:
    """Whether ``url`` names something under ``folder`` (the same file system, a path below
    it, no ``..``): a URL read from a record workers write is followed only where the gateway's
    own facts put the run."""
    try:
        fs, path = fsspec.core.url_to_fs(url)
        home_fs, home = fsspec.core.url_to_fs(folder)
    except (ValueError, ImportError, OSError):
        return False
    if fs.protocol != home_fs.protocol or ".." in path.split("/"):
        return False
    return str(path).startswith(str(home).rstrip("/") + "/")


def spill_url(folder: str, segment: int) -> str:
    """A new part's URL for segment ``segment`` of a going run whose folder is ``folder`` (a
    token of its own: two workers that spill the same segment never write the same file)."""
    token = uuid.uuid4().hex[:12]
    return f"{folder}/spill/segment-{segment:05d}-{token}.parquet"


@contextmanager
def _reading(url: str, run_id: str) -> Iterator[None]:
    """What cannot be read raises :class:`ArchiveUnreadableError`, one line naming the run."""
    try:
        yield
    except (OSError, ValueError, pa.ArrowException) as exc:
        what = f"run {run_id}: " if run_id else ""
        raise ArchiveUnreadableError(
            f"{what}its archive at {url} cannot be read here ({type(exc).__name__}: "
            f"{first_line(exc)}); is EVALQ_ARCHIVE_URL's store mounted on this machine?"
        ) from exc


def _write(fs: Any, path: str, table: pa.Table) -> None:
    """Write a chunk's table as a part: its outputs typed where they can be, in row groups of
    about :data:`GROUP_BYTES` (a reader holds a row group's columns whole)."""
    typed = typed_table(table)
    rows = max(1, min(typed.num_rows, typed.num_rows * GROUP_BYTES // max(1, typed.nbytes)))
    with fs.open(path, "wb") as handle:
        pq.write_table(typed, handle, compression="zstd", row_group_size=rows)


@dataclass
class Chunk:
    """Up to ``PART_ROWS`` samples of a run, in submission order, as the store holds them."""

    sample_ids: list[int]
    outputs: list[str | None]
    scores: list[str | None]
    errors: list[str | None]
    usages: list[str | None] = field(default_factory=list)
    """A language model's token usage of each output (:meth:`evalq.shared.models.Usage.stored`);
    not given: none."""
    grades: list[str | None] = field(default_factory=list)
    """A grader's grade of each scored sample (:meth:`evalq.shared.models.Grade.stored`); not
    given: none."""

    def __post_init__(self) -> None:
        n = len(self.sample_ids)
        if n and not self.usages:
            self.usages = [None] * n
        if n and not self.grades:
            self.grades = [None] * n

    @classmethod
    def empty(cls) -> Chunk:
        """No sample."""
        return cls([], [], [], [], [], [])

    @classmethod
    def of_rows(cls, sample_ids: list[int], rows: list[tuple[str | None, ...]]) -> Chunk:
        """Samples from their texts, each row in :data:`RAW_COLUMNS`' order (output, scores,
        error, usage, grade)."""
        if not rows:
            return cls(list(sample_ids), [], [], [], [], [])
        columns = [list(column) for column in zip(*rows, strict=True)]
        return cls(list(sample_ids), *columns)

    def columns(self) -> tuple[list[str | None], ...]:
        """The texts by column, in :data:`RAW_COLUMNS`' order (without ``sample_id``)."""
        return self.outputs, self.scores, self.errors, self.usages, self.grades

    def texts_of(self, wanted: Container[int]) -> dict[int, tuple[str | None, ...]]:
        """The texts (output, scores, error, usage, grade) of those samples of ``wanted`` this
        chunk holds."""
        return {
            i: tuple(texts)
            for i, *texts in zip(self.sample_ids, *self.columns(), strict=True)
            if i in wanted
        }

    def table(self) -> pa.Table:
        """The chunk as a table of the store's columns (texts) and one float64 column per
        metric found in this chunk: what a part holds, once its outputs are typed
        (:func:`typed_table`, when it is written)."""
        parsed_ones = iter(scores_values([s for s in self.scores if s is not None]))
        parsed = [None if s is None else next(parsed_ones) for s in self.scores]
        metrics = sorted({m for s in parsed if s for m in s})
        columns: dict[str, Any] = {
            "sample_id": pa.array(self.sample_ids, pa.int64()),
            "output": pa.array(self.outputs, pa.string()),
            "scores": pa.array(self.scores, pa.string()),
            "error": pa.array(self.errors, pa.string()),
            "usage": pa.array(self.usages, pa.string()),
            "grade": pa.array(self.grades, pa.string()),
        }
        for metric in metrics:
            values = [None if s is None else s.get(metric) for s in parsed]
            columns[f"score.{metric}"] = pa.array(values, pa.float64())
        return pa.table(columns)


def _ordered(table: pa.Table) -> pa.Table:
    """The raw columns first, then the metrics' by name."""
    metrics = sorted(c for c in table.column_names if c not in RAW_COLUMNS)
    return table.select([*RAW_COLUMNS, *metrics])


def table_of(chunks: Iterator[Chunk]) -> pa.Table:
    """Chunks as one table with the archive's columns (a metric missing from a chunk reads as
    nulls there), its outputs typed over all of them (:func:`typed_table`): what
    ``results_dataset`` gives of a live run, as :meth:`ArchiveReader.table` of an archived
    one."""
    tables = [chunk.table() for chunk in chunks]
    if not tables:
        return typed_table(Chunk.empty().table())
    return typed_table(_ordered(pa.concat_tables(tables, promote_options="default")))


class ArchiveWriter:
    """One attempt's folder: parts written as they come, the manifest last."""

    def __init__(self, folder_url: str) -> None:
        self._fs, self._path = fsspec.core.url_to_fs(folder_url)
        self.url = str(self._fs.unstrip_protocol(self._path))
        """Where it is, whatever the working directory of a reader (``file:///abs/...``)."""
        self._parts: list[dict[str, Any]] = []
        self._metrics: set[str] = set()
        self._fs.makedirs(self._path, exist_ok=True)

    def write(self, chunk: Chunk) -> None:
        """Write one part."""
        name = f"part-{len(self._parts):05d}.parquet"
        table = chunk.table()
        _write(self._fs, f"{self._path}/{name}", table)
        self._metrics.update(
            c.removeprefix("score.") for c in table.column_names[len(RAW_COLUMNS) :]
        )
        self._parts.append({"file": name, "rows": table.num_rows})

    @property
    def rows(self) -> int:
        """Rows written so far."""
        return sum(part["rows"] for part in self._parts)

    def finish(self, record: dict[str, Any]) -> None:
        """Write the manifest (the parts and ``record``): the attempt is complete."""
        manifest = {"parts": self._parts, "metrics": sorted(self._metrics), **record}
        with self._fs.open(f"{self._path}/{MANIFEST}", "w", encoding="utf-8") as handle:
            handle.write(json.dumps(manifest, allow_nan=False))

    def remove(self) -> None:
        """Delete this attempt's folder (it lost, or failed)."""
        if self._fs.exists(self._path):
            self._fs.rm(self._path, recursive=True)


def remove_others(folder_url: str, keep: str) -> int:
    """Delete the attempt folders in a run's folder other than ``keep`` (the one that won);
    return how many went."""
    fs, path = fsspec.core.url_to_fs(folder_url)
    if not fs.exists(path):
        return 0
    gone = 0
    for entry in fs.ls(path, detail=False):
        if str(entry).rstrip("/").rsplit("/", 1)[-1] != keep:
            fs.rm(entry, recursive=True)
            gone += 1
    return gone


def write_part(url: str, chunk: Chunk) -> str:
    """Write ``chunk`` as one Parquet file at ``url`` (a spilled segment); return its
    absolute URL."""
    fs, path = fsspec.core.url_to_fs(url)
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    _write(fs, path, chunk.table())
    return str(fs.unstrip_protocol(path))


def read_part(url: str, run_id: str = "", columns: tuple[str, ...] = RAW_COLUMNS) -> Chunk:
    """A spilled segment's stored texts, as :func:`write_part` wrote them (only ``columns``
    read: the others come back as nulls)."""
    with _reading(url, run_id):
        fs, path = fsspec.core.url_to_fs(url)
        with fs.open(path, "rb") as handle:
            parquet = pq.ParquetFile(handle)
            schema = parquet.schema_arrow
            table = parquet.read(columns=enveloped_columns(("sample_id", *columns), schema))
    return _chunk_of(table, schema, columns)


def read_part_group(url: str, run_id: str, row: int) -> tuple[int, Chunk]:
    """The row group of a spilled segment's part that holds its row ``row``: the group's first
    row and its texts (a reader of a few samples holds one group, about :data:`GROUP_BYTES`,
    not the part)."""
    with _reading(url, run_id):
        fs, path = fsspec.core.url_to_fs(url)
        with fs.open(path, "rb") as handle:
            parquet = pq.ParquetFile(handle)
            first = 0
            for group in range(parquet.metadata.num_row_groups):
                size = parquet.metadata.row_group(group).num_rows
                if row < first + size:
                    table = parquet.read_row_group(group)
                    return first, _chunk_of(table, parquet.schema_arrow, RAW_COLUMNS)
                first += size
    raise ArchiveUnreadableError(f"run {run_id}: its spilled part {url} has no row {row}")


def _chunk_of(table: pa.Table, schema: pa.Schema, columns: tuple[str, ...]) -> Chunk:
    """A part's rows as the store's texts (the columns not in ``columns``: nulls)."""
    texts = _texts_of(table, schema, columns)
    return Chunk(table.column("sample_id").to_pylist(), *(texts[c] for c in _TEXTS))


def remove_part(url: str, run_id: str) -> bool:
    """Delete a part ``run_id`` spilled; False, deleting nothing, for a URL that is not
    one (Redis names the parts: a record gone wrong must not delete other files)."""
    if not re.search(rf"/{re.escape(run_id)}/spill/segment-\d+-[0-9a-f]+\.parquet$", url):
        return False
    fs, path = fsspec.core.url_to_fs(url)
    if fs.exists(path):
        fs.rm(path)
    return True


def remove_run(folder_url: str) -> bool:
    """Delete a run's whole archive folder; False if there was none."""
    fs, path = fsspec.core.url_to_fs(folder_url)
    if not fs.exists(path):
        return False
    fs.rm(path, recursive=True)
    return True


class ArchiveReader:
    """A sealed attempt's folder, read back: the manifest (read when first needed), and the
    parts as record batches. What cannot be read raises :class:`ArchiveUnreadableError`, one
    line naming the run."""

    def __init__(self, folder_url: str, run_id: str = "") -> None:
        self.url = folder_url
        self._run = run_id
        self._manifest: dict[str, Any] | None = None
        with self._reading():
            self._fs, self._path = fsspec.core.url_to_fs(folder_url)

    def _reading(self) -> Any:
        return _reading(self.url, self._run)

    @property
    def manifest(self) -> dict[str, Any]:
        """The manifest: the parts, the run record and what was counted."""
        if self._manifest is None:
            with (
                self._reading(),
                self._fs.open(f"{self._path}/{MANIFEST}", "r", encoding="utf-8") as handle,
            ):
                self._manifest = json.loads(handle.read())
        return self._manifest

    @property
    def files(self) -> list[str]:
        """The parts' URLs, in submission order of their rows."""
        protocol = self._fs.protocol if isinstance(self._fs.protocol, str) else "file"
        prefix = "" if protocol == "file" else f"{protocol}://"
        return [f"{prefix}{self._path}/{part['file']}" for part in self.manifest["parts"]]

    def batches(
        self, columns: tuple[str, ...] = RAW_COLUMNS, rows: int = READ_ROWS
    ) -> Iterator[pa.RecordBatch]:
        """The rows, ``rows`` at a time, in submission order, as the store held them (outputs
        as JSON text, in either layout; missing metric columns of a part read as nulls)."""
        for part in self.manifest["parts"]:
            with self._reading(), self._fs.open(f"{self._path}/{part['file']}", "rb") as handle:
                parquet = pq.ParquetFile(handle)
                schema = parquet.schema_arrow
                present = enveloped_columns(columns, schema)
                for batch in parquet.iter_batches(batch_size=rows, columns=present):
                    texts = _texts_of(batch, schema, columns)
                    arrays = [
                        pa.array(texts[c], pa.string())
                        if c in texts
                        else batch.column(c)
                        if c in present
                        else pa.nulls(batch.num_rows, pa.float64())
                        for c in columns
                    ]
                    yield pa.RecordBatch.from_arrays(arrays, names=list(columns))

    def rows(self, positions: list[int]) -> Chunk:
        """The stored texts of the rows at ``positions`` (their places in submission order,
        over the whole run), in that order, reading only the parts that hold them, and of
        each only the raw columns."""
        found: dict[int, tuple[int, tuple[str | None, ...]]] = {}
        start = 0
        for part in self.manifest["parts"]:
            stop = start + int(part["rows"])
            local = sorted({p - start for p in positions if start <= p < stop})
            if local:
                path = f"{self._path}/{part['file']}"
                with self._reading(), self._fs.open(path, "rb") as handle:
                    parquet = pq.ParquetFile(handle)
                    schema = parquet.schema_arrow
                    taken = parquet.read(columns=enveloped_columns(RAW_COLUMNS, schema)).take(local)
                    texts = _texts_of(taken, schema)
                    rows = zip(
                        taken.column("sample_id").to_pylist(),
                        zip(*(texts[c] for c in _TEXTS), strict=True),
                        strict=True,
                    )
                    found.update(zip((start + i for i in local), rows, strict=True))
            start = stop
        kept = [found[p] for p in positions if p in found]
        return Chunk.of_rows([row[0] for row in kept], [row[1] for row in kept])

    def table(self) -> pa.Table:
        """Every row as one table with every metric's column, its outputs typed over the whole
        run (:func:`typed_table`; for ``datasets``)."""
        columns = (*RAW_COLUMNS, *(f"score.{m}" for m in self.manifest["metrics"]))
        batches = list(self.batches(columns))
        if not batches:
            return typed_table(Chunk.empty().table())
        return typed_table(_ordered(pa.Table.from_batches(batches)))
