"""One batch of messages as a worker handles it (no Celery here): what a worker process hands
its batch functions (:class:`Resources`), each run's share of the batch (:class:`RunShare`: its
record, evaluation, samples and what became of them) and the batch of those shares
(:class:`Batch`). Inference (:mod:`evalq.worker.inference`) and scoring
(:mod:`evalq.worker.scoring`) are steps over a batch.

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
import logging
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from evalq.shared.errors import (
    OutputTooLarge,
    PermanentError,
    StoreError,
    UnknownRunError,
    first_line,
)
from evalq.shared.evaluation import Evaluation
from evalq.shared.models import (
    ErrorRecord,
    RunMeta,
    RunStatus,
    SampleTask,
    Stage,
    error_record,
    from_json,
)
from evalq.shared.queue.pace import PaceMeter
from evalq.shared.queue.sizing import split
from evalq.shared.store.labels import LabelFields
from evalq.shared.store.provenance import ProvenanceStore, of_worker
from evalq.shared.store.reader import ResultReader
from evalq.shared.store.runs import RunStore
from evalq.shared.store.writer import Delivery, ResultWriter, Settled
from evalq.worker.lru import LRU
from evalq.worker.runtime_pool import RuntimePool
from evalq.worker.shard_cache import ShardCache

__all__ = ["STORE_ERRORS", "Batch", "Resources", "RunShare", "bounded"]

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
    reader: ResultReader
    writer: ResultWriter
    shards: ShardCache
    runtimes: RuntimePool
    publish: Publisher
    """Sends messages straight to their queue (a sample's retry, alone)."""
    stage_scoring: Stager
    """Stages the scoring of a run's inferred samples in its score backlog, from which the
    fair dispatcher hands it to the scoring workers (an inference-only worker)."""
    labels: LabelFields
    """Every registered task's and loaded evaluation's label fields, scrubbed from every row
    before inference whichever evaluation runs (read from the registry, never a message)."""
    max_batch: int
    max_attempts: int
    max_output_bytes: int = 262_144
    """The most bytes a sample's stored output (or grade) may take (:func:`bounded`)."""
    max_run_bytes: int = 512 * 2**20
    """The most bytes of outputs a going run may hold in Redis (``EVALQ_MAX_RUN_BYTES``)."""
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
    pace: PaceMeter | None = None
    """Measures the pace of the models this process infers with (sizes their next runs'
    messages)."""

    def record_provenance(self, run_id: str, evaluation: Evaluation) -> None:
        """Record, once per run in this process, what its inference ran with."""
        if self.provenance is None or run_id in self.recorded:
            return
        self.provenance.record(run_id, of_worker(evaluation, self.runtimes.device))
        self.recorded.get_or_create(run_id, lambda: True)


_IMMUTABLE = (str, int, float, bool, bytes, type(None))
_SCALARS = frozenset(_IMMUTABLE)
"""Types whose values cannot be changed in place (an exact type; subclasses go through
``isinstance``)."""


def _immutable(row: dict[str, Any]) -> bool:
    """Whether no field of ``row`` can be changed in place."""
    for value in row.values():
        if type(value) not in _SCALARS and not isinstance(value, _IMMUTABLE):
            return False
    return True


KEPT = frozenset({str, int, float, bool, type(None)})
"""Types of the outputs a worker keeps as ``infer()`` returned them, to score in the same job
without reading them back (:attr:`RunShare.values`): their JSON text reads back as an equal
value of the same type."""


def bounded(text: str, limit: int, what: str) -> str:
    """``text`` (a value's JSON, to be stored in Redis), or :class:`OutputTooLarge` when its
    UTF-8 takes more than ``limit`` bytes (``EVALQ_MAX_OUTPUT_BYTES``)."""
    size = len(text.encode()) if len(text) * 4 > limit else len(text)
    if size > limit:
        raise OutputTooLarge(
            f"{what} of {size} bytes is over the {limit} a worker stores (EVALQ_MAX_OUTPUT_BYTES)"
        )
    return text


class RunShare:
    """One run's share of a batch: its record, evaluation, samples and what became of them."""

    def __init__(self, res: Resources, run_id: str, tasks: list[SampleTask]) -> None:
        self.res = res
        self.meta: RunMeta = res.runs.get(run_id)
        self.errors: dict[int, ErrorRecord] = {}
        self.outputs: dict[int, str] = {}
        self.usages: dict[int, str] = {}
        """A language model's outputs' usage (:meth:`evalq.shared.models.Usage.stored`),
        stored beside them."""
        self.values: dict[int, Any] = {}
        """Outputs of :data:`KEPT` types as ``infer()`` returned them (their JSON in
        :attr:`outputs`)."""
        self.attempts: dict[int, int] = {}
        self.deliveries: list[Delivery] = []
        """The messages that brought the samples, as they came (an id once, in the first)."""
        self.alone: set[int] = set()
        """Samples with an attempt count of their own (see ``ResultWriter.attempt``)."""
        self.stage = Stage.INFER
        """The stage whose attempts were counted last."""
        self.retry: list[int] = []
        self.ids: list[int] = []
        self.known: dict[int, Any] = {}
        """Outputs known without a read: those this worker stored just before scoring them."""
        self.todo: list[int] | None = None
        """The samples to score, when their attempt was counted as their outputs were stored
        (:meth:`count`); None: scoring counts it."""
        self._rows: dict[int, dict[str, Any]] = {}
        if not self.meta.status.active:
            return
        ranges = res.members.get_or_create(run_id, lambda: _ranges(res.runs.sample_ids(run_id)))
        seen: set[int] = set()
        for task in tasks:
            refused = self._refusal(task, ranges)
            if refused:
                log.error("dropping a message of run %s: %s", run_id, refused)
                continue
            fresh = [i for i in dict.fromkeys(task.sample_ids) if i not in seen]
            seen.update(fresh)
            self.ids.extend(fresh)
            self.deliveries.append(Delivery(task.delivery, task.solo, fresh))
        if self.ids:
            self.evaluation: Evaluation = res.runtimes.evaluation(self.meta)

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

    def carried(self, ids: list[int], stored: bool) -> RunShare:
        """This run's share of the scoring that follows its inference in the same job: its
        record, evaluation, the rows read for inference that ``infer()`` cannot have changed
        (every field immutable: it got a shallow copy), and, when every output this worker
        wrote was stored (``stored``: none lost to another worker's), those outputs."""
        run = copy.copy(self)
        run.ids, run.errors, run.outputs, run.attempts, run.retry = ids, {}, {}, {}, []
        run.usages, run.values = {}, {}
        run.todo = None
        run.alone = set(self.alone)
        run._rows = {i: row for i, row in self._rows.items() if _immutable(row)}
        values, outputs = self.values, self.outputs
        run.known = (
            {i: values[i] if i in values else from_json(outputs[i]) for i in ids if i in outputs}
            if stored
            else {}
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
                self.errors[sample_ids[0]] = error_record(stage, exc)
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
        deliveries = self.bringing(todo)
        return self.count(
            stage, deliveries, self.res.writer.attempt(self.run_id, deliveries, stage)
        )

    def bringing(self, todo: list[int]) -> list[Delivery]:
        """The messages as they brought the samples of ``todo`` (each message with those of its
        samples only)."""
        wanted = set(todo)
        return [
            Delivery(d.key, d.solo, [i for i in d.sample_ids if i in wanted])
            for d in self.deliveries
        ]

    def count(self, stage: Stage, deliveries: list[Delivery], counts: dict[int, int]) -> list[int]:
        """What :meth:`counted` does with the attempt counts of ``deliveries``' samples."""
        self.stage = stage
        solo = {i for d in deliveries if d.solo for i in d.sample_ids}
        self.alone.update(i for i, count in counts.items() if count != 1 or i in solo)
        self.retry.extend(i for i, count in counts.items() if count < 0)
        self.attempts = {i: count for i, count in counts.items() if count > 0}
        limit = self.res.max_attempts
        for sample_id, count in self.attempts.items():
            if count > limit:
                died = PermanentError(
                    f"gave up after {limit} attempts: the worker process running this "
                    f"sample's {stage.value} died or was stopped each time"
                )
                self.errors[sample_id] = error_record(stage, died)
        return [i for i in self.attempts if i not in self.errors]

    def send_retries(self, task_name: str) -> None:
        """Send the samples to retry on alone, each with the count of its attempts so far."""
        carried = {i: self.attempts[i] for i in self.retry if i not in self.alone}
        if carried:
            self.res.writer.carry_attempts(self.run_id, carried, self.stage)
            self.alone.update(carried)
        if self.retry:
            log.warning(
                "run %s: %d samples go back to the queue alone", self.run_id, len(self.retry)
            )
            self.res.publish(task_name, list(split(self.meta, self.retry, solo=True)))

    def settle_errors(self) -> None:
        if self.errors:
            alone = not self.alone.isdisjoint(self.errors)
            self.settled(self.res.writer.record_errors(self.run_id, self.errors, alone))

    def settled(self, done: Settled) -> None:
        """After a settling write: finalize the run if it fell to this caller, else ask for a
        spill when the write may have completed a segment."""
        if done.finalize:
            self.finalize()
        elif done.filled(self.res.spill_rows) and self.res.spill is not None:
            self.res.spill(self.run_id)

    def finalize(self) -> None:
        finished = self.res.writer.finalize(self.run_id, self.evaluation, self.clusters)
        if finished is not None:
            log.info("run %s %s: %s", self.run_id, finished.status, finished.reason or "done")
            if finished.status is RunStatus.COMPLETED and self.res.archive is not None:
                self.res.archive(self.run_id)


class Batch:
    """The runs of one batch, and those whose messages must go back to the queue because
    Redis failed while they were read or stored.

    Any other error while one run is handled (a run whose evaluation cannot be created here,
    a bug) is logged with its traceback and takes only that run out of the batch; its messages
    are acknowledged, not requeued, so that a deterministic error cannot loop, and the janitor
    sends its unsettled samples again after ``EVALQ_STALL_AFTER`` seconds.
    """

    def __init__(self, runs: list[RunShare]) -> None:
        self.requeue: set[str] = set()
        self.runs = runs

    @classmethod
    def read(cls, res: Resources, tasks: list[SampleTask], stage: Stage) -> Batch:
        """The batch of ``tasks``' runs, each read from Redis."""
        batch = cls([])
        groups: dict[str, list[SampleTask]] = defaultdict(list)
        for task in tasks:
            groups[task.run_id].append(task)
        for run_id, run_tasks in groups.items():
            try:
                run = RunShare(res, run_id, run_tasks)
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

    def each(self, step: Callable[[RunShare], None]) -> None:
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
