"""The batch buffer of ``evalq.infer`` and ``evalq.score``: celery-batches', flushed by samples.

Both tasks are celery-batches tasks: the worker buffers incoming messages and runs them as one
call when the buffered messages hold ``EVALQ_MAX_BATCH`` samples, or every ``EVALQ_BATCH_WAIT``
seconds, whichever comes first, or at once when the worker holds all the messages it may reserve
(:mod:`evalq.worker.prefetch`), since none can join the batch before it runs.

What reaches a worker is either buffered or dropped, never a crash and never a requeue loop:
every message passes :func:`evalq.worker.intake.admit` in the main process first; a malformed one is
logged and dropped. A message of an evaluation this worker does not serve (its plugin is not
loaded) is moved to that evaluation's own queue (``infer.<eval>`` / ``score.<eval>``), which
only workers serving it consume: it neither cycles through this worker nor waits for it.

A batch acknowledges only the messages whose results were stored: the batch function returns
the runs whose writes failed (Redis out of memory, a lost connection), and their messages go
back to the queue; a lost pool process requeues all of its messages.

What this module takes from celery-batches (pinned to 0.11.x in ``pyproject.toml``):
``Batches`` and its ``Strategy(task, app, consumer)`` (wrapped, not copied),
``SimpleRequest.from_request``, ``celery_batches.trace.apply_batches_task``,
``celery_batches.consume_queue``, and private names: ``Batches._do_flush()``, called (never
overridden) to flush the buffer early, and the buffer's ``_buffer``, ``_pending`` and flush
timer ``_tref``, emptied when the consumer's connection closes (:meth:`SampleBatches.forget`).
``flush`` is replaced, because the library's own acknowledges every message when the batch
returns, and none when a pool process dies; the pool it submits to is taken from the consumer
here, not from the library's private ``_pool``.

A message of a run on an endpoint model is not buffered: it runs alone in the worker's endpoint
lane (:mod:`evalq.worker.lane`), or goes back to its run's backlog when its principal holds its
share of the lane.
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable, Collection
from functools import partial
from typing import Any

from celery import Celery
from celery.worker.request import Request
from celery_batches import Batches, SimpleRequest, consume_queue
from celery_batches.trace import apply_batches_task
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
from evalq.worker.messages import Held, ack_or_requeue, announce
from evalq.worker.prefetch import Reserve

__all__ = ["SampleBatches"]

log = logging.getLogger(__name__)

UNSERVED_LOG_EVERY = 60.0


class SampleBatches(Batches):  # type: ignore[misc]
    """celery-batches' buffer, flushed by the number of *samples* buffered, not of messages.

    A message may carry one sample or dozens; counting samples makes ``flush_samples`` the
    batch size the model sees, whatever the submitter chose. A ``solo`` message is flushed on
    its own, so if its sample kills the worker process, only its own message is redelivered.

    A message of a run on an endpoint model is not buffered: it runs alone in the worker's
    endpoint lane (:mod:`evalq.worker.lane`), or, when the lane has no place for its principal,
    goes back to its run's backlog.
    """

    abstract = True
    flush_samples = 64
    flush_every = 1 << 30  # the base class's message count never triggers; samples do
    redis = Target("")  # set by register_tasks: where to look a message's run up
    lane_threads = 0
    """Threads of the endpoint lane (``EVALQ_ENDPOINT_THREADS``); 0: endpoint models' messages
    run in the pool as any other."""
    close_thread: Callable[[], None] = staticmethod(lambda: None)
    """Frees the calling thread's worker resources (an endpoint thread's, as it stops)."""

    def __init__(self) -> None:
        super().__init__()
        self._buffered_samples = 0
        self._worker_pool: Any = None
        self._reserve: Reserve | None = None
        self.held = Held()
        self._unserved_logged: dict[str, float] = {}
        self._languages: set[str] = set()
        """Names of registered language tasks this worker has seen runs of: it serves them
        all (a run's record carries its task and model)."""
        self._flushes = 0
        self._unstarted: dict[int, Collection[Request]] = {}
        """Batches handed to the pool that no pool process has started yet, by flush."""
        self._lane: EndpointLane | None = None
        self._laned: queue.SimpleQueue[Request] = queue.SimpleQueue()
        """Where celery-batches puts the request it builds of an endpoint run's message."""
        self._in_lane: set[str] = set()
        """Delivery tags of the messages in the endpoint lane (held, but not the pool's)."""
        self._client: Redis | None = None
        """The main process's Redis client, opened on first use (runs' facts, give-backs)."""
        self._facts: LRU[str, RunMeta] = LRU(256)
        """Recent runs' facts, read once: whose run, of which evaluation, on which model."""
        self._returns: tuple[Backlog, Capturer] | None = None

    def Strategy(self, task: Batches, app: Celery, consumer: Any) -> Callable[..., None]:
        buffer_message = super().Strategy(task, app, consumer)
        buffer = self._buffer  # type: ignore[has-type]  # celery-batches leaves it untyped
        self._buffer = self._laned
        lane_message = super().Strategy(task, app, consumer)  # builds requests into _laned
        self._buffer = buffer
        self._worker_pool = consumer.pool
        self._reserve = Reserve.of(consumer)
        self._reserve.add(self)
        if self.lane_threads:
            self._lane = EndpointLane.of(consumer, self.lane_threads, self.close_thread)
        served = frozenset(registered())

        def handle(message: Any, *args: Any, **kwargs: Any) -> None:
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
            if meta is not None:
                build = partial(lane_message, message, *args, **kwargs)
                self._to_lane(app, message, payload, meta, build)
                return
            self.held.add(message.delivery_tag, payload.run_id)
            try:
                if payload.solo and self._buffered_samples:
                    self._do_flush()  # a solo message runs in a batch (a pool job) of its own
                buffer_message(message, *args, **kwargs)
            except Exception as exc:
                self.held.discard(message.delivery_tag)
                log.error("dropping an %s message: %s", self.name, first_line(exc))
                ack_or_requeue(message, requeue=False)
                return
            self._buffered_samples += len(payload.sample_ids)
            if payload.solo or self._buffered_samples >= self.flush_samples:
                self._do_flush()
            else:
                self._reserve_full()

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
        payload: SampleTask,
        meta: RunMeta,
        build: Callable[[], Any],
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
            build()
            request = self._laned.get_nowait()
        except Exception as exc:  # not a request celery-batches can build: dropped, as a buffer's
            self._unlane(tag, meta.principal, done)
            log.error("dropping an %s message: %s", self.name, first_line(exc))
            ack_or_requeue(message, requeue=False)
            return
        try:
            self._run([request], partial(lane.apply_async, principal=meta.principal), done)
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
                "cannot give a message back to its run's backlog (%s); it goes back to its "
                "queue", first_line(exc)
            )  # fmt: skip
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

    def held_messages(self) -> int:
        """Messages this task holds for its pool: buffered, or in a pool job not yet
        returned (not the endpoint lane's, which hold places of their own)."""
        return sum(1 for tag in self.held.snapshot() if tag not in self._in_lane)

    def flush_buffer(self) -> None:
        """Run the buffered messages now, if any."""
        if self._buffered_samples:
            self._do_flush()

    def _reserve_full(self, batch_seconds: float | None = None) -> None:
        """Set the prefetch after a batch of ``batch_seconds``, then run every buffer of the
        consumer if it holds all it may (:mod:`evalq.worker.prefetch`); an error here is logged,
        never raised into Celery's callbacks."""
        if self._reserve is None:
            return
        try:
            if batch_seconds is not None:
                self._reserve.finished(batch_seconds)
            self._reserve.flush_if_full()
        except Exception:
            log.exception("could not check the worker's reservation")

    def forget(self) -> int:
        """Forget the buffered messages of a connection that closed (Celery's consumer does the
        same with its own queues): their delivery tags belonged to that connection's channel,
        which gave them back to the queue as it closed, or left them to the janitor. Return
        how many. The flush timer went with the consumer's old hub; the next message starts a
        new one.

        So are the messages of the batches that no pool process had started: as the connection
        closes, Celery's consumer has the pool drop every job not yet accepted
        (``AsynPool.flush``), and such a job's callbacks never run, so nothing else would take
        their tags out of :attr:`held`; the heartbeat would name them held for ever, and the
        janitor would never put back the messages that Redis still holds unacknowledged."""
        stale = [*consume_queue(self._buffer), *consume_queue(self._pending)]
        for requests in self._unstarted.values():
            stale.extend(requests)
        self._unstarted.clear()
        for request in stale:
            self.held.discard(request.message.delivery_tag)
        timer: Any = getattr(self, "_tref", None)
        if timer is not None:
            timer.cancel()
        self._tref = None
        self._buffered_samples = 0
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

    def flush(self, requests: Collection[Request]) -> Any:
        """Run the buffered requests as one pool job; when it returns, acknowledge the messages
        whose results were stored and requeue the others.

        Each message is reported to event monitors (Flower) as its own task, with the ids and
        fingerprint its payload carries: received and started when the batch goes to the pool,
        succeeded when it is acknowledged, rejected when it is requeued; celery-batches itself
        sends no task events.

        A job whose pool process dies (killed, out of memory, ``os._exit``, or past
        ``time_limit``) requeues its messages at once, as ``task_reject_on_worker_lost`` does
        for ordinary tasks, instead of leaving them for the visibility timeout. There is
        deliberately no soft limit: its exception would be caught inside the batch and the
        messages acknowledged with their samples unfinished.
        """
        self._buffered_samples = 0  # every buffered request is flushed here, by size or timer
        self._flushes += 1
        job = self._flushes
        self._unstarted[job] = requests

        def started() -> None:
            self._unstarted.pop(job, None)

        def done(seconds: float | None) -> None:
            started()
            self._reserve_full(seconds)

        return self._run(
            requests,
            partial(self._worker_pool.apply_async, timeout=self.time_limit),
            done,
            started,
        )

    def _run(
        self,
        requests: Collection[Request],
        submit: Callable[..., Any],
        done: Callable[[float | None], None],
        started: Callable[[], None] = lambda: None,
    ) -> Any:
        """Hand ``requests`` to ``submit`` (a pool's ``apply_async``) as one batch job, with
        the callbacks that acknowledge or requeue each message as the job returns; ``started``
        runs as a process (or thread) takes the job, ``done`` after every message was
        settled, with the job's seconds (None if it was lost)."""
        batch = ([SimpleRequest.from_request(r) for r in requests],)
        started_at = time.monotonic()
        for request in requests:
            announce(request)

        def finish(request: Request, requeue: bool) -> None:
            ack_or_requeue(request.message, requeue)
            self.held.discard(request.message.delivery_tag)
            if requeue:
                request.send_event("task-rejected", requeue=True)
            else:
                runtime = time.monotonic() - started_at
                request.send_event("task-succeeded", result="None", runtime=runtime)

        accepted: list[float] = []

        def on_accepted(_pid: int, time_accepted: float) -> None:
            started()
            accepted.append(time_accepted)

        def on_return(requeue: object) -> None:
            # The batch function returns the ids of the requests to requeue; anything else
            # means it raised (celery-batches logged it): requeue them all, the per-sample
            # attempt counters bound the retries.
            again = set(requeue) if isinstance(requeue, list) else None
            for request in requests:
                finish(request, again is None or request.id in again)
            done(time.monotonic() - accepted[0] if accepted else None)

        def on_error(_failure: Any) -> None:
            # apply_batches_task catches what the task raises, so an error here means the job
            # itself was lost: requeue.
            for request in requests:
                finish(request, requeue=True)
            done(None)

        return submit(
            apply_batches_task,
            (self, batch, 0, None),
            accept_callback=on_accepted,
            callback=on_return,
            error_callback=on_error,
        )
