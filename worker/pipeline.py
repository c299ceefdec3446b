"""What the worker does with a batch of messages, as plain functions (no Celery here).

Inference: skip samples already inferred (redeliveries), rebuild rows from each run's spec,
remove label fields, and run each evaluation's warm model on batches of at most ``max_batch``
rows drawn from every run in the batch that uses it; store each output once and stage its
scoring in the run's score backlog, for the fair dispatcher to hand to the scoring workers
(:mod:`shared.queue.backlog`), or, on a worker that consumes the ``score`` queue too, score them in
the same job (``fuse``): a small run is not sent back to wait behind the work this worker
reserved.
Scoring: full rows plus stored outputs through ``score()``, each score stored once; the call
that settles a run's last sample computes its aggregate from the store. An evaluation with a
scorer script is scored on the runtime pool's warm script subprocesses, a batch at a time.
Any failure of one sample becomes that sample's terminal error record; the batch goes on.

Each run's share of a batch is handled on its own. A message that names another eval or spec
than its run, or ids outside its run, is dropped without touching the run's samples. A Redis
error while one run is read or stored takes that run out of the batch and its messages back to
the queue (the batch functions return those run ids); the other runs go on. Both stages count
an attempt of each sample before it starts and send a sample tried before on alone, so a sample
that kills its process ends as one terminal error while its batch-mates finish.
"""

from __future__ import annotations

import bisect
import copy
import json
import logging
import math
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import redis

from shared.errors import (
    PermanentError,
    ScriptError,
    StoreError,
    UnknownRunError,
    first_line,
)
from shared.evaluation import Evaluation, scrub
from shared.models import ErrorRecord, RunMeta, RunStatus, SampleTask, Stage
from shared.queue.celery_app import INFER_TASK, SCORE_TASK
from shared.queue.sizing import split
from shared.scorer import ScriptCall
from shared.store.provenance import ProvenanceStore, of_worker
from shared.store.results import ResultStore, Settled, to_json
from shared.store.runs import RunStore
from worker.lru import LRU
from worker.runtime_pool import Infer, RuntimePool
from worker.shard_cache import ShardCache

__all__ = ["Resources", "infer_batch", "score_batch"]

log = logging.getLogger(__name__)

Publisher = Callable[[str, list[SampleTask]], object]
Stager = Callable[[RunMeta, list[int]], object]

STORE_ERRORS = (redis.RedisError, StoreError)
"""What a failed read or write of Redis raises: the run's messages go back to the queue."""

Ranges = list[tuple[int, int]]
"""A run's sample ids as sorted, disjoint ``[start, stop)`` ranges."""


def _ranges(sample_ids: list[int]) -> Ranges:
    ranges: Ranges = []
    for sample_id in sorted(set(sample_ids)):
        if ranges and ranges[-1][1] == sample_id:
            ranges[-1] = (ranges[-1][0], sample_id + 1)
        else:
            ranges.append((sample_id, sample_id + 1))
    return ranges


def _member(ranges: Ranges, sample_id: int) -> bool:
    at = bisect.bisect_right(ranges, (sample_id, math.inf)) - 1
    return at >= 0 and ranges[at][0] <= sample_id < ranges[at][1]


