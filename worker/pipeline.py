"""What the worker does with a batch of messages, as plain functions (no Celery here).

Inference: skip samples already inferred (redeliveries), rebuild rows from each run's spec,
remove label fields, and run each evaluation's warm model on batches of at most ``max_batch``
rows drawn from every run in the batch that uses it; store each output once and enqueue
scoring. Scoring: full rows plus stored outputs through ``score()``, each score stored once; the
call that settles a run's last sample computes its aggregate from the store. An evaluation with a
scorer script is scored on the runtime pool's warm script subprocesses, a batch at a time.
Any failure of one sample becomes that sample's terminal error record; the batch goes on.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from shared.celery_app import INFER_TASK, SCORE_TASK
from shared.dispatch import split
from shared.errors import (
    PayloadError,
    PermanentError,
    ScriptError,
    UnknownRunError,
    first_line,
)
from shared.evaluation import Evaluation, scrub
from shared.models import ErrorRecord, RunMeta, SampleTask, Stage
from shared.results import ResultStore, to_json
from shared.runs import RunStore
from shared.scorer import ScriptCall
from worker.runtime_pool import RuntimePool
from worker.shard_cache import ShardCache

__all__ = ["Resources", "infer_batch", "score_batch"]

log = logging.getLogger(__name__)

Publisher = Callable[[str, list[SampleTask]], object]


@dataclass(frozen=True)
class Resources:
    """What a worker process hands its batch functions; made after fork."""

    runs: RunStore
    results: ResultStore
    shards: ShardCache
    runtimes: RuntimePool
    publish: Publisher
    max_batch: int
    max_attempts: int


def _error(stage: Stage, exc: BaseException) -> ErrorRecord:
    return ErrorRecord(stage=stage, kind=type(exc).__name__, message=first_line(exc))


class _Run:
    """One run's share of a batch: its record, evaluation, samples and what became of them."""

    def __init__(self, res: Resources, run_id: str, tasks: list[SampleTask]) -> None:
        self.res = res
        self.meta: RunMeta = res.runs.get(run_id)
        self.errors: dict[int, ErrorRecord] = {}
        self.outputs: dict[int, str] = {}
        self.attempts: dict[int, int] = {}
        self.solo: set[int] = set()
        self.retry: list[int] = []
        self.ids: list[int] = []
        for task in tasks:
            if task.eval != self.meta.eval or task.spec != self.meta.spec:
                mismatch = PayloadError("message names another eval or spec than its run")
                for sample_id in task.sample_ids:
                    self.errors[sample_id] = _error(Stage.PAYLOAD, mismatch)
            else:
                self.ids.extend(task.sample_ids)
                if task.solo:
                    self.solo.update(task.sample_ids)
        self.ids = list(dict.fromkeys(self.ids))
        self.evaluation: Evaluation = res.runtimes.evaluation(self.meta.eval, self.meta.params)

    @property
    def run_id(self) -> str:
        return self.meta.run_id

    def rows(self, sample_ids: list[int], stage: Stage) -> dict[int, dict[str, Any]]:
        """Full rows by id; a bad id becomes that sample's error, the others still load."""
        try:
            rows = self.res.shards.rows(self.meta.spec, sample_ids)
            return dict(zip(sample_ids, rows, strict=True))
        except PermanentError as exc:
            if len(sample_ids) == 1:
                self.errors[sample_ids[0]] = _error(stage, exc)
                return {}
            found: dict[int, dict[str, Any]] = {}
            for sample_id in sample_ids:
                found.update(self.rows([sample_id], stage))
            return found

    def settle_errors(self) -> None:
        if self.errors and self.res.results.record_errors(self.run_id, self.errors):
            self.finalize()

    def finalize(self) -> None:
        aggregate = self.res.results.finalize(self.run_id, self.evaluation)
        log.info("run %s completed: %s", self.run_id, aggregate)


