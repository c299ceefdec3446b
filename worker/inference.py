"""Inference of a batch of messages, any mix of runs and evaluations.

Skip samples already inferred (redeliveries), rebuild rows from each run's spec, remove label
fields (the run's evaluation's, and every other registered task's and loaded evaluation's: a
split's labels are no task's alone, :class:`evalq.shared.store.labels.LabelFields`), and run
each evaluation's warm model on batches of at most ``max_batch`` rows drawn from every run in
the batch that uses it; store each output once and stage its scoring in the run's score
backlog, for the fair dispatcher to hand to the scoring workers
(:mod:`evalq.shared.queue.backlog`), or, on a worker that consumes the ``score`` queue too, score
them in the same job (``fuse``): a small run is not sent back to wait behind the work this worker
reserved. An attempt that raises is tried again later, alone, until the last attempt, which
ends the sample with its terminal error record; the batch goes on (see :mod:`evalq.worker.batch`).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from typing import Any

from evalq.shared.errors import OutputTooLarge, PermanentError, RunTooLarge, first_line
from evalq.shared.evaluation import checked_outputs, scrub
from evalq.shared.models import Metered, SampleTask, Stage, error_record, to_json
from evalq.shared.queue.backlog import run_model
from evalq.shared.queue.celery_app import INFER_TASK
from evalq.shared.queue.pace import PaceMeter
from evalq.shared.store.labels import LabelFields
from evalq.worker.batch import KEPT, Batch, Resources, RunShare, bounded
from evalq.worker.runtime_pool import Infer
from evalq.worker.scoring import score_all

__all__ = ["infer_batch"]

log = logging.getLogger(__name__)


Item = tuple[RunShare, int, dict[str, Any]]
"""A sample waiting for inference: its run, its id and its label-free row."""


def _failed(run: RunShare, sample_id: int, exc: BaseException, max_attempts: int) -> None:
    """An attempt raised: try the sample again later, or end it after the last attempt."""
    attempt = run.attempts.get(sample_id, max_attempts)
    if attempt < max_attempts and not isinstance(exc, PermanentError):
        run.retry.append(sample_id)
        return
    record = error_record(Stage.INFER, exc)
    if getattr(exc, "stage", None) is not None:  # an endpoint's: it counted its own tries
        run.errors[sample_id] = record
        return
    note = f" (attempt {attempt} of {max_attempts})"
    run.errors[sample_id] = record.model_copy(update={"message": record.message + note})


def _infer(infer: Infer, items: list[Item], max_attempts: int, limit: int) -> None:
    """Give each item an output, a retry or an error; if a batch raises, rows go alone. An
    output whose JSON takes more than ``limit`` bytes ends its sample ``OutputTooLarge``."""
    try:
        rows = [row for *_, row in items]
        samples = [(run.run_id, sample_id) for run, sample_id, _ in items]
        outputs = checked_outputs(infer(rows, samples), len(items))
    except Exception as exc:
        if len(items) == 1:
            run, sample_id, _ = items[0]
            _failed(run, sample_id, exc, max_attempts)
        else:
            for item in items:
                _infer(infer, [item], max_attempts, limit)
        return
    for (run, sample_id, _), output in zip(items, outputs, strict=True):
        if isinstance(output, Exception):  # this sample's own failure (an endpoint's)
            _failed(run, sample_id, output, max_attempts)
            continue
        value, usage = (
            (output.output, output.usage) if isinstance(output, Metered) else (output, None)
        )
        try:
            text = to_json(value)
        except (TypeError, ValueError) as exc:
            refused = PermanentError(f"output not JSON: {exc}")
            run.errors[sample_id] = error_record(Stage.INFER, refused)
            continue
        try:
            run.outputs[sample_id] = bounded(text, limit, "an output")
        except OutputTooLarge as exc:
            run.errors[sample_id] = error_record(Stage.INFER, exc)
            continue
        if usage is not None:
            run.usages[sample_id] = usage.stored()
        if type(value) in KEPT:
            run.values[sample_id] = value


def _pending(run: RunShare, done: set[int], labels: LabelFields) -> list[Item]:
    """The run's samples to infer now, those not ``done`` (with an output, or settled with an
    error): each counted as one more attempt, without any field that its evaluation or any
    other in ``labels`` calls a label (when those cannot be read, the samples end at the
    ``data`` stage rather than go to the model with a label). A
    rescored run has no inference: a sample of it without a copied output (its producer died
    mid-copy; a forged message) ends as a terminal error, never as another model's output."""
    missing = [i for i in run.ids if i not in done]
    if run.meta.rescored_from is not None:
        refused = PermanentError(
            f"a rescore of run {run.meta.rescored_from} runs no inference, and this sample's "
            "output was not copied"
        )
        for sample_id in missing:
            run.errors[sample_id] = error_record(Stage.INFER, refused)
        return []
    todo = run.counted(Stage.INFER, missing)
    if not todo:
        return []
    try:
        hidden = labels.all() | set(run.evaluation.label_fields)
    except PermanentError as exc:
        for sample_id in todo:
            run.errors[sample_id] = error_record(Stage.DATA, exc)
        return []
    items: list[Item] = []
    for sample_id, row in run.rows(todo, Stage.DATA).items():
        try:
            items.append((run, sample_id, scrub(row, hidden)))
        except PermanentError as exc:
            run.errors[sample_id] = error_record(Stage.DATA, exc)
    return items


