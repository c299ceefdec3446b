"""Writing a run's per-sample results as jsonl, csv or parquet."""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Iterable
from enum import StrEnum
from pathlib import Path
from typing import IO, Any

from shared.errors import InputError
from shared.models import SampleResult

__all__ = ["ExportFormat", "flatten", "write_results"]


class ExportFormat(StrEnum):
    """Formats of ``evalq results``."""

    JSONL = "jsonl"
    CSV = "csv"
    PARQUET = "parquet"


def flatten(result: SampleResult) -> dict[str, Any]:
    """One flat record: ``sample_id``, ``output`` (JSON text), ``score.<metric>``, ``error``,
    and ``input.<field>`` with ``--with-input`` (JSON text when not a scalar)."""
    record: dict[str, Any] = {
        "sample_id": result.sample_id,
        "output": None if result.output is None else json.dumps(result.output, sort_keys=True),
        "error": None if result.error is None else f"{result.error.kind}: {result.error.message}",
    }
    for name, value in sorted((result.scores or {}).items()):
        record[f"score.{name}"] = value
    for name, field in (result.input or {}).items():
        scalar = field is None or isinstance(field, str | int | float | bool)
        record[f"input.{name}"] = field if scalar else json.dumps(field, sort_keys=True)
    return record


def _write_jsonl(results: Iterable[SampleResult], handle: IO[str]) -> int:
    count = 0
    for result in results:
        handle.write(result.model_dump_json(exclude_none=True) + "\n")
        handle.flush()
        count += 1
    return count


def _write_csv(results: Iterable[SampleResult], handle: IO[str]) -> int:
    records = [flatten(r) for r in results]
    columns = list(dict.fromkeys(k for record in records for k in record))
    writer = csv.DictWriter(handle, fieldnames=columns)
    writer.writeheader()
    writer.writerows(records)
    return len(records)


def _write_parquet(results: Iterable[SampleResult], path: Path) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = [flatten(r) for r in results]
    pq.write_table(pa.Table.from_pylist(records), path)
    return len(records)


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
