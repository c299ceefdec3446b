"""A run's per-sample reads, beside the stores: results (as models, JSON lines, tables or a
``datasets.Dataset``), samples' rows, states and settling times, and a follower of new results.

Each asks the policy first (:meth:`evalq.producer.service.direct.Direct.readable`: per-sample
access, or per-sample timing for :meth:`Samples.timeline`).
:class:`evalq.producer.service.client.Client` answers the client interface's result reads from
here; the rest (rows, states, the timeline, the spec and a follower whose steps never wait) serve
code that runs where the stores are: the report (:mod:`evalq.producer.service.report`) and the
gateway's streams. Over HTTP, a client has only the former.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from evalq.producer.service.direct import Direct
from evalq.producer.service.follower import Follower
from evalq.producer.service.views import SamplePage, SampleQuery, rows_per_read
from evalq.shared.data.spec import DatasetSpec
from evalq.shared.errors import EvalqError, TierRefusedError
from evalq.shared.evals.harness import harness_run
from evalq.shared.evals.language import language_run
from evalq.shared.evaluation import label_fields
from evalq.shared.lm.harness import HarnessRun
from evalq.shared.models import RunMeta, SampleResult, SampleState
from evalq.shared.store.archive import PART_ROWS, table_of
from evalq.shared.store.pages import PageQuery, PageReader
from evalq.shared.store.wire import chunk_lines, results_of

if TYPE_CHECKING:
    import pyarrow as pa
    from datasets import Dataset

    from evalq.shared.lm.lmeval_runtime import Scoring

__all__ = ["FOLLOW_BLOCK_MS", "Samples", "labels_of", "target_of"]

SCORINGS = 8
"""Runs whose lm-eval task a process keeps built for their sample pages."""
FOLLOW_BLOCK_MS = 500
"""How long each step of ``follow_results`` waits for a new result before it looks again
whether the run ended."""


class Samples:
    """One reader's per-sample reads of runs."""

    def __init__(self, direct: Direct) -> None:
        self._direct = direct
        self._scorings: dict[str, Scoring] = {}
        """lm-eval tasks built for their runs' sample pages (:func:`_logged`), the latest
        :data:`SCORINGS` runs'."""

    def results(self, run_id: str, with_input: bool = False) -> Iterator[SampleResult]:
        """Per-sample results (each with its row when ``with_input``: the run's data must be
        readable here); refused unless the policy gives this reader full access."""
        self._direct.readable(run_id)
        rows = rows_per_read(self._direct.settings.max_output_bytes)
        found = self._direct.results.results(run_id, rows)
        return map(self._input_adder(run_id), found) if with_input else found

    def result_lines(self, run_id: str) -> Iterator[str]:
        """Per-sample results as JSON lines (:func:`evalq.shared.store.wire.text_line`), straight
        from the stored texts; refused as :meth:`results` is."""
        self._direct.readable(run_id)
        rows = rows_per_read(self._direct.settings.max_output_bytes)
        chunks = self._direct.results.chunks(run_id, rows)
        return (line for chunk in chunks for line in chunk_lines(chunk))

    def result_tables(self, run_id: str) -> Iterator[pa.Table]:
        """Per-sample results as tables of the archive's columns; refused as :meth:`results`
        is."""
        self._direct.readable(run_id)
        return self._direct.results.tables(run_id)

    def results_dataset(self, run_id: str) -> Dataset:
        """The run's per-sample results as a Hugging Face ``datasets.Dataset``, live or
        archived alike: ``sample_id``, ``output``, ``scores`` and ``error`` (JSON text, as
        stored) and ``score.<metric>`` (float64); refused as :meth:`results` is."""
        from datasets import Dataset

        self._direct.readable(run_id)
        archive = self._direct.results.archive(run_id)
        if archive is not None:
            return Dataset(archive.table())
        return Dataset(table_of(self._direct.results.chunks(run_id, PART_ROWS)))

    def page(self, run_id: str, query: SampleQuery) -> SamplePage:
        """One page of the run's per-sample results and how many match
        (:class:`evalq.shared.store.pages.PageReader`: an archived run's page reads the parts
        that hold it, not the run); refused as :meth:`results` is."""
        self._direct.readable(run_id)
        wanted = PageQuery(
            failed=query.failed,
            q=query.q,
            sort=query.sort,
            ids=None if query.ids is None else tuple(query.ids),
        )
        rows = rows_per_read(self._direct.settings.max_output_bytes)
        total, chunk = PageReader(self._direct.redis, rows).page(
            run_id, query.offset, query.limit, wanted
        )
        found = list(results_of(chunk))
        if query.with_input and found:  # asked once above: one check, one audit entry
            row_of = self._row_reader(run_id)
            meta = self._direct.runs.get(run_id)
            found = [_shown(meta, r, row_of(r.sample_id), self._scorings) for r in found]
        return SamplePage(run_id=run_id, total=total, offset=query.offset, samples=found)

    def follow(self, run_id: str, with_input: bool = False) -> Iterator[SampleResult]:
        """Each sample's result as soon as it is settled, once each, until the run ends (each
        step waits up to :data:`FOLLOW_BLOCK_MS`)."""
        return self.follower(run_id, with_input).waiting(FOLLOW_BLOCK_MS)

    def follower(self, run_id: str, with_input: bool = False) -> Follower:
        """A :class:`evalq.producer.service.follower.Follower` of the run's results, whose steps
        never wait unless asked to (the gateway waits between them asynchronously); the policy is
        asked here, before anything is read (or a file opened for it)."""
        self._direct.readable(run_id)
        adder = self._input_adder(run_id) if with_input else None
        rows = rows_per_read(self._direct.settings.max_output_bytes)
        return Follower(self._direct.results, self._direct.runs, run_id, adder, rows)

    def rows(self, run_id: str, sample_ids: Iterable[int]) -> dict[int, dict[str, Any]]:
        """Those samples' rows, labels included, read from the run's data where this runs (the
        results hold no input, and no label: labels are scrubbed before inference); refused
        as :meth:`results` is."""
        self._direct.readable(run_id)
        row_of = self._row_reader(run_id)
        return {i: row_of(i) for i in sample_ids}

    def states(self, run_id: str) -> Iterator[tuple[int, SampleState]]:
        """Each sample's state (pending, scored, failed) without its values: every reader."""
        for result in self._direct.results.results(run_id):
            yield result.sample_id, result.state

    def timeline(self, run_id: str) -> list[tuple[float, int]]:
        """(Unix time, samples settled) of every settling write, oldest first: per-sample
        timing, so only for a reader who sees it (:class:`TierRefusedError` otherwise)."""
        meta = self._direct.runs.get(run_id)
        if not self._direct.reader(meta).sees_timing:
            raise TierRefusedError(
                f"tier refused: {meta.dataset_id}/{meta.split} is not viewable; when its "
                "samples settled is per-sample data (the run's status shows it as a whole)"
            )
        return self._direct.results.timeline(run_id)

    def spec(self, run_id: str) -> DatasetSpec:
        """The published dataset spec of a run (a source and routing, no rows)."""
        return self._direct.spec(run_id)

    def split_rows(self, spec: DatasetSpec) -> Dataset:
        """The split of ``spec``, rebuilt on this machine (:meth:`Direct.split_rows`)."""
        return self._direct.split_rows(spec)

    def _row_reader(self, run_id: str) -> Callable[[int], dict[str, Any]]:
        """What reads one sample's row of the run's split, labels included, as JSON values:
        the split re-materialised from the run's spec (the data is opened here, so that a
        source this machine cannot read fails before any result is written)."""
        rows = self.split_rows(self.spec(run_id))

        def row_of(sample_id: int) -> dict[str, Any]:
            return dict(json.loads(json.dumps(rows[sample_id], default=str)))

        return row_of

    def _input_adder(self, run_id: str) -> Callable[[SampleResult], SampleResult]:
        """What adds its row to one of the run's results (the data is opened here)."""
        row_of = self._row_reader(run_id)

        def added(result: SampleResult) -> SampleResult:
            return result.model_copy(update={"input": row_of(result.sample_id)})

        return added


