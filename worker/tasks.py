"""The Celery tasks: thin. Each validates its messages and hands a batch to a plain function.

Both tasks are celery-batches tasks: the worker buffers incoming messages and runs them as one
call when the buffered messages hold ``EVALQ_MAX_BATCH`` samples, or every ``EVALQ_BATCH_WAIT``
seconds, whichever comes first. A message that is not a valid payload is logged and dropped,
never crash-looped.

What this module takes from celery-batches (pinned to 0.11.x in ``pyproject.toml``):
``Batches`` and its ``Strategy(task, app, consumer)`` (wrapped, not copied),
``SimpleRequest.from_request``, ``celery_batches.trace.apply_batches_task``, and one private
name: ``Batches._do_flush()``, called (never overridden) to flush the buffer early. ``flush`` is
replaced, because the library's own acknowledges nothing when a pool process dies; the pool it
submits to is taken from the consumer here, not from the library's private ``_pool``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

from celery import Celery
from celery.worker.request import Request
from celery_batches import Batches, SimpleRequest
from celery_batches.trace import apply_batches_task
from pydantic import ValidationError

from shared.celery_app import INFER_TASK, SCORE_TASK
from shared.errors import first_line
from shared.models import SampleTask
from shared.settings import Settings
from worker.pipeline import Resources, infer_batch, score_batch
from worker.state import WorkerState

__all__ = ["SampleBatches", "parse_requests", "register_tasks"]

log = logging.getLogger(__name__)


def _peek(message: Any) -> tuple[int, bool]:
    """How many sample ids a task message carries (1 if it cannot tell), and whether it is
    a ``solo`` message."""
    try:
        kwargs = message.payload[1]
        ids, solo = kwargs["sample_ids"], kwargs.get("solo") is True
    except (AttributeError, IndexError, KeyError, TypeError, ValueError):
        return 1, False
    return (len(ids) if isinstance(ids, list) and ids else 1), solo


def _announce(request: Request) -> None:
    request.send_event(
        "task-received",
        name=request.name,
        args=request.argsrepr,
        kwargs=request.kwargsrepr,
        root_id=request.root_id,
        parent_id=request.parent_id,
        retries=request.request_dict.get("retries", 0),
        eta=None,
        expires=None,
    )
    request.send_event("task-started")


class SampleBatches(Batches):  # type: ignore[misc]
    """celery-batches' buffer, flushed by the number of *samples* buffered, not of messages.

    A message may carry one sample or dozens; counting samples makes ``flush_samples`` the
    batch size the model sees, whatever the submitter chose. A ``solo`` message is flushed on
    its own, so if its sample kills the worker process, only its own message is redelivered.
    """

    abstract = True
    flush_samples = 64
    flush_every = 1 << 30  # the base class's message count never triggers; samples do

    def __init__(self) -> None:
        super().__init__()
        self._buffered_samples = 0
        self._worker_pool: Any = None

    def Strategy(self, task: Batches, app: Celery, consumer: Any) -> Callable[..., None]:
        buffer_message = super().Strategy(task, app, consumer)
        self._worker_pool = consumer.pool

        def handle(message: Any, *args: Any, **kwargs: Any) -> None:
            samples, solo = _peek(message)
            if solo and self._buffered_samples:
                self._do_flush()  # a solo message runs in a batch (a pool job) of its own
            buffer_message(message, *args, **kwargs)
            self._buffered_samples += samples
            if solo or self._buffered_samples >= self.flush_samples:
                self._do_flush()

        return handle

    def flush(self, requests: Collection[Request]) -> Any:
        """Run the buffered requests as one pool job, acknowledged when it returns.

        Each message is reported to event monitors (Flower) as its own task, with the ids and
        fingerprint its payload carries: received and started when the batch goes to the pool,
        succeeded when it returns, rejected (requeued) when the job is lost; celery-batches
        itself sends no task events.

        Unlike celery-batches' own ``flush``, a job whose pool process dies (killed, out of
        memory, ``os._exit``, or past ``time_limit``) requeues its messages at once, as
        ``task_reject_on_worker_lost`` does for ordinary tasks, instead of leaving them for the
        visibility timeout. There is deliberately no soft limit: its exception would be caught
        inside the batch and the messages acknowledged with their samples unfinished.
        """
        self._buffered_samples = 0  # every buffered request is flushed here, by size or timer
        batch = ([SimpleRequest.from_request(r) for r in requests],)
        started = time.monotonic()
        for request in requests:
            _announce(request)

        def on_return(_result: Any) -> None:
            runtime = time.monotonic() - started
            for request in requests:
                request.acknowledge()
                request.send_event("task-succeeded", result="None", runtime=runtime)

        def on_error(_failure: Any) -> None:
            # apply_batches_task catches what the task raises, so an error here means the job
            # itself was lost: requeue; the per-sample attempt counter bounds the retries.
            for request in requests:
                request.reject(requeue=True)

        return self._worker_pool.apply_async(
            apply_batches_task,
            (self, batch, 0, None),
            callback=on_return,
            error_callback=on_error,
            timeout=self.time_limit,
        )


def parse_requests(requests: Sequence[SimpleRequest]) -> list[SampleTask]:
    """The valid payloads among ``requests``; the rest are logged and dropped."""
    tasks: list[SampleTask] = []
    for request in requests:
        try:
            if request.args:
                raise ValueError("positional arguments are not accepted")
            tasks.append(SampleTask.model_validate(request.kwargs))
        except (ValidationError, ValueError, TypeError) as exc:
            log.error(
                "dropping malformed %s message %s: %s", request.name, request.id, first_line(exc)
            )
    return tasks


def register_tasks(app: Celery, state: WorkerState, settings: Settings) -> None:
    """Register ``evalq.infer`` and ``evalq.score`` on ``app``."""

    def batch_task(name: str, run: Callable[[Resources, list[SampleTask]], None]) -> None:
        def handle(requests: list[SimpleRequest]) -> None:
            tasks = parse_requests(requests)
            if tasks:
                run(state.get(), tasks)

        handle.__name__ = name.replace(".", "_")
        app.task(
            base=SampleBatches,
            name=name,
            flush_samples=settings.max_batch,
            flush_interval=settings.batch_wait,
            time_limit=settings.task_time_limit,
            acks_late=True,
        )(handle)

    batch_task(INFER_TASK, infer_batch)
    batch_task(SCORE_TASK, score_batch)
