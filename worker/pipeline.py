"""What the worker does with a batch of per-sample tasks, as plain functions (no Celery here).

Inference: skip samples already inferred (redeliveries), rebuild rows from the spec, remove
label fields, run the warm model once per batch, store each output once, enqueue scoring.
Scoring: full rows plus stored outputs through ``score()``, each score stored once; the caller
that settles the last sample computes the aggregate from the store.
Any failure of one sample becomes that sample's terminal error record; the batch goes on.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from shared.celery_app import SCORE_TASK
from shared.errors import PayloadError, PermanentError, UnknownRunError
from shared.evaluation import Evaluation, scrub
from shared.models import ErrorRecord, RunMeta, RunStatus, SampleTask, Stage
from shared.results import ResultStore, to_json
from shared.runs import RunStore
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


def _error(stage: Stage, exc: BaseException) -> ErrorRecord:
    text = str(exc).strip().splitlines()
    return ErrorRecord(stage=stage, kind=type(exc).__name__, message=text[0] if text else "")


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
        if run.active:
            yield run


class _Run:
    """One run's share of a batch: its record, evaluation and the samples to handle."""

    def __init__(self, res: Resources, run_id: str, tasks: list[SampleTask]) -> None:
        self.res = res
        self.meta: RunMeta = res.runs.get(run_id)
        self.errors: dict[int, ErrorRecord] = {}
        self.ids: list[int] = []
        for task in tasks:
            if task.eval != self.meta.eval or task.spec != self.meta.spec:
                self.errors[task.sample_id] = _error(
                    Stage.PAYLOAD, PayloadError("message names another eval or spec than its run")
                )
            elif task.sample_id not in self.ids:
                self.ids.append(task.sample_id)
        self.evaluation: Evaluation = res.runtimes.evaluation(self.meta.eval, self.meta.params)

    @property
    def active(self) -> bool:
        return self.meta.status not in (RunStatus.CANCELLED, RunStatus.COMPLETED)

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
        if self.errors and self.res.results.record_errors(self.meta.run_id, self.errors):
            self.finalize()

    def finalize(self) -> None:
        aggregate = self.res.results.finalize(self.meta.run_id, self.evaluation)
        log.info("run %s completed: %s", self.meta.run_id, aggregate)


def _checked_outputs(outputs: object, expected: int) -> list[Any]:
    if not isinstance(outputs, list) or len(outputs) != expected:
        got = len(outputs) if isinstance(outputs, list) else type(outputs).__name__
        raise PermanentError(f"infer() returned {got} outputs for {expected} rows")
    return outputs


def _infer(run: _Run, rows: dict[int, dict[str, Any]]) -> dict[int, str]:
    """JSON outputs by id; if the batch raises, each row is tried alone to isolate the bad one."""
    model = run.res.runtimes.model(run.evaluation)
    scrubbed = {i: scrub(row, run.evaluation.label_fields) for i, row in rows.items()}
    try:
        outputs = _checked_outputs(run.evaluation.infer(model, list(scrubbed.values())), len(rows))
    except Exception as exc:
        if len(rows) == 1:
            run.errors[next(iter(rows))] = _error(Stage.INFER, exc)
            return {}
    else:
        encoded: dict[int, str] = {}
        for sample_id, output in zip(scrubbed, outputs, strict=True):
            try:
                encoded[sample_id] = to_json(output)
            except (TypeError, ValueError) as exc:
                run.errors[sample_id] = _error(
                    Stage.INFER, PermanentError(f"output is not JSON: {exc}")
                )
        return encoded
    found: dict[int, str] = {}
    for sample_id, row in rows.items():
        found.update(_infer(run, {sample_id: row}))
    return found


def infer_batch(res: Resources, tasks: list[SampleTask]) -> None:
    """Run inference for a batch of per-sample tasks, any mix of runs."""
    for run in _active_runs(res, tasks, Stage.INFER):
        run_id = run.meta.run_id
        inferred = res.results.inferred(run_id, run.ids)
        todo = [i for i in run.ids if i not in inferred and i not in run.errors]
        if todo:
            rows = run.rows(todo, Stage.DATA)
            if rows:
                outputs = _infer(run, rows)
                res.results.record_outputs(run_id, outputs)
                inferred.update(outputs)
        run.settle_errors()
        res.publish(
            SCORE_TASK,
            [
                SampleTask(run_id=run_id, eval=run.meta.eval, spec=run.meta.spec, sample_id=i)
                for i in run.ids
                if i in inferred
            ],
        )


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


def score_batch(res: Resources, tasks: list[SampleTask]) -> None:
    """Score a batch of per-sample tasks, any mix of runs, and finalize finished runs."""
    for run in _active_runs(res, tasks, Stage.SCORE):
        run_id = run.meta.run_id
        settled = res.results.settled(run_id, run.ids)
        todo = [i for i in run.ids if i not in settled and i not in run.errors]
        outputs = res.results.outputs(run_id, todo)
        if len(outputs) < len(todo):
            # Scoring is enqueued only after an output is stored, so this message is stray
            # (e.g. replayed by hand); the inference path will enqueue the sample again.
            log.warning(
                "run %s: %d score messages without an output", run_id, len(todo) - len(outputs)
            )
        scores: dict[int, dict[str, float]] = {}
        for sample_id, row in run.rows(list(outputs), Stage.SCORE).items():
            try:
                scores[sample_id] = _checked_scores(run.evaluation.score(row, outputs[sample_id]))
            except Exception as exc:
                run.errors[sample_id] = _error(Stage.SCORE, exc)
        if res.results.record_scores(run_id, scores):
            run.finalize()
        run.settle_errors()
