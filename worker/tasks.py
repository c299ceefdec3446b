"""The Celery tasks: thin. Each validates its messages and hands a batch to a plain function.

Both tasks are celery-batches tasks: the worker gathers per-sample messages into batches of up
to ``EVALQ_MAX_BATCH`` (or whatever arrived within ``EVALQ_BATCH_WAIT`` seconds) and runs them
as one call. A message that is not a valid payload is logged and dropped, never crash-looped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from celery import Celery
from celery_batches import Batches, SimpleRequest
from pydantic import ValidationError

from shared.celery_app import INFER_TASK, SCORE_TASK
from shared.models import SampleTask
from shared.settings import Settings
from worker.pipeline import Resources, infer_batch, score_batch
from worker.state import WorkerState

__all__ = ["parse_requests", "register_tasks"]

log = logging.getLogger(__name__)


def parse_requests(requests: Sequence[SimpleRequest]) -> list[SampleTask]:
    """The valid payloads among ``requests``; the rest are logged and dropped."""
    tasks: list[SampleTask] = []
    for request in requests:
        try:
            if request.args:
                raise ValueError("positional arguments are not accepted")
            tasks.append(SampleTask.model_validate(request.kwargs))
        except (ValidationError, ValueError, TypeError) as exc:
            reason = str(exc).splitlines()[0]
            log.error("dropping malformed %s message %s: %s", request.name, request.id, reason)
    return tasks


def register_tasks(app: Celery, state: WorkerState, settings: Settings) -> None:
    """Register ``evalq.infer`` and ``evalq.score`` on ``app``."""

    def batch_task(name: str, run: Callable[[Resources, list[SampleTask]], None]) -> None:
        def handle(requests: list[SimpleRequest]) -> None:
            tasks = parse_requests(requests)
            if tasks:
                run(state.get(), tasks)

        handle.__name__ = name.replace(".", "_")
        app.task(  # type: ignore[no-untyped-call]
            base=Batches,
            name=name,
            flush_every=settings.max_batch,
            flush_interval=settings.batch_wait,
            acks_late=True,
        )(handle)

    batch_task(INFER_TASK, infer_batch)
    batch_task(SCORE_TASK, score_batch)
