"""The Celery app factory shared by producer and workers: JSON only, late acks, two queues."""

from __future__ import annotations

from celery import Celery
from kombu import Exchange, Queue

from evalq.shared.connection import is_sentinel
from evalq.shared.errors import InputError
from evalq.shared.queue.sizing import MIN_MESSAGE_SAMPLES
from evalq.shared.settings import Settings

__all__ = [
    "ARCHIVE_TASK",
    "INFER_QUEUE",
    "INFER_TASK",
    "SCORE_QUEUE",
    "SCORE_TASK",
    "STAGE_QUEUES",
    "create_app",
    "evaluation_queue",
    "send_archive",
]

INFER_TASK = "evalq.infer"
SCORE_TASK = "evalq.score"
ARCHIVE_TASK = "evalq.archive"
"""Archive an ended run, or spill a going one (:mod:`evalq.worker.archiver`); goes to the ``score``
queue."""
INFER_QUEUE = "infer"
SCORE_QUEUE = "score"
STAGE_QUEUES = {INFER_TASK: INFER_QUEUE, SCORE_TASK: SCORE_QUEUE}
"""The shared queue of each task: every worker of that stage consumes it."""
BROKER_SOCKET_TIMEOUT = 30.0
"""Seconds a broker command waits for Redis's reply (or a connection to open) before it
fails and the connection is made again."""


def _queue(name: str) -> Queue:
    # Each queue has its own direct exchange: a message published by exchange and routing key
    # (not only by queue name, as Celery does) reaches one queue, not several.
    return Queue(name, Exchange(name, type="direct"), routing_key=name)


def evaluation_queue(stage: str, evaluation: str) -> Queue:
    """``<stage>.<evaluation>``: where a message of ``evaluation`` waits for a worker that
    serves it. Only such workers consume it; a worker that takes a message of an evaluation it
    does not serve from the shared ``stage`` queue moves it here."""
    return _queue(f"{stage}.{evaluation}")


def create_app(settings: Settings) -> Celery:
    """A Celery app configured for evalq; tasks are registered by the worker side."""
    app = Celery("evalq", broker=settings.broker, set_as_current=False)
    app.conf.update(
        # JSON in, JSON out: a message can never make a worker unpickle or import anything.
        task_serializer="json",
        result_serializer="json",
        event_serializer="json",
        accept_content=["json"],
        # Results live in evalq's own store, written idempotently per sample.
        task_ignore_result=True,
        # Ack after the work is stored, and requeue if the process running it dies, so a crash
        # never loses a sample (duplicates are harmless: every write is HSETNX).
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_queues=(_queue(INFER_QUEUE), _queue(SCORE_QUEUE)),
        task_default_queue=INFER_QUEUE,
        task_routes={
            INFER_TASK: {"queue": INFER_QUEUE},
            SCORE_TASK: {"queue": SCORE_QUEUE},
            ARCHIVE_TASK: {"queue": SCORE_QUEUE},
        },
        # Batches gather prefetched messages: a process holds enough messages for two full
        # batches even of the smallest messages, and no more, so that workers share a run's
        # messages instead of one worker reserving them all, and a run the fair dispatcher
        # hands out now waits behind at most that much reserved work (two messages by default).
        worker_prefetch_multiplier=max(2, 2 * settings.max_batch // MIN_MESSAGE_SAMPLES),
        # A message a dead worker had taken comes back to the queue once it has been invisible
        # for visibility_timeout seconds; sweep for such messages often enough to notice.
        broker_transport_options={
            "visibility_timeout": settings.visibility_timeout,
            "unacked_restore_interval": max(1, min(10, settings.visibility_timeout // 5)),
            "unacked_restore_throttle": 1,
            # A connection that dies without a reset reaching the worker (a partition that
            # drops packets, a NAT or firewall that forgets it) would leave a synchronous
            # command (an event's PUBLISH, an ack) waiting for its reply for ever, and the
            # worker's event loop with it; kombu's default is no timeout. Time out instead:
            # Celery then reconnects.
            "socket_timeout": BROKER_SOCKET_TIMEOUT,
            "socket_connect_timeout": BROKER_SOCKET_TIMEOUT,
        },
        # If the broker connection drops, work in flight cannot be acked any more and will be
        # redelivered: cancel it rather than finish it twice.
        worker_cancel_long_running_tasks_on_connection_loss=True,
        # Keep reconnecting through a broker restart instead of exiting; an error Redis answers
        # with (out of memory, a script or ACL refusal) restarts the consumer the same way
        # instead of ending the worker with "Unrecoverable error".
        broker_channel_error_retry=True,
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,
        # Task events (on by default), so Flower and `celery events` can watch tasks.
        worker_send_task_events=settings.task_events,
        worker_hijack_root_logger=False,
    )
    if is_sentinel(settings.broker):
        # kombu's Sentinel transport: the master's name, and the sentinels asked within the
        # same time limit as the master
        app.conf.broker_transport_options |= {
            "master_name": settings.broker_target.master or _no_master(),
            "sentinel_kwargs": {
                "socket_timeout": BROKER_SOCKET_TIMEOUT,
                "socket_connect_timeout": BROKER_SOCKET_TIMEOUT,
            },
        }
    return app


def _no_master() -> str:
    raise InputError(
        "the broker URL names sentinels: set EVALQ_REDIS_SENTINEL_MASTER to the name of the "
        "master they watch"
    )


def send_archive(app: Celery, run_id: str) -> None:
    """Ask a worker to archive the ended run ``run_id``, or spill it while it goes."""
    app.send_task(ARCHIVE_TASK, args=[run_id], queue=SCORE_QUEUE)