def _active_runs(res: Resources, tasks: list[SampleTask], stage: Stage) -> Iterator[_Run]:
    """Each run's share of the batch, skipping unknown runs and runs that are over."""
    groups: dict[str, list[SampleTask]] = defaultdict(list)
    for task in tasks:
        groups[task.run_id].append(task)
    for run_id, run_tasks in groups.items():
        try:
            run = _Run(res, run_id, run_tasks)
        except UnknownRunError:
            log.error("dropping %d %s messages of unknown run %s", len(run_tasks), stage, run_id)
            continue
        if run.meta.status.active:
            yield run


Item = tuple[_Run, int, dict[str, Any]]
"""A sample waiting for inference: its run, its id and its label-free row."""


def _checked_outputs(outputs: object, expected: int) -> list[Any]:
    if not isinstance(outputs, list) or len(outputs) != expected:
        got = len(outputs) if isinstance(outputs, list) else type(outputs).__name__
        raise PermanentError(f"infer() returned {got} outputs for {expected} rows")
    return outputs


def _failed(run: _Run, sample_id: int, exc: BaseException, max_attempts: int) -> None:
    """An attempt raised: try the sample again later, or end it after the last attempt."""
    attempt = run.attempts.get(sample_id, max_attempts)
    if attempt < max_attempts and not isinstance(exc, PermanentError):
        run.retry.append(sample_id)
        return
    record = _error(Stage.INFER, exc)
    note = f" (attempt {attempt} of {max_attempts})"
    run.errors[sample_id] = record.model_copy(update={"message": record.message + note})


def _infer(evaluation: Evaluation, model: Any, items: list[Item], max_attempts: int) -> None:
    """Give each item an output, a retry or an error; if a batch raises, rows go alone."""
    try:
        outputs = _checked_outputs(evaluation.infer(model, [row for *_, row in items]), len(items))
    except Exception as exc:
        if len(items) == 1:
            run, sample_id, _ = items[0]
            _failed(run, sample_id, exc, max_attempts)
        else:
            for item in items:
                _infer(evaluation, model, [item], max_attempts)
        return
    for (run, sample_id, _), output in zip(items, outputs, strict=True):
        try:
            run.outputs[sample_id] = to_json(output)
        except (TypeError, ValueError) as exc:
            run.errors[sample_id] = _error(Stage.INFER, PermanentError(f"output not JSON: {exc}"))


def _pending(res: Resources, run: _Run, inferred: set[int]) -> list[Item]:
    """The run's samples to infer now, each counted as one more attempt.

    A sample tried before that arrived with others is not run: it goes to ``run.retry`` to
    travel alone, so a sample that kills its worker cannot take its batch-mates down again.
    A sample whose every attempt died with its worker ends here as a terminal error.
    """
    todo = [i for i in run.ids if i not in inferred and i not in run.errors]
    counts = res.results.attempt(run.run_id, {i: i in run.solo for i in todo})
    run.retry.extend(i for i, count in counts.items() if count < 0)
    run.attempts = {i: count for i, count in counts.items() if count > 0}
    for sample_id, count in run.attempts.items():
        if count > res.max_attempts:
            died = PermanentError(
                f"gave up after {res.max_attempts} attempts: the worker process running this "
                "sample died or was stopped each time"
            )
            run.errors[sample_id] = _error(Stage.INFER, died)
    todo = [i for i in run.attempts if i not in run.errors]
    items: list[Item] = []
    for sample_id, row in run.rows(todo, Stage.DATA).items() if todo else ():
        try:
            items.append((run, sample_id, scrub(row, run.evaluation.label_fields)))
        except PermanentError as exc:
            run.errors[sample_id] = _error(Stage.DATA, exc)
    return items