@dataclass(frozen=True)
class Resources:
    """What a worker process hands its batch functions; made after fork."""

    runs: RunStore
    results: ResultStore
    shards: ShardCache
    runtimes: RuntimePool
    publish: Publisher
    """Sends messages straight to their queue (a sample's retry, alone)."""
    stage_scoring: Stager
    """Stages the scoring of a run's inferred samples in its score backlog, from which the
    fair dispatcher hands it to the scoring workers (an inference-only worker)."""
    max_batch: int
    max_attempts: int
    stall_after: float = 60.0
    """A claim to finalize a run older than this may be taken over (its finalizer died)."""
    fuse: bool = False
    """This worker consumes the ``score`` queue too: inference scores its outputs in the same
    job instead of sending score messages (no wait for a second message, no second pool job)."""
    members: LRU[str, Ranges] = field(default_factory=lambda: LRU(16))
    """Recent runs' sample ids as ranges (a run's ids never change)."""
    archive: Callable[[str], None] | None = None
    """Asks a worker to archive an ended run (sends ``evalq.archive``)."""
    spill: Callable[[str], None] | None = None
    """Asks a worker to spill a going run's complete segments (sends ``evalq.archive``)."""
    spill_rows: int = 0
    """Samples per spilled segment (``EVALQ_SPILL_ROWS``)."""
    provenance: ProvenanceStore | None = None
    """Where this process records what it ran each run's inference with."""
    recorded: LRU[str, bool] = field(default_factory=lambda: LRU(256))
    """Recent runs whose provenance this process has recorded."""

    def record_provenance(self, run_id: str, evaluation: Evaluation) -> None:
        """Record, once per run in this process, what its inference ran with."""
        if self.provenance is None or run_id in self.recorded:
            return
        self.provenance.record(run_id, of_worker(evaluation, self.runtimes.device))
        self.recorded.get_or_create(run_id, lambda: True)


