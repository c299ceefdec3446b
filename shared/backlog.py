"""Runs' backlogs and the fair dispatcher that hands them to the workers.

A run's inference messages do not go to the broker's ``infer`` queue at submit: they wait in
the run's backlog (``evalq:{run}:backlog``), each exactly as kombu's Redis transport would have
pushed it. ``dispatch.lua`` keeps the queue only as deep as the workers need (a batch's worth of
messages per live worker process: one with the default batch of 64) and refills it,
one message at a time, by start-time fair queueing (weighted fair queueing by virtual time):
first the principal with the lowest virtual time, then that principal's run with the lowest.
A message of ``s`` samples advances its run's time by ``s / weight`` and its principal's by
``s / principal weight``, so principals share the workers evenly whatever the number of runs
each has queued, and a principal's runs share its part by their priority (``high`` 4,
``normal`` 2, ``low`` 1; a principal weighs as much as its highest-priority backlogged run).
A principal that arrives joins at the clock, the time of the last one served (or at its own
time when it left, if later: leaving and coming back sheds nothing), so it is served next: a
small run waits for one refill, not for the big runs' backlogs. Within a principal, the run
chosen keeps its turn for :data:`TURN_SAMPLES` samples, so a sweep's runs (a model each) do not
make workers swap models at every batch. A cancelled run is withdrawn from the round at once.

Moving a message is one Lua script (``RPOP`` from the backlog, ``LPUSH`` to the queue), so a
dispatcher killed at any point, or a Redis restart, loses and duplicates nothing. Once a
message is in the queue it is kombu's: delivered, acknowledged, restored to ``infer`` if its
worker dies, exactly as before. Workers refill as their batches finish (and on every
heartbeat, so a queue drained while Redis was away is refilled). ``submit`` moves one message
whatever the queue's depth, to the queue's head: the fair choice at that moment (usually the
new run, which joined at the clock) is the next message any worker takes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import redis
from celery import Celery
from kombu import Connection
from kombu.transport.redis import Channel as RedisChannel
from kombu.transport.redis import Transport as RedisTransport
from kombu.utils.json import dumps
from pydantic import BaseModel, ConfigDict

from shared.celery_app import INFER_QUEUE, INFER_TASK
from shared.dispatch import message_size, split
from shared.keys import FAIR, RunKeys
from shared.lua import register
from shared.models import RunMeta, SampleTask

__all__ = ["STAGE_CHUNK", "TURN_SAMPLES", "Backlog", "Staged", "Standing", "capture"]

STAGE_CHUNK = 500
"""Messages staged per script call: a million-sample run does not block Redis in one call."""
TURN_SAMPLES = 4096
"""Samples one run of a principal is served before the principal's next run by virtual time
gets its turn: long enough that a worker does not swap models between a sweep's checkpoints at
every batch, short enough that every run of the principal moves."""


class _CapturingChannel(RedisChannel):
    """kombu's Redis channel, except that a published message is kept here instead of being
    pushed to its queue: the same routing, serialization and envelope, the Redis commands
    left to the caller."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.captured: list[tuple[str, str]] = []

    def _put(self, queue: str, message: dict[str, Any], **_: Any) -> None:
        kombu: Any = self  # kombu's type stubs leave out the Redis channel's helpers
        priority = kombu._get_message_priority(message, reverse=False)
        self.captured.append((kombu._q_for_pri(queue, priority), dumps(message)))


class _CapturingTransport(RedisTransport):
    Channel = _CapturingChannel


@dataclass(frozen=True, slots=True)
class Staged:
    """One message bound for a backlog: the queue it goes to and its samples."""

    samples: int
    queue: str
    message: str


def capture(app: Celery, task_name: str, tasks: Iterable[SampleTask]) -> list[Staged]:
    """The broker messages ``app.send_task`` would push for ``tasks`` (one per payload, to the
    task's queue), built by Celery and kombu but not pushed."""
    staged: list[Staged] = []
    with Connection(
        app.conf.broker_url,
        transport=_CapturingTransport,
        transport_options=app.conf.broker_transport_options,
    ) as connection:
        channel = cast(_CapturingChannel, connection.default_channel)
        producer = app.amqp.Producer(channel)
        for task in tasks:
            app.send_task(task_name, kwargs=task.model_dump(mode="json"), producer=producer)
            queue, message = channel.captured.pop()
            staged.append(Staged(len(task.sample_ids), queue, message))
    return staged


class Standing(BaseModel):
    """Where a backlogged run stands in the dispatcher (``status`` shows it)."""

    model_config = ConfigDict(frozen=True)

    waiting: int
    """Samples in the run's backlog, not handed to the workers yet."""
    share: float
    """Fraction of the dispatched samples the run gets while the backlogged runs stay as they
    are: its principal's share of the principals' weight, times its share of its principal's."""
    principals: int
    """Principals with a backlogged run (its own included)."""
    runs: int
    """Backlogged runs of the run's principal (itself included)."""
    ahead: int
    """Principals served before this run's principal at the next refill."""

    @property
    def why(self) -> str:
        """Why the run's samples wait, in words."""
        shared = []
        if self.principals > 1:
            shared.append(f"{self.principals - 1} other principal(s)")
        if self.runs > 1:
            shared.append(f"{self.runs - 1} other run(s) of its principal")
        if not shared:
            return "only run waiting: dispatched as fast as the workers take it"
        turn = "next in turn" if self.ahead == 0 else f"{self.ahead} principal(s) ahead"
        return f"shares the workers with {' and '.join(shared)}; {turn}"