def labels_of(meta: RunMeta) -> tuple[str, ...]:
    """The label fields of the run's evaluation, its target first: a language task's as its
    record keeps them, a Python evaluation's as this process loaded it (none when it did not)."""
    run = language_run(meta)
    if run is not None:
        return run.task.label_fields
    harness = harness_run(meta)
    return harness.harness.labels if harness is not None else label_fields(meta.eval)


def target_of(meta: RunMeta, row: dict[str, Any]) -> Any:
    """A full row's target: a language task's target field; a Python evaluation's or an
    lm-eval task's label field, or its label fields' values when it has several (None when it
    declares none)."""
    run = language_run(meta)
    if run is not None:
        return row.get(run.task.target)
    labels = labels_of(meta)
    if not labels:
        return None
    if len(labels) == 1:
        return row.get(labels[0])
    return {name: row.get(name) for name in labels}


def _shown(
    meta: RunMeta, result: SampleResult, row: dict[str, Any], scorings: dict[str, Scoring]
) -> SampleResult:
    """``result`` with its row, target and (a language task's) prompt: per-sample reads."""
    run, prompt = language_run(meta), None
    if run is not None:
        try:
            prompt = run.shown_prompt(row, result.sample_id)
        except EvalqError:  # a row the task cannot fill: the sample failed for it
            prompt = None
    logged = None
    harness = harness_run(meta)
    if harness is not None and isinstance(result.output, dict):
        prompt = _first_context(result.output)
        logged = _logged(scorings, meta.run_id, harness, row, result.output)
    update = {"input": row, "target": target_of(meta, row), "prompt": prompt, "logged": logged}
    return result.model_copy(update=update)


def _first_context(output: dict[str, Any]) -> str | None:
    """An lm-eval task's output's first request's context (what its model read first)."""
    requests = output.get("requests")
    if isinstance(requests, list) and requests and isinstance(requests[0], dict):
        arguments = requests[0].get("arguments")
        if isinstance(arguments, list) and arguments and isinstance(arguments[0], str):
            return arguments[0]
    return None


def _logged(
    scorings: dict[str, Scoring],
    run_id: str,
    run: HarnessRun,
    row: dict[str, Any],
    output: dict[str, Any],
) -> dict[str, Any] | None:
    """An lm-eval sample's filtered responses and target, by the task's own filters and
    ``doc_to_target`` on the full row (lm-eval's code, here; None where it cannot say)."""
    from evalq.shared.lm.harness import HarnessRequest
    from evalq.shared.lm.lmeval_runtime import Scoring

    try:
        scoring = scorings.get(run_id)
        if scoring is None:
            scoring = scorings[run_id] = Scoring(run, row)
            while len(scorings) > SCORINGS:
                scorings.pop(next(iter(scorings)))
        requests = [HarnessRequest.model_validate(r) for r in output["requests"]]
        _, logged = scoring.score(row, requests, output["resps"])
    except Exception:  # an output or row the task cannot read: the sample shows without it
        return None
    return {"filtered_resps": logged["filtered_resps"], "target": logged["target"]}
