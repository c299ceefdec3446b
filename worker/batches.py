"""The batch tasks ``evalq.infer`` and ``evalq.score``: each message runs as one batch.

A message carries 64 to 2,048 samples (:func:`evalq.shared.queue.sizing.message_size`), a whole
batch of the default ``EVALQ_MAX_BATCH`` or more, so a worker runs each message as one pool job
as it arrives, and gathers nothing across messages: ``bench/batches.py`` measured the buffering
that did (celery-batches, until a buffer held ``EVALQ_MAX_BATCH`` samples) against this, and it
did not pay (``bench/README.md``). A ``solo`` message so runs alone too: if its sample kills the
pool process, only its own message is redelivered.

Each task is a plain Celery task with a strategy of its own (:func:`strategy`, named by
``Task.Strategy``, Celery's hook for how a worker handles a task's messages): the worker's main
process checks each message and hands it to the pool (``consumer.pool.apply_async``, with
callbacks) or to the endpoint lane itself, so that evalq, not Celery, decides when it is
acknowledged.

What reaches a worker is run, moved or dropped, never a crash and never a requeue loop: every
message passes :func:`evalq.worker.intake.admit` in the main process first; a malformed one is
logged and dropped. A message of an evaluation this worker does not serve (its plugin is not
loaded) is moved to that evaluation's own queue (``infer.<eval>`` / ``score.<eval>``), which
only workers serving it consume: it neither cycles through this worker nor waits for it.

A job acknowledges its message only if its results were stored: the task returns the runs whose
writes failed (Redis out of memory, a lost connection), and their messages go back to the queue;
a lost pool process requeues its message at once, as ``task_reject_on_worker_lost`` does for
ordinary tasks, instead of leaving it for the visibility timeout (killed, out of memory,
``os._exit``, or past ``time_limit``). There is deliberately no soft limit: its exception would
be caught inside the job and the message acknowledged with its samples unfinished.

Each message is reported to event monitors (Flower) as a task: received and started as it goes
to the pool, succeeded when it is acknowledged, rejected when it is requeued.

A message of a run on an endpoint model does not go to the pool: it runs in the worker's
endpoint lane (:mod:`evalq.worker.lane`), or goes back to its run's backlog when its principal
holds its share of the lane.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from celery import Celery, Task
from redis import Redis

from evalq.shared.connection import Target, connect
from evalq.shared.errors import PayloadError, UnknownRunError, first_line
from evalq.shared.evaluation import registered
from evalq.shared.models import RunMeta, SampleTask
from evalq.shared.queue.backlog import Backlog, Capturer, lane_of, on_endpoint
from evalq.shared.queue.celery_app import STAGE_QUEUES, evaluation_queue
from evalq.shared.queue.sizing import publish
from evalq.shared.store.runs import RunStore
from evalq.worker.intake import admit
from evalq.worker.lane import EndpointLane
from evalq.worker.lru import LRU
from evalq.worker.messages import Held, TaskRequest, ack_or_requeue, announce, send_event
from evalq.worker.prefetch import Reserve

__all__ = ["SampleBatches", "run_job", "strategy"]

log = logging.getLogger(__name__)

UNSERVED_LOG_EVERY = 60.0

Batch = list[TaskRequest]
Requeue = list[str]
"""What a batch task returns: the ids of the requests whose messages go back to the queue."""


def run_job(task: SampleBatches, requests: Batch) -> Requeue | None:
    """Run ``task`` on ``requests`` in a pool process (or an endpoint thread); None if it raised
    (logged as ``Error: ...``, which the tests look for), so that every message goes back."""
    try:
        requeue: Requeue = task(requests)
    except Exception as exc:
        log.error("Error: %s raised %r", task.name, exc, exc_info=True)
        return None
    return requeue


def strategy(task: SampleBatches, app: Celery, consumer: Any, **_: Any) -> Callable[..., None]:
    """The strategy of the batch tasks (Celery's ``Task.Strategy`` names it): their handler of
    each message the worker's consumer receives for them."""
    return task.message_handler(app, consumer)


class SampleBatches(Task):  # type: ignore[type-arg]  # generic only in celery-types
    """A task whose every message is a batch of samples, run as one pool job as it arrives.

    A message of a run on an endpoint model runs alone in the worker's endpoint lane
    (:mod:`evalq.worker.lane`), or, when the lane has no place for its principal, goes back to
    its run's backlog.
    """

    typing = False
    Strategy = "evalq.worker.batches:strategy"
    redis = Target("")  # set by register_tasks: where to look a message's run up
    lane_threads = 0
    """Threads of the endpoint lane (``EVALQ_ENDPOINT_THREADS``); 0: endpoint models' messages
    run in the pool as any other."""
    close_thread: Callable[[], None] = staticmethod(lambda: None)
    """Frees the calling thread's worker resources (an endpoint thread's, as it stops)."""

    def __init__(self) -> None:
        self._worker_pool: Any = None
        self._events: Any = None
        self._reserve: Reserve | None = None
        self.held = Held()
        self._unserved_logged: dict[str, float] = {}
        self._languages: set[str] = set()
        """Names of registered language tasks this worker has seen runs of: it serves them
        all (a run's record carries its task and model)."""
        self._jobs = 0
        self._unstarted: dict[int, str] = {}
        """Delivery tags of the messages handed to the pool that no pool process has started
        yet, by job."""
        self._lane: EndpointLane | None = None
        self._in_lane: set[str] = set()
        """Delivery tags of the messages in the endpoint lane (held, but not the pool's)."""
        self._client: Redis | None = None
        """The main process's Redis client, opened on first use (runs' facts, give-backs)."""
        self._facts: LRU[str, RunMeta] = LRU(256)
        """Recent runs' facts, read once: whose run, of which evaluation, on which model."""
        self._returns: tuple[Backlog, Capturer] | None = None

    def message_handler(self, app: Celery, consumer: Any) -> Callable[..., None]:
        """The handler of this task's messages in the worker's main process (what Celery's
        consumer calls with each message it receives for this task; see :func:`strategy`)."""
        self._worker_pool = consumer.pool
        self._events = consumer.event_dispatcher
        self._reserve = Reserve.of(consumer)
        if self.lane_threads:
            self._lane = EndpointLane.of(consumer, self.lane_threads, self.close_thread)
        served = frozenset(registered())

        def handle(message: Any, *_args: Any, **_kwargs: Any) -> None:
            try:
                payload = admit(message)
            except PayloadError as exc:
                log.error("dropping an %s message: %s", self.name, exc)
                ack_or_requeue(message, requeue=False)
                return
            unserved = payload.eval not in served and payload.eval not in self._languages
            if unserved and not self._forward(app, message, payload):
                return
            try:
                meta = self._endpoint_run(payload)
            except Exception as exc:  # its run's facts cannot be read now: try again later
                log.warning("cannot read a message's run (%s); it goes back", first_line(exc))
                ack_or_requeue(message, requeue=True)
                return
            request = TaskRequest(
                id=message.headers["id"], name=self.name, kwargs=payload.model_dump(mode="json")
            )
            if meta is not None:
                self._to_lane(app, message, request, payload, meta)
                return
            self.held.add(message.delivery_tag, payload.run_id)
            try:
                self._to_pool(message, request)
            except Exception as exc:
                self.held.discard(message.delivery_tag)
                log.error("cannot hand a message to the pool (%s); it goes back", first_line(exc))
                ack_or_requeue(message, requeue=True)

        return handle

    def _endpoint_run(self, payload: SampleTask) -> RunMeta | None:
        """The facts of ``payload``'s run if it goes to the endpoint lane: the lane is on and
        the run is on an endpoint model. None for a run that does not exist (the pool's batch
        drops its message); a Redis error is raised (the message goes back, rather than to a
        pool process it could hold)."""
        if self._lane is None:
            return None
        try:
            meta = self._run_facts(payload.run_id)
        except UnknownRunError:
            return None
        return meta if on_endpoint(meta) else None

    def _redis(self) -> Redis:
        if self._client is None:
            self._client = connect(self.redis)
        return self._client

    def _run_facts(self, run_id: str) -> RunMeta:
        """A run's record as it was submitted (its facts never change), read once;
        :class:`UnknownRunError` for a run that does not exist."""
        return self._facts.get_or_create(run_id, lambda: RunStore(self._redis()).get(run_id))

    def _to_lane(
        self,
        app: Celery,
        message: Any,
        request: TaskRequest,
        payload: SampleTask,
        meta: RunMeta,
    ) -> None:
        """Run an endpoint run's message alone in the lane, in a place of its own on the
        worker's prefetch; or, when the lane has no place for its principal, give it back to
        its run's backlog (acknowledged once staged there; requeued if Redis refuses). If it
        cannot be handed to the lane, everything it took is given back and so is the message."""
        lane, reserve = self._lane, self._reserve
        assert lane is not None
        assert reserve is not None
        if not lane.take(meta.principal):
            self._give_back(app, message, payload, meta)
            return
        tag = message.delivery_tag
        self._in_lane.add(tag)
        self.held.add(tag, payload.run_id)
        loan = reserve.lend()

        def done(_seconds: float | None) -> None:
            self._in_lane.discard(tag)
            reserve.repay(loan)

        try:
            self._run(message, request, partial(lane.apply_async, principal=meta.principal), done)
        except Exception as exc:
            self._unlane(tag, meta.principal, done)
            log.error(
                "cannot hand a message to the endpoint lane (%s); it goes back", first_line(exc)
            )
            ack_or_requeue(message, requeue=True)

    def _unlane(self, tag: str, principal: str, done: Callable[[float | None], None]) -> None:
        """Give back what a message took on its way to the lane: its place, its tag, its loan."""
        assert self._lane is not None
        self._lane.release(principal)
        self.held.discard(tag)
        done(None)

    def _give_back(self, app: Celery, message: Any, payload: SampleTask, meta: RunMeta) -> None:
        try:
            if self._returns is None:
                self._returns = (Backlog(self._redis()), Capturer(app))
            backlog, capture = self._returns
            backlog.stage(meta, capture(self.name, [payload]), lane_of(self.name))
        except Exception as exc:
            log.warning(
                "cannot give a message back to its run's backlog (%s); it goes back to its queue",
                first_line(exc),
            )
            ack_or_requeue(message, requeue=True)
            return
        ack_or_requeue(message, requeue=False)

    def close_lane(self) -> None:
        """Take no more endpoint messages and wait for the lane's running jobs, at most the
        time a pool job may take (a warm shutdown, before the connection closes)."""
        if self._lane is not None and (left := self._lane.close(float(self.time_limit or 0))):
            log.warning(
                "%d endpoint job(s) still running at shutdown: their messages go back", left
            )

    def _finished(self, seconds: float | None) -> None:
        """Set the prefetch after a job of ``seconds`` (:mod:`evalq.worker.prefetch`); an error
        here is logged, never raised into Celery's callbacks."""
        if self._reserve is None or seconds is None:
            return
        try:
            self._reserve.finished(seconds)
        except Exception:
            log.exception("could not set the worker's reservation")

    def forget(self) -> int:
        """Forget the messages of a connection that closed that no pool process had started;
        return how many. As the connection closes, Celery's consumer has the pool drop every job
        not yet accepted (``AsynPool.flush``), and such a job's callbacks never run, so nothing
        else would take their tags out of :attr:`held`; the heartbeat would name them held for
        ever, and the janitor would never put back the messages that Redis still holds
        unacknowledged. (Their delivery tags belonged to that connection's channel, which gave
        them back to the queue as it closed, or left them to the janitor.)"""
        stale = list(self._unstarted.values())
        self._unstarted.clear()
        for tag in stale:
            self.held.discard(tag)
        return len(stale)

    def _forward(self, app: Celery, message: Any, payload: SampleTask) -> bool:
        """Move a message of an evaluation this worker does not serve to the queue of that
        evaluation, which only workers serving it consume, if its run is of that evaluation
        (else it is forged or stale: dropped). If Redis refuses, the message goes back.
        Return True when the message is this worker's after all: its run is a registered
        language task's, which every worker serves."""
        queue = evaluation_queue(STAGE_QUEUES[self.name], payload.eval)
        try:
            meta = self._run_facts(payload.run_id)
            owner, language = meta.eval, meta.task is not None
        except UnknownRunError:
            owner, language = None, False
        except Exception as exc:
            log.warning("cannot check a message's run (%s); it goes back", first_line(exc))
            ack_or_requeue(message, requeue=True)
            return False
        if owner == payload.eval and language:
            self._languages.add(payload.eval)  # a registered task's: any worker runs it
            log.info("serving language task %r (its runs carry the task)", payload.eval)
            return True
        if owner != payload.eval:
            log.error(
                "dropping an %s message: its run is not of evaluation %r", self.name, payload.eval
            )
            ack_or_requeue(message, requeue=False)
            return False
        try:
            publish(app, self.name, [payload], queue=queue)
        except Exception as exc:
            log.warning(
                "cannot move a message to %s (%s); it goes back", queue.name, first_line(exc)
            )
            ack_or_requeue(message, requeue=True)
            return False
        ack_or_requeue(message, requeue=False)
        now = time.monotonic()
        if now - self._unserved_logged.get(payload.eval, -UNSERVED_LOG_EVERY) >= UNSERVED_LOG_EVERY:
            self._unserved_logged[payload.eval] = now
            log.warning(
                "this worker does not serve evaluation %r (EVALQ_PLUGINS); its messages go to "
                "queue %r for a worker that does",
                payload.eval,
                queue.name,
            )
        return False

    def _to_pool(self, message: Any, request: TaskRequest) -> None:
        """Run ``request`` as one pool job; when it returns, acknowledge its message if its
        results were stored, else requeue it."""
        self._jobs += 1
        job = self._jobs
        self._unstarted[job] = message.delivery_tag

        def started() -> None:
            self._unstarted.pop(job, None)

        def done(seconds: float | None) -> None:
            started()
            self._finished(seconds)

        try:
            self._run(
                message,
                request,
                partial(self._worker_pool.apply_async, timeout=self.time_limit),
                done,
                started,
            )
        except Exception:
            started()
            raise

    def _run(
        self,
        message: Any,
        request: TaskRequest,
        submit: Callable[..., Any],
        done: Callable[[float | None], None],
        started: Callable[[], None] = lambda: None,
    ) -> None:
        """Hand ``request`` to ``submit`` (a pool's ``apply_async``) as one job, with the
        callbacks that acknowledge or requeue its message as the job returns; ``started`` runs
        as a process (or thread) takes the job, ``done`` after the message was settled, with
        the job's seconds (None if it was lost)."""
        started_at = time.monotonic()
        announce(self._events, self, message, request)

        def finish(requeue: bool) -> None:
            ack_or_requeue(message, requeue)
            self.held.discard(message.delivery_tag)
            if requeue:
                send_event(self._events, self, request, "task-rejected", requeue=True)
            else:
                runtime = time.monotonic() - started_at
                send_event(
                    self._events, self, request, "task-succeeded", result="None", runtime=runtime
                )

        accepted: list[float] = []

        def on_accepted(_pid: int, time_accepted: float) -> None:
            started()
            accepted.append(time_accepted)

        def on_return(requeue: object) -> None:
            # The job returns the ids of the requests to requeue; None means the task raised
            # (run_job logged it): requeue, the per-sample attempt counters bound the retries.
            finish(not isinstance(requeue, list) or request.id in requeue)
            done(time.monotonic() - accepted[0] if accepted else None)

        def on_error(_failure: Any) -> None:
            # run_job catches what the task raises, so an error here means the job itself was
            # lost: requeue.
            finish(requeue=True)
            done(None)

        submit(
            run_job,
            (self, [request]),
            accept_callback=on_accepted,
            callback=on_return,
            error_callback=on_error,
        )
