"""Runs' backlogs and the fair dispatcher that hands them to the workers.

A run's messages do not go to the broker's stage queues when they are made: they wait in the
run's backlog for that queue, each exactly as kombu's Redis transport would have pushed it.
Inference messages (made at submit) wait in ``evalq:{run}:backlog`` for ``infer``; scoring
messages (made by an inference-only worker as a batch's outputs are stored, and by
``rescore``) wait in ``evalq:{run}:score_backlog`` for ``score``. Each queue is a
:class:`Lane` with a round of its own: ``dispatch.lua`` keeps the queue only as deep as its
workers need (a batch's worth of messages per live worker process consuming it: one with the
default batch of 64) and refills it, one message at a time, by start-time fair queueing
(weighted fair queueing by virtual time): first the principal with the lowest virtual time,
then that principal's run with the lowest. A message of ``s`` samples advances its run's time
by ``s / weight`` and its principal's by ``s / principal weight``, so principals share the
workers evenly whatever the number of runs each has queued, and a principal's runs share its
part by their priority (``high`` 4, ``normal`` 2, ``low`` 1; a principal weighs as much as its
highest-priority backlogged run). A principal that arrives joins at the clock, the time of the
last one served (or at its own time when it left, if later: leaving and coming back sheds
nothing), so it is served next: a small run waits for one refill, not for the big runs'
backlogs. Within a principal, a turn serves one model for :data:`TURN_SECONDS`: its runs on
that model interleave by virtual time (a small run beside a big one on the same model is
served at once), and a sweep's runs (a model each) do not make workers swap models at every
batch. A cancelled run is withdrawn from every round at once.

The two queues keep separate virtual times because they are separate resources, often served
by separate workers (the compose topology: GPU workers infer, CPU workers score): a principal
is charged in each round for what it takes of that queue's workers only. One shared round would
charge a run's inference against its scoring, so a rescore (scoring only) would get two thirds
of the scorers against a run that needs both, and a principal whose inference went fast would
wait longer for scoring than one arriving with nothing inferred.

Moving a message is one Lua script (``RPOP`` from the backlog, ``LPUSH`` to the queue), so a
dispatcher killed at any point, or a Redis restart, loses and duplicates nothing. Once a
message is in the queue it is kombu's: delivered, acknowledged, restored to its queue if its
worker dies, exactly as before. Workers refill the queues they consume as their batches finish
(and on every heartbeat, so a queue drained while Redis was away is refilled); staging refills
its queue in the same call. ``submit`` (and ``rescore``) moves one message whatever the queue's
depth, to the queue's head: the fair choice at that moment (usually the new run, which joined
at the clock) is the next message any worker takes. An inference-only worker's scoring
messages move only as deep as the queue should be: one to the head per batch would make
``score`` a queue in arrival order again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, cast

import redis
from celery import Celery
from kombu import Connection

from evalq.shared.evaluation import model_key
from evalq.shared.keys import FAIR, FAIR_SCORE, FairKeys, RunKeys
from evalq.shared.lm.harness import HarnessRun, is_harness_run
from evalq.shared.lm.run import LanguageRun
from evalq.shared.models import RunMeta, SampleTask, Stage
from evalq.shared.queue.broker import CapturingChannel, CapturingTransport
from evalq.shared.queue.celery_app import INFER_QUEUE, INFER_TASK, SCORE_QUEUE, SCORE_TASK
from evalq.shared.queue.pace import Pace
from evalq.shared.queue.sizing import message_size, split
from evalq.shared.queue.standing import Standing
from evalq.shared.store.scripts import register
from evalq.shared.target import is_sentinel

__all__ = [
    "INFER_LANE",
    "LANES",
    "SCORE_LANE",
    "STAGE_CHUNK",
    "TURN_SECONDS",
    "Backlog",
    "Capturer",
    "Lane",
    "Staged",
    "capture",
    "lane_of",
    "on_endpoint",
    "run_model",
]

STAGE_CHUNK = 500
"""Messages staged per script call: a million-sample run does not block Redis in one call."""
TURN_SECONDS = 30.0
"""How long one turn of a principal serves one model before the principal's lowest-time run
(maybe of another model) gets its turn: long enough that a worker does not swap models between
a sweep's checkpoints at every batch, short enough that every run of the principal moves soon
however slow its samples (a turn of 4,096 samples of a generative model was many minutes).
Runs on the model being served interleave by virtual time within the turn."""


@lru_cache(maxsize=256)
def _language_run(task: str) -> LanguageRun | HarnessRun:
    if is_harness_run(task):
        return HarnessRun.model_validate_json(task)
    return LanguageRun.model_validate_json(task)


def run_model(meta: RunMeta) -> str:
    """The warm model ``meta``'s run needs (what a principal's turn serves)."""
    if meta.task is not None:
        return _language_run(meta.task).model_key()
    return model_key(meta.eval, meta.params)


def on_endpoint(meta: RunMeta) -> bool:
    """Whether ``meta``'s run is on an endpoint model: its work waits on a server (a worker
    runs it in its endpoint lane, :mod:`evalq.worker.lane`)."""
    return meta.task is not None and _language_run(meta.task).model.endpoint is not None


def lane_of(task: str) -> Lane:
    """The lane whose messages run ``task`` (``evalq.infer``, ``evalq.score``)."""
    return next(lane for lane in LANES if lane.task == task)


@dataclass(frozen=True, slots=True)
class Lane:
    """A broker queue the dispatcher keeps a batch deep, its task, the runs' backlogs of its
    messages and its own round."""

    queue: str
    task: str
    fair: FairKeys
    stage: Stage
    """Which of a run's backlogs holds its messages (:meth:`RunKeys.backlog_of`)."""

    def backlog(self, run_id: str) -> str:
        """``run_id``'s backlog of this lane's messages."""
        return RunKeys(run_id).backlog_of(self.stage)

    def round_keys(self) -> list[str]:
        """The keys of the lane's round, as the Lua scripts take them (``fair_round`` in
        ``shared/queue/lua/prelude.lua``)."""
        fair = self.fair
        return [
            fair.principals,
            fair.clock,
            fair.finish,
            fair.owner,
            fair.weight,
            fair.waiting,
            fair.turn,
            fair.model,
        ]

    def round_args(self) -> list[str]:
        """The keys a script of the lane's round names as it goes, as templates: the prefix
        and suffix around a principal of its runs and weights keys, and around a run id of its
        backlog (``fair_round`` in ``shared/queue/lua/prelude.lua``)."""
        return [*_around(self.fair.runs), *_around(self.fair.weights), *_around(self.backlog)]