def _immutable(row: dict[str, Any]) -> bool:
    """Whether no field of ``row`` can be changed in place."""
    return all(isinstance(v, str | int | float | bool | bytes | None) for v in row.values())


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
        self.known: dict[int, Any] = {}
        """Outputs known without a read: those this worker stored just before scoring them."""
        self._rows: dict[int, dict[str, Any]] = {}
        if not self.meta.status.active:
            return
        ranges = res.members.get_or_create(run_id, lambda: _ranges(res.runs.sample_ids(run_id)))
        for task in tasks:
            refused = self._refusal(task, ranges)
            if refused:
                log.error("dropping a message of run %s: %s", run_id, refused)
                continue
            self.ids.extend(task.sample_ids)
            if task.solo:
                self.solo.update(task.sample_ids)
        self.ids = list(dict.fromkeys(self.ids))
        if self.ids:
            self.evaluation: Evaluation = res.runtimes.evaluation(self.meta.eval, self.meta.params)

    def _refusal(self, task: SampleTask, ranges: Ranges) -> str | None:
        """Why a message cannot be one of this run's (None when it can)."""
        if task.eval != self.meta.eval or task.spec != self.meta.spec:
            return "it names another eval or spec than its run"
        strays = [i for i in task.sample_ids if not _member(ranges, i)]
        if strays:
            return f"{len(strays)} of its sample ids (first {strays[0]}) are not in the run"
        return None

    @property
    def run_id(self) -> str:
        return self.meta.run_id

    def carried(self, ids: list[int], stored: bool) -> _Run:
        """This run's share of the scoring that follows its inference in the same job: its
        record, evaluation, the rows read for inference that ``infer()`` cannot have changed
        (every field immutable: it got a shallow copy), and, when every output this worker
        wrote was stored (``stored``: none lost to another worker's), those outputs."""
        run = copy.copy(self)
        run.ids, run.errors, run.outputs, run.attempts, run.retry = ids, {}, {}, {}, []
        run.solo = set()
        run._rows = {i: row for i, row in self._rows.items() if _immutable(row)}
        run.known = (
            {i: json.loads(self.outputs[i]) for i in ids if i in self.outputs} if stored else {}
        )
        return run

    def rows(self, sample_ids: list[int], stage: Stage) -> dict[int, dict[str, Any]]:
        """Full rows by id (each read once per job); a bad id becomes that sample's error, the
        others still load."""
        missing = [i for i in sample_ids if i not in self._rows]
        if missing:
            self._rows.update(self._read(missing, stage))
        return {i: self._rows[i] for i in sample_ids if i in self._rows}

    def _read(self, sample_ids: list[int], stage: Stage) -> dict[int, dict[str, Any]]:
        try:
            rows = self.res.shards.rows(self.meta.spec, sample_ids)
            return dict(zip(sample_ids, rows, strict=True))
        except PermanentError as exc:
            if len(sample_ids) == 1:
                self.errors[sample_ids[0]] = _error(stage, exc)
                return {}
            found: dict[int, dict[str, Any]] = {}
            for sample_id in sample_ids:
                found.update(self._read([sample_id], stage))
            return found

    def clusters(self, sample_ids: list[int]) -> dict[int, str] | None:
        """Each of ``sample_ids``' cluster, from its row (:meth:`Evaluation.clusters`)."""
        return self.evaluation.clusters(
            dict(zip(sample_ids, self.res.shards.rows(self.meta.spec, sample_ids), strict=True))
        )

    def counted(self, stage: Stage, todo: list[int]) -> list[int]:
        """Count one more attempt at ``stage`` (infer or score) of each sample in ``todo``;
        return those to run now. A sample tried before that came with others goes to
        ``retry``, to travel alone; one whose every attempt died with its worker process ends
        here as a terminal error."""
        counts = self.res.results.attempt(self.run_id, {i: i in self.solo for i in todo}, stage)
        self.retry.extend(i for i, count in counts.items() if count < 0)
        self.attempts = {i: count for i, count in counts.items() if count > 0}
        limit = self.res.max_attempts
        for sample_id, count in self.attempts.items():
            if count > limit:
                died = PermanentError(
                    f"gave up after {limit} attempts: the worker process running this "
                    f"sample's {stage.value} died or was stopped each time"
                )
                self.errors[sample_id] = _error(stage, died)
        return [i for i in self.attempts if i not in self.errors]

    def send_retries(self, task_name: str) -> None:
        if self.retry:
            log.warning(
                "run %s: %d samples go back to the queue alone", self.run_id, len(self.retry)
            )
            self.res.publish(task_name, list(split(self.meta, self.retry, solo=True)))

    def settle_errors(self) -> None:
        if self.errors:
            self.settled(self.res.results.record_errors(self.run_id, self.errors))

    def settled(self, done: Settled) -> None:
        """After a settling write: finalize the run if it fell to this caller, else ask for a
        spill when the write may have completed a segment."""
        if done.finalize:
            self.finalize()
        elif done.filled(self.res.spill_rows) and self.res.spill is not None:
            self.res.spill(self.run_id)

    def finalize(self) -> None:
        finished = self.res.results.finalize(self.run_id, self.evaluation, self.clusters)
        if finished is not None:
            log.info("run %s %s: %s", self.run_id, finished.status, finished.reason or "done")
            if finished.status is RunStatus.COMPLETED and self.res.archive is not None:
                self.res.archive(self.run_id)


class _Batch:
    """The runs of one batch, and those whose messages must go back to the queue because
    Redis failed while they were read or stored.

    Any other error while one run is handled (a run whose evaluation cannot be created here,
    a bug) is logged with its traceback and takes only that run out of the batch; its messages
    are acknowledged, not requeued, so that a deterministic error cannot loop, and the janitor
    sends its unsettled samples again after ``EVALQ_STALL_AFTER`` seconds.
    """

    def __init__(self, runs: list[_Run]) -> None:
        self.requeue: set[str] = set()
        self.runs = runs

    @classmethod
    def read(cls, res: Resources, tasks: list[SampleTask], stage: Stage) -> _Batch:
        """The batch of ``tasks``' runs, each read from Redis."""
        batch = cls([])
        groups: dict[str, list[SampleTask]] = defaultdict(list)
        for task in tasks:
            groups[task.run_id].append(task)
        for run_id, run_tasks in groups.items():
            try:
                run = _Run(res, run_id, run_tasks)
            except UnknownRunError:
                log.error(
                    "dropping %d %s messages of unknown run %s", len(run_tasks), stage, run_id
                )
                continue
            except STORE_ERRORS as exc:
                batch._failed(run_id, exc)
                continue
            except Exception:
                log.exception("run %s: its messages in this batch are left to the janitor", run_id)
                continue
            if run.meta.status.active and run.ids:
                batch.runs.append(run)
        return batch

    def _failed(self, run_id: str, exc: BaseException) -> None:
        log.warning(
            "run %s: Redis failed (%s); its messages go back to the queue", run_id, first_line(exc)
        )
        self.requeue.add(run_id)

    def each(self, step: Callable[[_Run], None]) -> None:
        """Apply ``step`` to each run still in the batch; a run whose step fails on Redis
        leaves the batch, and its messages go back to the queue."""
        for run in list(self.runs):
            try:
                step(run)
            except STORE_ERRORS as exc:
                self._failed(run.run_id, exc)
                self.runs.remove(run)
            except Exception:
                log.exception(
                    "run %s: its messages in this batch are left to the janitor", run.run_id
                )
                self.runs.remove(run)


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


