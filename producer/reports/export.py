"""Writing a run's per-sample results as jsonl, csv or parquet."""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

from evalq.shared.choices import ExportFormat
from evalq.shared.errors import InputError
from evalq.shared.models import ErrorRecord, Grade, SampleResult, to_json

__all__ = ["ExportFormat", "csv_output", "flatten", "write_lines", "write_results"]


def flatten(result: SampleResult) -> dict[str, Any]:
    """One flat record: ``sample_id``, ``output`` (JSON text, as stored; Parquet types it,
    :func:`evalq.shared.store.archive.typed_table`, and CSV writes :func:`csv_output`), ``error``
    (``kind: message``), ``score.<metric>``, ``grade.verdict`` and ``grade.prompt`` for a
    graded sample, and ``input.<field>`` with ``--with-input`` (JSON text when not a
    scalar)."""
    record: dict[str, Any] = {
        "sample_id": result.sample_id,
        "output": None if result.output is None else to_json(result.output),
        "error": None if result.error is None else f"{result.error.kind}: {result.error.message}",
    }
    for name, value in sorted((result.scores or {}).items()):
        record[f"score.{name}"] = value
    if result.grade is not None:
        record["grade.verdict"] = result.grade.verdict
        record["grade.prompt"] = result.grade.prompt
    for name, field in (result.input or {}).items():
        scalar = field is None or isinstance(field, str | int | float | bool)
        record[f"input.{name}"] = field if scalar else json.dumps(field, sort_keys=True)
    return record


def _write_jsonl(results: Iterable[SampleResult], handle: IO[str]) -> int:
    from evalq.shared.store.wire import result_line  # pyarrow: not for `evalq --help`

    count = 0
    for result in results:
        handle.write(result_line(result))
        handle.flush()
        count += 1
    return count


def write_lines(lines: Iterable[str], out: Path | None) -> int:
    """Write JSON lines (:func:`evalq.shared.store.wire.text_line`) to ``out`` (stdout when None);
    return how many."""
    if out is None:
        return _copy_lines(lines, sys.stdout)
    with out.open("w", encoding="utf-8") as handle:
        return _copy_lines(lines, handle)


def _copy_lines(lines: Iterable[str], handle: IO[str]) -> int:
    count = 0
    for line in lines:
        handle.write(line)
        count += 1
    handle.flush()
    return count


def csv_output(text: str | None) -> str | None:
    """What a CSV ``output`` cell holds for an output stored as the JSON ``text``: a string
    output is its own text (the JSON ``"positive"`` is the cell ``positive``, where the JSON
    text came out quoted three times over); any other output its JSON text (``{"a":1}``,
    ``3``, ``true``), so a string that reads as JSON reads as such in CSV."""
    if text is not None and text.startswith('"'):
        value = json.loads(text)
        if isinstance(value, str):
            return value
    return text


def _write_csv(results: Iterable[SampleResult], handle: IO[str]) -> int:
    records = [flatten(r) for r in results]
    for record in records:
        record["output"] = csv_output(record["output"])
    return _csv(records, handle)


def _csv(records: list[dict[str, Any]], handle: IO[str]) -> int:
    columns = list(dict.fromkeys(k for record in records for k in record))
    writer = csv.DictWriter(handle, fieldnames=columns)
    writer.writeheader()
    writer.writerows(records)
    return len(records)


def _write_parquet(results: Iterable[SampleResult], path: Path) -> int:
    import pyarrow as pa

    records = [flatten(r) for r in results]
    _parquet(pa.Table.from_pylist(records), path)
    return len(records)


def _parquet(table: pa.Table, path: Path) -> None:
    """Write a flat table as Parquet, its outputs typed where they can be
    (:func:`evalq.shared.store.archive.typed_table`; a table of no result has no column)."""
    import pyarrow.parquet as pq

    from evalq.shared.store.archive import typed_table

    pq.write_table(typed_table(table) if "output" in table.column_names else table, path)


def flat_table(table: pa.Table) -> pa.Table:
    """A table of the store's columns (:func:`evalq.shared.store.archive.table_of`) as the records
    :func:`flatten` gives, column for column."""
    import pyarrow as pa
    import pyarrow.compute as pc

    output = table.column("output")
    errors = [
        None if e is None else _error_text(ErrorRecord.model_validate_json(e))
        for e in table.column("error").to_pylist()
    ]
    metrics = sorted(c for c in table.column_names if c.startswith("score."))
    columns: dict[str, Any] = {
        "sample_id": table.column("sample_id"),
        "output": pc.if_else(pc.equal(output, "null"), pa.scalar(None, pa.string()), output),
        "error": pa.array(errors, pa.string()),
    }
    columns.update({m: table.column(m) for m in metrics})
    texts = table.column("grade").to_pylist()
    grades = [None if t is None else Grade.model_validate_json(t) for t in texts]
    if any(grades):
        for name in ("verdict", "prompt"):
            values = [None if g is None else getattr(g, name) for g in grades]
            columns[f"grade.{name}"] = pa.array(values, pa.string())
    return pa.table(columns)


def _error_text(error: ErrorRecord) -> str:
    return f"{error.kind}: {error.message}"


def write_tables(tables: Iterable[pa.Table], fmt: ExportFormat, out: Path | None) -> int:
    """Write a run's results given as tables of the store's columns, as csv or parquet (the
    same file :func:`write_results` writes from the same results); return the row count."""
    import pyarrow as pa

    flat = [flat_table(t) for t in tables]
    table = pa.concat_tables(flat, promote_options="default") if flat else None
    if fmt is ExportFormat.PARQUET:
        if out is None:
            raise InputError("--format parquet needs --out PATH")
        if table is None:
            return _write_parquet([], out)
        _parquet(table, out)
        return int(table.num_rows)
    if out is None:
        return _csv_table(table, sys.stdout)
    with out.open("w", encoding="utf-8", newline="") as handle:
        return _csv_table(table, handle)


def _csv_table(table: pa.Table | None, handle: IO[str]) -> int:
    if table is None:
        return _csv([], handle)
    writer = csv.writer(handle)
    writer.writerow(table.column_names)
    for batch in table.to_batches(max_chunksize=10_000):
        columns = batch.to_pydict()
        columns["output"] = [csv_output(text) for text in columns["output"]]
        writer.writerows(zip(*columns.values(), strict=True))
    return int(table.num_rows)


def write_results(results: Iterable[SampleResult], fmt: ExportFormat, out: Path | None) -> int:
    """Write ``results`` to ``out`` (stdout when None, except parquet); return the row count."""
    if fmt is ExportFormat.PARQUET:
        if out is None:
            raise InputError("--format parquet needs --out PATH")
        return _write_parquet(results, out)
    writer = _write_jsonl if fmt is ExportFormat.JSONL else _write_csv
    if out is None:
        return writer(results, sys.stdout)
    with out.open("w", encoding="utf-8", newline="") as handle:
        return writer(results, handle)