def _around(name: Callable[[str], str]) -> tuple[str, str]:
    """The prefix and suffix that ``name`` puts around its argument."""
    prefix, suffix = name("\0").split("\0")
    return prefix, suffix


INFER_LANE = Lane(INFER_QUEUE, INFER_TASK, FAIR, Stage.INFER)
SCORE_LANE = Lane(SCORE_QUEUE, SCORE_TASK, FAIR_SCORE, Stage.SCORE)
LANES = (INFER_LANE, SCORE_LANE)


@dataclass(frozen=True, slots=True)
class Staged:
    """One message bound for a backlog: the queue it goes to and its samples."""

    samples: int
    queue: str
    message: str


class Capturer:
    """Builds the broker messages ``app.send_task`` would push, on one capturing connection
    kept open: a worker that stages scoring at every batch pays about 0.2 ms a message, not
    the 4 ms of opening the connection (and its ``PING``) again. Nothing it builds touches
    Redis; :meth:`close` releases the connection."""

    def __init__(self, app: Celery) -> None:
        self._app = app
        self._connection: Connection | None = None
        self._channel: CapturingChannel | None = None
        self._producer: Any = None

    def __call__(self, task_name: str, tasks: Iterable[SampleTask]) -> list[Staged]:
        """The messages for ``tasks`` (one per payload, to the task's queue), built by Celery
        and kombu but not pushed."""
        if self._channel is None:
            url = self._app.conf.broker_url
            self._connection = Connection(
                # nothing connects: a Sentinel group's several URLs would make it a failover
                # list, whose connection the producer does not get
                "redis://" if is_sentinel(url) else url,
                transport=CapturingTransport,
                transport_options=self._app.conf.broker_transport_options,
            )
            self._channel = cast(CapturingChannel, self._connection.default_channel)
            self._producer = self._app.amqp.Producer(self._channel)
        staged: list[Staged] = []
        for task in tasks:
            kwargs = task.model_dump(mode="json")
            self._app.send_task(task_name, kwargs=kwargs, producer=self._producer)
            queue, message = self._channel.captured.pop()
            staged.append(Staged(len(task.sample_ids), queue, message))
        return staged

    def close(self) -> None:
        """Release the connection (a later call opens another)."""
        if self._connection is not None:
            self._connection.release()
        self._connection, self._channel, self._producer = None, None, None


