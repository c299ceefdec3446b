"""Run reports: what ``evalq report RUN --out report.html`` shows, gathered as its reader may
see it (:func:`gather`); :mod:`evalq.producer.reports.page` renders it as one self-contained HTML
page with :mod:`evalq.producer.reports.charts`' charts.

Per-metric aggregates, the score distribution, throughput over time (from the run's settled
stream), errors by kind, per-shard progress, and the failed and lowest-scoring samples (each
of the latter with its input and target, read from the run's data, beside its output). The
page shows what ``status`` would show the reader and no more: the score distribution and the
samples need per-sample access (a ``viewable`` split, or ``--admin``); on a ``non_viewable``
split they are withheld and only aggregates appear.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from evalq.producer.service.samples import Samples, labels_of, target_of
from evalq.producer.service.views import RunView
from evalq.shared.data.loading import shard_of_rows
from evalq.shared.data.routing import KMeans
from evalq.shared.errors import EvalqError, TierRefusedError
from evalq.shared.evals.language import language_run
from evalq.shared.models import SampleResult, SampleState, from_json
from evalq.shared.store.archive import RAW_COLUMNS
from evalq.shared.store.wire import result_of

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

__all__ = ["LISTED", "Report", "ShardProgress", "gather"]


@dataclass
class ShardProgress:
    """Samples of one shard, by state."""

    scored: int = 0
    failed: int = 0
    total: int = 0


@dataclass
class Report:
    """What the page shows, already filtered by the reader's access."""

    view: RunView
    scores: dict[str, list[float]] | None
    """Per-sample values of each metric; None when the tier withholds them."""
    scores_withheld: str | None
    timeline: list[tuple[float, int]]
    shards: list[ShardProgress] = field(default_factory=list)
    shards_note: str | None = None
    failures: list[SampleResult] = field(default_factory=list)
    """The first failed samples (per-sample access only)."""
    worst: list[tuple[float, SampleResult]] = field(default_factory=list)
    """The lowest-scoring samples by the first metric (per-sample access only)."""
    rows: dict[int, dict[str, Any]] | None = None
    """The rows of the lowest-scoring samples, labels included, from the run's data (per-sample
    access only); None when they could not be read (``rows_note`` says why)."""
    rows_note: str | None = None
    labels: tuple[str, ...] = ()
    """The evaluation's label fields (a language task's target first): scrubbed from the
    input shown."""
    targets: dict[int, Any] = field(default_factory=dict)
    """The target of each row read (:func:`evalq.producer.service.samples.target_of`)."""
    prompts: dict[int, Any] = field(default_factory=dict)
    """A language task's samples among the rows read: what the model read
    (:meth:`evalq.shared.lm.run.LanguageRun.shown_prompt`: the prompt with its few-shot
    examples, a local model's chat template applied, or an endpoint chat task's messages)."""
    generated: float = field(default_factory=time.time)


def _shard_of(samples: Samples, view: RunView) -> tuple[np.ndarray | None, int, str | None]:
    """The shard of every row of the run's split and the shard count, or why not (the rows
    are read only for a routing that depends on them)."""
    try:
        spec = samples.spec(view.meta.run_id)
        rows = samples.split_rows(spec) if isinstance(spec.routing, KMeans) else None
        return shard_of_rows(spec, rows), spec.shards, None
    except EvalqError as exc:
        return None, 0, f"per-shard progress needs the run's data on this machine: {exc}"


def gather(view: RunView, samples: Samples) -> Report:
    """Everything the report of a run shows to one reader, from the run's status as that
    reader sees it (``view``) and the reader's per-sample reads (``samples``), in one pass over
    the run's results (tables, live or archived): score values and per-shard counts only where
    the reader may read per-sample results (a split's shards are cut by its rows' content: a
    ``kmeans`` routing on any column, the label included, would make shard counts a per-row
    histogram of it)."""
    run_id = view.meta.run_id
    values: dict[str, list[np.ndarray]] = {}
    lowest = _Lowest()
    withheld = None
    try:
        states = _table_states(samples.result_tables(run_id), values, lowest)
    except TierRefusedError as exc:
        states, withheld = _states(samples.states(run_id)), str(exc)
    shard_of, count, note = (None, 0, withheld) if withheld else _shard_of(samples, view)
    shards = [ShardProgress() for _ in range(count)]
    for ids, scored, failed in states:
        if shard_of is not None:
            _count(shards, shard_of[ids], scored, failed)
    scores = None
    if withheld is None:
        import numpy as np

        scores = {name: np.concatenate(parts).tolist() for name, parts in values.items()}
    try:
        timeline = samples.timeline(run_id)
    except TierRefusedError:
        timeline = []  # per-sample timing: the run's status shows it as a whole
    worst = lowest.lowest()
    rows, rows_note = None, None
    targets: dict[int, Any] = {}
    prompts: dict[int, Any] = {}
    if withheld is None and worst:
        try:
            rows = samples.rows(run_id, [r.sample_id for _, r in worst])
        except EvalqError as exc:
            rows_note = f"inputs and targets need the run's data on this machine: {exc}"
        else:
            targets, prompts = _targets(view, rows)
    return Report(
        view,
        scores,
        withheld,
        timeline,
        shards,
        note,
        failures=lowest.failures,
        worst=worst,
        rows=rows,
        rows_note=rows_note,
        labels=labels_of(view.meta),
        targets=targets,
        prompts=prompts,
    )