class Backlog:
    """The runs' backlogs and the fair dispatcher's state; owns ``stage.lua``,
    ``dispatch.lua`` and ``withdraw.lua``."""

    def __init__(self, client: redis.Redis, turn_samples: int = TURN_SAMPLES) -> None:
        self._client = client
        self._turn = turn_samples
        self._stage = register(client, "stage")
        self._dispatch = register(client, "dispatch")
        self._withdraw = register(client, "withdraw")

    def stage(self, meta: RunMeta, messages: Sequence[Staged]) -> int:
        """Append ``messages`` to ``meta``'s backlog (in chunks of :data:`STAGE_CHUNK`) and
        enter the run in the dispatcher; return the samples staged (0 if the run has ended)."""
        keys = RunKeys(meta.run_id)
        staged = 0
        for start in range(0, len(messages), STAGE_CHUNK):
            fields: list[str | int] = [
                FAIR.prefix, meta.run_id, meta.principal, meta.priority.weight,
            ]  # fmt: skip
            for entry in messages[start : start + STAGE_CHUNK]:
                fields += [entry.samples, entry.queue, entry.message]
            staged += int(self._stage(keys=[keys.meta, keys.backlog], args=fields))
        return staged

    def enqueue(self, app: Celery, meta: RunMeta, sample_ids: Sequence[int]) -> int:
        """Stage inference of ``sample_ids`` of ``meta``'s run in its backlog, in messages of
        :func:`shared.dispatch.message_size` samples, then move one message to the queue's
        head; return the samples staged."""
        if not sample_ids:
            return 0
        size = message_size(len(sample_ids))
        staged = self.stage(meta, capture(app, INFER_TASK, split(meta, sample_ids, size=size)))
        if staged:
            self.dispatch(INFER_QUEUE, 1, at_least=1)
        return staged

    def refill(self, depth: int) -> int:
        """Refill ``infer`` to ``depth`` messages (a batch of the caller's worker), or deeper
        when the janitor counted more; return the messages moved."""
        return self.dispatch(INFER_QUEUE, max(1, depth))

    def dispatch(self, queue: str, depth: int, *, at_least: int = 0) -> int:
        """Refill ``queue`` up to ``depth`` messages from the backlogs, fairly, and move at
        least ``at_least`` (those beyond ``depth`` go to the queue's head: the fair choice of
        this moment goes before what was chosen earlier); return how many moved."""
        prefix, suffix = RunKeys("\0").backlog.split("\0")
        args: list[str | int] = [depth, at_least, FAIR.prefix, self._turn, prefix, suffix]
        return int(self._dispatch(keys=[queue, FAIR.depth], args=args))

    def withdraw(self, run_id: str) -> bool:
        """Take a cancelled run out of the dispatcher's round; False if it was not in it."""
        return bool(self._withdraw(keys=[], args=[FAIR.prefix, run_id]))

    def set_depth(self, messages: int, ttl: float) -> None:
        """Keep ``infer`` ``messages`` deep: a batch's worth per live worker process consuming
        it (the janitor counts them; the count expires after ``ttl`` seconds unless counted
        again)."""
        self._client.set(FAIR.depth, max(1, messages), px=max(1, int(ttl * 1000)))

    def waiting(self) -> dict[str, tuple[str, int]]:
        """Backlogged run -> (its principal, samples in its backlog)."""
        with self._client.pipeline(transaction=False) as pipe:
            pipe.hgetall(FAIR.owner)
            pipe.hgetall(FAIR.waiting)
            owners, counts = pipe.execute()
        return {str(run): (str(owner), int(counts.get(run, 0))) for run, owner in owners.items()}

    def standing(self, run_id: str) -> Standing | None:
        """Where ``run_id`` stands, or None when it has no backlog."""
        principal = self._client.hget(FAIR.owner, run_id)
        if principal is None:
            return None
        principal = str(principal)
        with self._client.pipeline(transaction=False) as pipe:
            pipe.hget(FAIR.waiting, run_id)
            pipe.zrange(FAIR.principals, 0, -1)
            pipe.zrange(FAIR.runs(principal), 0, -1)
            pipe.hgetall(FAIR.weight)
            waiting, principals, runs, weights = pipe.execute()
            principals = [str(p) for p in principals]
            for other in principals:
                pipe.hgetall(FAIR.weights(other))
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
        """The broker messages waiting in ``run_id``'s backlog."""
        for entry in self._client.lrange(RunKeys(run_id).backlog, 0, -1):
            yield str(entry).split("|", 2)[2]


def _highest(counts: dict[Any, Any]) -> int:
    """A principal's weight: the highest weight among its backlogged runs."""
    return max([int(w) for w, n in counts.items() if int(n) > 0] or [1])


def _share(weights: dict[Any, Any], members: Sequence[Any], member: str) -> float:
    total = sum(float(weights.get(m, 1)) for m in members)
    return float(weights.get(member, 1)) / total if total else 0.0
