"""The Celery tasks: thin. ``evalq.infer`` and ``evalq.score`` hand a message's batch of samples
(:class:`evalq.worker.batches.SampleBatches`) to a plain function, then refill the queues;
``evalq.archive`` archives an ended run or spills a going one."""

from __future__ import annotations

import logging
from array import array
from collections.abc import Callable

from celery import Celery

from evalq.shared.connection import server_time
from evalq.shared.errors import UnknownRunError
from evalq.shared.models import SampleTask
from evalq.shared.names import is_name
from evalq.shared.queue.celery_app import ARCHIVE_TASK, INFER_TASK, SCORE_TASK
from evalq.shared.settings import Settings
from evalq.shared.store.retention import archive_due
from evalq.shared.store.runs import RunStore
from evalq.shared.store.seal import SealOutcome
from evalq.worker.archiver import archive_run, spill_run
from evalq.worker.batch import Resources
from evalq.worker.batches import SampleBatches
from evalq.worker.inference import infer_batch
from evalq.worker.lru import LRU
from evalq.worker.messages import TaskRequest, parse_requests
from evalq.worker.scoring import score_batch
from evalq.worker.state import WorkerState

__all__ = ["register_tasks"]

log = logging.getLogger(__name__)


def register_tasks(app: Celery, state: WorkerState, settings: Settings) -> None:
    """Register ``evalq.infer``, ``evalq.score`` and ``evalq.archive`` on ``app``."""

    def batch_task(name: str, run: Callable[[Resources, list[SampleTask]], set[str]]) -> None:
        def handle(requests: list[TaskRequest]) -> list[str]:
            """Run the batch; return the ids of the requests whose messages must be requeued."""
            tasks = parse_requests(requests)
            requeue = run(state.get(), [task for _, task in tasks]) if tasks else set()
            state.refill()
            return [request_id for request_id, task in tasks if task.run_id in requeue]

        handle.__name__ = name.replace(".", "_")
        app.task(
            base=SampleBatches,
            name=name,
            time_limit=settings.task_time_limit,
            acks_late=True,
            redis=settings.redis,
            lane_threads=settings.endpoint_threads,
            close_thread=state.close,
        )(handle)

    batch_task(INFER_TASK, infer_batch)
    batch_task(SCORE_TASK, score_batch)

    spill_ids: LRU[str, array[int]] = LRU(2)  # a going run's ids, read once per spill it asks for

    @app.task(name=ARCHIVE_TASK, acks_late=True, time_limit=settings.task_time_limit)
    def archive(run_id: object) -> None:
        """Archive an ended run, or spill a going one's complete segments
        (:mod:`evalq.worker.archiver`); a malformed id is logged and dropped. Then refill the
        queues, as a batch does: the message took a place in ``score``, which the dispatcher keeps
        only a batch deep, and a scoring-only worker would otherwise idle until its next
        heartbeat's refill."""
        try:
            archive_or_spill(run_id)
        finally:
            state.refill()

    def archive_or_spill(run_id: object) -> None:
        if not isinstance(run_id, str) or not is_name(run_id):
            log.error("dropped an archive message: not a run id")
            return
        client = state.client()
        try:
            meta = RunStore(client).get(run_id)
        except UnknownRunError:
            log.warning("archive: no run '%s'", run_id)
            return
        if meta.status.active:
            if settings.spill_rows:
                ids = spill_ids.get_or_create(
                    run_id, lambda: array("q", RunStore(client).sample_ids(run_id))
                )
                spill_run(client, run_id, settings.spill_rows, ids)
            return
        if not archive_due(meta, server_time(client), settings):
            log.warning("archive: run %s is not due to be archived; left as it is", run_id)
            return
        done = archive_run(client, run_id)
        if done.sealed is SealOutcome.NOT_ENDED:
            log.warning("archive: run %s is still going; not archived", run_id)