def _targets(
    view: RunView, rows: dict[int, dict[str, Any]]
) -> tuple[dict[int, Any], dict[int, Any]]:
    """Each read row's target, and a language task's prompts."""
    run = language_run(view.meta)
    targets = {i: target_of(view.meta, row) for i, row in rows.items()}
    prompts: dict[int, Any] = {}
    if run is not None:
        for i, row in rows.items():
            try:
                prompts[i] = run.shown_prompt(row, i)
            except EvalqError:  # a row the task cannot fill: the sample failed for it
                continue
    return targets, prompts


States = Iterator[tuple["np.ndarray", "np.ndarray", "np.ndarray"]]
"""Chunks of (sample ids, scored, failed) as arrays."""


def _table_states(
    tables: Iterator[pa.Table], values: dict[str, list[np.ndarray]], lowest: _Lowest
) -> States:
    """Each table's states, gathering its metric values into ``values`` and its failures and
    low scores into ``lowest`` on the way."""
    for table in tables:
        for column in table.column_names:
            if column.startswith("score."):
                found = table.column(column).drop_null().to_numpy()
                values.setdefault(column.removeprefix("score."), []).append(found)
        lowest.see(table)
        yield (
            table.column("sample_id").to_numpy(),
            table.column("scores").is_valid().to_numpy(zero_copy_only=False),
            table.column("error").is_valid().to_numpy(zero_copy_only=False),
        )


def _states(found: Iterator[tuple[int, SampleState]], size: int = 65_536) -> States:
    """States one by one (a reader without per-sample access) as chunks of arrays."""
    import numpy as np

    while chunk := list(itertools.islice(found, size)):
        ids = np.array([i for i, _ in chunk], dtype=np.int64)
        scored = np.array([s is SampleState.SCORED for _, s in chunk], dtype=bool)
        failed = np.array([s is SampleState.FAILED for _, s in chunk], dtype=bool)
        yield ids, scored, failed


def _count(
    shards: list[ShardProgress], shard: np.ndarray, scored: np.ndarray, failed: np.ndarray
) -> None:
    import numpy as np

    size = len(shards)
    for index, (total, ok, bad) in enumerate(
        zip(
            np.bincount(shard, minlength=size),
            np.bincount(shard[scored], minlength=size),
            np.bincount(shard[failed], minlength=size),
            strict=True,
        )
    ):
        shards[index].total += int(total)
        shards[index].scored += int(ok)
        shards[index].failed += int(bad)


LISTED = 10
"""Failed and worst-scoring samples the report lists."""


@dataclass
class _Lowest:
    """The first failures and the lowest scores of the first metric (the first scored
    sample's first, by name), kept as tables of results pass."""

    failures: list[SampleResult] = field(default_factory=list)
    worst: list[tuple[float, SampleResult]] = field(default_factory=list)
    metric: str | None = None

    def see(self, table: pa.Table) -> None:
        import numpy as np

        if len(self.failures) < LISTED:
            failed = np.flatnonzero(table.column("error").is_valid().to_numpy(zero_copy_only=False))
            self.failures += [_result(table, i) for i in failed[: LISTED - len(self.failures)]]
        if self.metric is None:
            first = table.column("scores").drop_null()
            if len(first) == 0:
                return
            self.metric = sorted(from_json(first[0].as_py()))[0]
        column = f"score.{self.metric}"
        if column not in table.column_names:
            return
        present = np.flatnonzero(table.column(column).is_valid().to_numpy(zero_copy_only=False))
        found = table.column(column).to_numpy(zero_copy_only=False)
        ids = table.column("sample_id").to_numpy()
        lowest = present[np.lexsort((ids[present], found[present]))[:LISTED]]
        self.worst += [(float(found[i]), _result(table, i)) for i in lowest]
        self.worst = self.lowest()

    def lowest(self) -> list[tuple[float, SampleResult]]:
        """The ``LISTED`` lowest scores, lowest first (ties by sample id)."""
        return sorted(self.worst, key=lambda w: (w[0], w[1].sample_id))[:LISTED]


def _result(table: pa.Table, row: int) -> SampleResult:
    """One row of a results table as a result."""
    sample_id, output, scores, error, usage, grade = (
        table.column(c)[int(row)].as_py() for c in RAW_COLUMNS
    )
    return result_of(sample_id, output, scores, error, usage=usage, grade=grade)