def infer_batch(res: Resources, tasks: list[SampleTask]) -> None:
    """Run inference for a batch of messages, any mix of runs and evaluations."""
    runs = list(_active_runs(res, tasks, Stage.INFER))
    inferred = {run.run_id: res.results.inferred(run.run_id, run.ids) for run in runs}
    by_evaluation: dict[int, list[Item]] = defaultdict(list)
    for run in runs:
        pending = _pending(res, run, inferred[run.run_id])
        if pending:
            by_evaluation[id(run.evaluation)].extend(pending)
    for items in by_evaluation.values():
        evaluation = items[0][0].evaluation
        model = res.runtimes.model(evaluation)
        for start in range(0, len(items), res.max_batch):
            _infer(evaluation, model, items[start : start + res.max_batch], res.max_attempts)
    for run in runs:
        res.results.record_outputs(run.run_id, run.outputs)
        run.settle_errors()
        ready = [i for i in run.ids if i in inferred[run.run_id] or i in run.outputs]
        res.publish(SCORE_TASK, list(split(run.meta, ready)))
        if run.retry:
            log.warning("run %s: %d samples go back to the queue alone", run.run_id, len(run.retry))
            res.publish(INFER_TASK, list(split(run.meta, run.retry, solo=True)))


def _checked_scores(scores: object) -> dict[str, float]:
    if not isinstance(scores, dict) or not scores:
        raise PermanentError(f"score() returned {type(scores).__name__}, not a dict of metrics")
    checked: dict[str, float] = {}
    for name, value in scores.items():
        if (
            not isinstance(name, str)
            or isinstance(value, bool)
            or not isinstance(value, int | float)
        ):
            raise PermanentError(f"score() metric {name!r} is not a number")
        if not math.isfinite(value):
            raise PermanentError(f"score() metric {name!r} is {value}")
        checked[name] = float(value)
    return checked


def _script_answers(
    res: Resources, run: _Run, rows: dict[int, dict[str, Any]], outputs: dict[int, Any]
) -> dict[int, str | ScriptError]:
    """Each sample's answer from the evaluation's scorer script, run on the warm pool."""
    evaluation = run.evaluation
    assert evaluation.scorer is not None
    calls: dict[int, ScriptCall] = {}
    for sample_id, row in rows.items():
        try:
            calls[sample_id] = evaluation.script_call(row, outputs[sample_id])
        except Exception as exc:
            run.errors[sample_id] = _error(Stage.SCORE, exc)
    answers = res.runtimes.scripts(evaluation.scorer).map(list(calls.values()))
    return dict(zip(calls, answers, strict=True))


def _score(
    res: Resources, run: _Run, rows: dict[int, dict[str, Any]], outputs: dict[int, Any]
) -> dict[int, dict[str, float]]:
    """Scores of the samples that score cleanly; the others get their error record."""
    evaluation = run.evaluation
    answers = _script_answers(res, run, rows, outputs) if evaluation.scorer is not None else {}
    scores: dict[int, dict[str, float]] = {}
    for sample_id, row in rows.items():
        if sample_id in run.errors:
            continue
        try:
            if evaluation.scorer is None:
                raw = evaluation.score(row, outputs[sample_id])
            else:
                answer = answers[sample_id]
                if isinstance(answer, ScriptError):
                    raise answer
                raw = evaluation.script_score(answer)
            scores[sample_id] = _checked_scores(raw)
        except Exception as exc:
            run.errors[sample_id] = _error(Stage.SCORE, exc)
    return scores


def score_batch(res: Resources, tasks: list[SampleTask]) -> None:
    """Score a batch of messages, any mix of runs, and finalize the runs it finishes."""
    for run in _active_runs(res, tasks, Stage.SCORE):
        settled = res.results.settled(run.run_id, run.ids)
        todo = [i for i in run.ids if i not in settled and i not in run.errors]
        outputs = res.results.outputs(run.run_id, todo)
        if len(outputs) < len(todo):
            # Scoring is enqueued only after an output is stored, so this message is stray
            # (e.g. replayed by hand); the inference path will enqueue the sample again.
            missing = len(todo) - len(outputs)
            log.warning("run %s: %d score messages without an output", run.run_id, missing)
        scores = _score(res, run, run.rows(list(outputs), Stage.SCORE), outputs)
        if res.results.record_scores(run.run_id, scores):
            run.finalize()
        run.settle_errors()