def _infer(infer: Infer, items: list[Item], max_attempts: int) -> None:
    """Give each item an output, a retry or an error; if a batch raises, rows go alone."""
    try:
        outputs = _checked_outputs(infer([row for *_, row in items]), len(items))
    except Exception as exc:
        if len(items) == 1:
            run, sample_id, _ = items[0]
            _failed(run, sample_id, exc, max_attempts)
        else:
            for item in items:
                _infer(infer, [item], max_attempts)
        return
    for (run, sample_id, _), output in zip(items, outputs, strict=True):
        try:
            run.outputs[sample_id] = to_json(output)
        except (TypeError, ValueError) as exc:
            run.errors[sample_id] = _error(Stage.INFER, PermanentError(f"output not JSON: {exc}"))


def _pending(run: _Run, done: set[int]) -> list[Item]:
    """The run's samples to infer now, those not ``done`` (with an output, or settled with an
    error): each counted as one more attempt, label-free. A
    rescored run has no inference: a sample of it without a copied output (its producer died
    mid-copy; a forged message) ends as a terminal error, never as another model's output."""
    missing = [i for i in run.ids if i not in done]
    if run.meta.rescored_from is not None:
        refused = PermanentError(
            f"a rescore of run {run.meta.rescored_from} runs no inference, and this sample's "
            "output was not copied"
        )
        for sample_id in missing:
            run.errors[sample_id] = _error(Stage.INFER, refused)
        return []
    todo = run.counted(Stage.INFER, missing)
    items: list[Item] = []
    for sample_id, row in run.rows(todo, Stage.DATA).items() if todo else ():
        try:
            items.append((run, sample_id, scrub(row, run.evaluation.label_fields)))
        except PermanentError as exc:
            run.errors[sample_id] = _error(Stage.DATA, exc)
    return items


def _infer_all(res: Resources, items: list[Item]) -> None:
    """Inference for the items of one evaluation, at most ``max_batch`` rows per call; if its
    model cannot be loaded, each item counts as a failed attempt."""
    evaluation = items[0][0].evaluation
    try:
        infer = res.runtimes.model(evaluation)
    except Exception as exc:
        log.error("cannot load the model of %s: %s", items[0][0].meta.eval, first_line(exc))
        for run, sample_id, _ in items:
            _failed(run, sample_id, exc, res.max_attempts)
        return
    for start in range(0, len(items), res.max_batch):
        _infer(infer, items[start : start + res.max_batch], res.max_attempts)