def capture(app: Celery, task_name: str, tasks: Iterable[SampleTask]) -> list[Staged]:
    """The broker messages ``app.send_task`` would push for ``tasks`` (one per payload, to the
    task's queue), built by Celery and kombu but not pushed, on a connection of their own."""
    capturer = Capturer(app)
    try:
        return capturer(task_name, tasks)
    finally:
        capturer.close()


class Backlog:
    """The runs' backlogs and the fair dispatcher's state, for every :class:`Lane`; owns
    ``stage.lua``, ``dispatch.lua`` and ``withdraw.lua``."""

    def __init__(self, client: redis.Redis, turn_seconds: float = TURN_SECONDS) -> None:
        self._client = client
        self._turn = turn_seconds
        self._stage = register(client, "evalq.shared.queue", "stage")
        self._dispatch = register(client, "evalq.shared.queue", "dispatch")
        self._withdraw = register(client, "evalq.shared.queue", "withdraw")

    def stage(
        self,
        meta: RunMeta,
        messages: Sequence[Staged],
        lane: Lane = INFER_LANE,
        *,
        refill: int | None = None,
        at_least: int = 0,
    ) -> int:
        """Append ``messages`` to ``meta``'s backlog in ``lane`` (in chunks of
        :data:`STAGE_CHUNK`) and enter the run in the lane's round; with ``refill``, then
        refill the lane's queue as :meth:`dispatch` does, in the same call as the last chunk.
        Return the samples staged (0 if the run has ended)."""
        keys = [
            RunKeys(meta.run_id).meta,
            lane.backlog(meta.run_id),
            lane.queue,
            lane.fair.depth,
            *lane.round_keys(),
        ]
        staged = 0
        for start in range(0, len(messages), STAGE_CHUNK):
            last = start + STAGE_CHUNK >= len(messages)
            fields: list[str | int | float] = [
                meta.run_id,
                meta.principal,
                meta.priority.weight,
                "" if refill is None or not last else max(0, refill),
                at_least,
                self._turn,
                run_model(meta),
                *lane.round_args(),
            ]
            for entry in messages[start : start + STAGE_CHUNK]:
                fields += [entry.samples, entry.queue, entry.message]
            staged += int(self._stage(keys=keys, args=fields))
        return staged

    def enqueue(
        self, app: Celery, meta: RunMeta, sample_ids: Sequence[int], lane: Lane = INFER_LANE
    ) -> int:
        """Stage ``lane``'s work (inference, or scoring for ``rescore``) on ``sample_ids`` of
        ``meta``'s run in its backlog, in messages of :func:`evalq.shared.queue.sizing.message_size`
        samples (inference's by its model's pace), and move one message to the queue's head;
        return the samples staged."""
        if not sample_ids:
            return 0
        pace = Pace(self._client).of(run_model(meta)) if lane is INFER_LANE else None
        size = message_size(len(sample_ids), pace)
        messages = capture(app, lane.task, split(meta, sample_ids, size=size))
        return self.stage(meta, messages, lane, refill=1, at_least=1)

    def stage_scoring(self, capturer: Capturer, meta: RunMeta, sample_ids: Sequence[int]) -> int:
        """Stage the scoring of ``sample_ids`` of ``meta``'s run, just inferred by an
        inference-only worker, in its score backlog (messages of up to
        :data:`evalq.shared.queue.sizing.MESSAGE_SAMPLES`), and refill
        ``score`` to its depth, in one call; return the samples staged."""
        if not sample_ids:
            return 0
        messages = capturer(SCORE_TASK, split(meta, sample_ids))
        return self.stage(meta, messages, SCORE_LANE, refill=1)

    def refill(self, depth: int, queues: Iterable[str] = (INFER_QUEUE,)) -> int:
        """Refill each of ``queues`` that has a lane (the stage queues the caller's worker
        consumes) to ``depth`` messages (a batch of the caller's worker), or deeper when the
        janitor counted more, in one call; return the messages moved."""
        lanes = [lane for lane in LANES if lane.queue in set(queues)]
        return self._refill([(lane.queue, lane, max(1, depth), 0) for lane in lanes])

    def dispatch(
        self, queue: str, depth: int, *, at_least: int = 0, lane: Lane = INFER_LANE
    ) -> int:
        """Refill ``queue`` up to ``depth`` messages from ``lane``'s backlogs, fairly, and move
        at least ``at_least`` (those beyond ``depth`` go to the queue's head: the fair choice
        of this moment goes before what was chosen earlier); return how many moved."""
        return self._refill([(queue, lane, depth, at_least)])

    def _refill(self, queues: Sequence[tuple[str, Lane, int, int]]) -> int:
        if not queues:
            return 0
        keys: list[str] = []
        args: list[str | float] = [self._turn]
        for queue, lane, depth, at_least in queues:
            keys += [queue, lane.fair.depth, *lane.round_keys()]
            args += [depth, at_least, *lane.round_args()]
        return int(self._dispatch(keys=keys, args=args))

    def withdraw(self, run_id: str) -> bool:
        """Take a cancelled run out of every lane's round and delete its backlogs; False if it
        was in no round."""
        keys: list[str] = []
        args: list[str] = [run_id]
        for lane in LANES:
            keys += [lane.backlog(run_id), *lane.round_keys()]
            args += lane.round_args()
        return bool(self._withdraw(keys=keys, args=args))

    def set_depth(self, messages: int, ttl: float, lane: Lane = INFER_LANE) -> None:
        """Keep ``lane``'s queue ``messages`` deep: a batch's worth per live worker process
        consuming it (the janitor counts them; the count expires after ``ttl`` seconds unless
        counted again)."""
        self._client.set(lane.fair.depth, max(1, messages), px=max(1, int(ttl * 1000)))

    def waiting(self) -> dict[str, tuple[str, int]]:
        """Backlogged run -> (its principal, samples in its backlogs, every lane's)."""
        with self._client.pipeline(transaction=False) as pipe:
            for lane in LANES:
                pipe.hgetall(lane.fair.owner)
                pipe.hgetall(lane.fair.waiting)
            replies = pipe.execute()
        found: dict[str, tuple[str, int]] = {}
        for owners, counts in zip(replies[::2], replies[1::2], strict=True):
            for run, owner in owners.items():
                before = found.get(str(run), ("", 0))[1]
                found[str(run)] = (str(owner), before + int(counts.get(run, 0)))
        return found

    def standing(self, run_id: str) -> Standing | None:
        """Where ``run_id`` stands: in the inference round while it has inference waiting,
        else in the scoring round; None when it has no backlog."""
        for lane in LANES:
            found = self._standing(run_id, lane.fair)
            if found is not None:
                return found
        return None

    def _standing(self, run_id: str, fair: FairKeys) -> Standing | None:
        principal = self._client.hget(fair.owner, run_id)
        if principal is None:
            return None
        principal = str(principal)
        with self._client.pipeline(transaction=False) as pipe:
            pipe.hget(fair.waiting, run_id)
            pipe.zrange(fair.principals, 0, -1)
            pipe.zrange(fair.runs(principal), 0, -1)
            pipe.hgetall(fair.weight)
            waiting, principals, runs, weights = pipe.execute()
            principals = [str(p) for p in principals]
            for other in principals:
                pipe.hgetall(fair.weights(other))
            counts = pipe.execute()
        if principal not in principals or run_id not in {str(r) for r in runs}:
            return None
        highest = {p: _highest(c) for p, c in zip(principals, counts, strict=True)}
        share = _share(highest, principals, principal) * _share(weights, runs, run_id)
        return Standing(
            waiting=int(waiting or 0),
            share=share,
            principals=len(principals),
            runs=len(runs),
            ahead=principals.index(principal),
        )

    def messages(self, run_id: str) -> Iterator[str]:
        """The broker messages waiting in ``run_id``'s backlogs (inference, then scoring)."""
        for lane in LANES:
            for entry in self._client.lrange(lane.backlog(run_id), 0, -1):
                yield str(entry).split("|", 2)[2]


def _highest(counts: dict[Any, Any]) -> int:
    """A principal's weight: the highest weight among its backlogged runs."""
    return max([int(w) for w, n in counts.items() if int(n) > 0] or [1])


def _share(weights: dict[Any, Any], members: Sequence[Any], member: str) -> float:
    total = sum(float(weights.get(m, 1)) for m in members)
    return float(weights.get(member, 1)) / total if total else 0.0