def _infer_all(res: Resources, items: list[Item]) -> None:
    """Inference for the items of one evaluation, at most ``max_batch`` rows per call (or the
    evaluation's own ``rows_per_call``); if its model cannot be loaded, each item counts as a
    failed attempt."""
    evaluation = items[0][0].evaluation
    try:
        infer = res.runtimes.model(evaluation)
    except Exception as exc:
        log.error("cannot load the model of %s: %s", items[0][0].meta.eval, first_line(exc))
        for run, sample_id, _ in items:
            _failed(run, sample_id, exc, res.max_attempts)
        return
    size = evaluation.rows_per_call or res.max_batch
    started = time.perf_counter()
    for start in range(0, len(items), size):
        _infer(infer, items[start : start + size], res.max_attempts, res.max_output_bytes)
    if res.pace is not None:
        _paced(res.pace, items, time.perf_counter() - started)


def _paced(pace: PaceMeter, items: list[Item], seconds: float) -> None:
    """Count ``seconds`` of the model's calls toward its pace, over the samples that got an
    output (an outage that fails samples fast must not make the model look fast); a
    failure here is logged, never the batch's."""
    done = sum(1 for run, sample_id, _ in items if sample_id in run.outputs)
    try:
        if done:
            pace.add({run_model(items[0][0].meta): done}, seconds)
    except Exception:
        log.exception("could not measure the pace of %s", items[0][0].meta.eval)


def _within_run_bytes(res: Resources, run: RunShare) -> None:
    """Count the batch's outputs into what the run holds in Redis; if that would pass
    ``EVALQ_MAX_RUN_BYTES``, none of them is stored: each ends its sample
    ``infer/RunTooLarge``."""
    size = sum(map(len, run.outputs.values()))
    if not size:
        return
    held = res.writer.live_bytes(run.run_id, size)
    if held <= res.max_run_bytes:
        return
    res.writer.live_bytes(run.run_id, -size)
    refused = RunTooLarge(
        f"the run would hold {held} bytes of outputs in Redis, over the {res.max_run_bytes} "
        "a worker lets one run hold (EVALQ_MAX_RUN_BYTES)"
    )
    for sample_id in run.outputs:
        run.errors[sample_id] = error_record(Stage.INFER, refused)
    run.outputs.clear()
    run.usages.clear()
    run.values.clear()


def infer_batch(res: Resources, tasks: list[SampleTask]) -> set[str]:
    """Run inference for a batch of messages, any mix of runs and evaluations; return the runs
    whose messages must go back to the queue."""
    batch = Batch.read(res, tasks, Stage.INFER)
    inferred: dict[str, set[int]] = {}
    by_evaluation: dict[int, list[Item]] = defaultdict(list)

    def prepare(run: RunShare) -> None:
        inferred[run.run_id], failed = res.reader.produced(run.run_id, run.ids)
        pending = _pending(run, inferred[run.run_id] | failed, res.labels)
        if pending:
            by_evaluation[id(run.evaluation)].extend(pending)

    scoring: list[RunShare] = []

    def store(run: RunShare) -> None:
        _within_run_bytes(res, run)
        ready = [i for i in run.ids if i in inferred[run.run_id] or i in run.outputs]
        # Fused, with every ready sample's output this worker's: the attempt at scoring them is
        # counted by the call that stores the outputs (when all of them are new), not by one more.
        fold = res.fuse and bool(ready) and len(ready) == len(run.outputs)
        scoring_of = run.bringing(ready) if fold else []
        written, counts = res.writer.record_outputs_scoring(
            run.run_id, run.outputs, scoring_of, run.usages
        )
        stored = written == len(run.outputs)
        if run.outputs:
            res.record_provenance(run.run_id, run.evaluation)
        run.settle_errors()
        if ready and not res.fuse:
            res.stage_scoring(run.meta, ready)
        elif ready:
            share = run.carried(ready, stored)
            if counts is not None:
                share.todo = share.count(Stage.SCORE, scoring_of, counts)
            scoring.append(share)
        run.send_retries(INFER_TASK)

    batch.each(prepare)
    for items in by_evaluation.values():
        _infer_all(res, items)
    batch.each(store)
    # Scored here, in the same job: their messages go back if Redis fails while scoring, and
    # come back as inferred, so to scoring.
    return batch.requeue | (score_all(res, Batch(scoring)) if scoring else set())