def infer_batch(res: Resources, tasks: list[SampleTask]) -> set[str]:
    """Run inference for a batch of messages, any mix of runs and evaluations; return the runs
    whose messages must go back to the queue."""
    batch = _Batch.read(res, tasks, Stage.INFER)
    inferred: dict[str, set[int]] = {}
    by_evaluation: dict[int, list[Item]] = defaultdict(list)

    def prepare(run: _Run) -> None:
        inferred[run.run_id], failed = res.results.produced(run.run_id, run.ids)
        pending = _pending(run, inferred[run.run_id] | failed)
        if pending:
            by_evaluation[id(run.evaluation)].extend(pending)

    scoring: list[_Run] = []

    def store(run: _Run) -> None:
        stored = res.results.record_outputs(run.run_id, run.outputs) == len(run.outputs)
        if run.outputs:
            res.record_provenance(run.run_id, run.evaluation)
        run.settle_errors()
        ready = [i for i in run.ids if i in inferred[run.run_id] or i in run.outputs]
        if ready and not res.fuse:
            res.stage_scoring(run.meta, ready)
        elif ready:
            scoring.append(run.carried(ready, stored))
        run.send_retries(INFER_TASK)

    batch.each(prepare)
    for items in by_evaluation.values():
        _infer_all(res, items)
    batch.each(store)
    # Scored here, in the same job: their messages go back if Redis fails while scoring, and
    # come back as inferred, so to scoring.
    return batch.requeue | (_score_all(res, _Batch(scoring)) if scoring else set())


def _checked_scores(scores: object, ranges: Mapping[str, tuple[float, float]]) -> dict[str, float]:
    """``score()``'s answer as metric -> float; :class:`PermanentError` (a failed sample) for
    anything else, for a value that is not finite, or one outside its declared range
    (``Evaluation.metric_ranges``: the interval is clipped to it)."""
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
        low, high = ranges.get(name, (-math.inf, math.inf))
        if not low <= value <= high:
            raise PermanentError(
                f"score() metric {name!r} is {value}, outside its declared range [{low}, {high}]"
            )
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
            scores[sample_id] = _checked_scores(raw, evaluation.metric_ranges)
        except Exception as exc:
            run.errors[sample_id] = _error(Stage.SCORE, exc)
    return scores


def score_batch(res: Resources, tasks: list[SampleTask]) -> set[str]:
    """Score a batch of messages, any mix of runs, and finalize the runs it finishes; return
    the runs whose messages must go back to the queue.

    A message whose samples are all settled while its run is still going is how a run whose
    finalizer died gets finished: it takes over a claim older than ``stall_after`` (the
    janitor sends such a message).
    """
    return _score_all(res, _Batch.read(res, tasks, Stage.SCORE))


def _score_all(res: Resources, batch: _Batch) -> set[str]:
    """Score the runs of ``batch`` (see :func:`score_batch`): the outputs each run carries from
    its inference without reading them again, the others as stored."""

    def score(run: _Run) -> None:
        rest = [i for i in run.ids if i not in run.known]
        settled = res.results.settled(run.run_id, rest) if rest else set()
        unsettled = [i for i in rest if i not in settled]
        outputs = run.known | (res.results.outputs(run.run_id, unsettled) if unsettled else {})
        todo = run.counted(Stage.SCORE, list(outputs)) if outputs else []
        if len(outputs) < len(run.ids) - len(settled):
            # Scoring is enqueued only after an output is stored, so this message is stray
            # (e.g. replayed by hand); the inference path will enqueue the sample again.
            missing = len(run.ids) - len(settled) - len(outputs)
            log.warning("run %s: %d score messages without an output", run.run_id, missing)
        rows = run.rows(todo, Stage.SCORE) if todo else {}
        scores = _score(res, run, rows, outputs)
        if scores:
            res.record_provenance(run.run_id, run.evaluation)
            run.settled(res.results.record_scores(run.run_id, scores))
        elif (
            not run.errors
            and not run.retry
            and res.results.claim_finalize(run.run_id, res.stall_after)
        ):
            log.warning("run %s: took over from a finalizer that died", run.run_id)
            run.finalize()
        run.settle_errors()
        run.send_retries(SCORE_TASK)

    batch.each(score)
    return batch.requeue
