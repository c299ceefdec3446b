"""Publishing per-sample work: a few samples of one run per message, many messages per Redis
round trip.

Each message carries sample ids of one run (a sample stays its own unit of work and result; the
message is only how it travels). A run is cut into messages of :func:`message_size` samples:
large enough that a worker's per-message costs (receive, acknowledge, one pool job, its Redis
round trips) are spread over many samples, small enough that a run still spreads over
``MIN_MESSAGES`` messages, so that many workers can share it. kombu's ``Producer.batch``
buffers the broker's LPUSHes in a Redis pipeline.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from celery import Celery
from kombu import Queue

from evalq.shared.models import MAX_MESSAGE_SAMPLES, RunMeta, SampleTask

__all__ = [
    "MESSAGE_SAMPLES",
    "MESSAGE_SECONDS",
    "MIN_MESSAGE_SAMPLES",
    "enqueue",
    "message_size",
    "publish",
    "split",
]

MESSAGE_SAMPLES = 256
"""Most sample ids in one message of a model whose pace is not known yet."""
MESSAGE_SECONDS = 0.25
"""Work one message holds at most, by its model's pace (:mod:`evalq.shared.queue.pace`):
long enough that a message's own costs are a few percent of it, short enough that a run
dispatched now waits little behind the messages workers reserved."""
MIN_MESSAGE_SAMPLES = 64
"""Fewest sample ids in one message (unless the run, or a ``solo`` retry, is smaller): a whole
batch of the default ``EVALQ_MAX_BATCH``, so a worker's two reserved messages are at least two
batches, and what a run arriving now waits behind is no more than that."""
MIN_MESSAGES = 64
"""Messages a run is cut into at least, while its messages stay above the minimum size."""
PIPELINE_SIZE = 1000


def _power_below(value: float) -> int:
    """The largest power of two not above ``value`` (1 below 2)."""
    return 1 << (max(1, int(value)).bit_length() - 1)


def message_size(samples: int, pace: float | None = None) -> int:
    """Samples per message for a run of ``samples`` of a model taking ``pace`` seconds per
    sample (None: not known): the power of two nearest below ``samples / MIN_MESSAGES``,
    within ``[MIN_MESSAGE_SAMPLES, most]``, where ``most`` is what the model does in
    :data:`MESSAGE_SECONDS` (within ``[MIN_MESSAGE_SAMPLES, MAX_MESSAGE_SAMPLES]``), or
    :data:`MESSAGE_SAMPLES` when its pace is not known.

    Powers of two keep a message a whole number of a worker's (usually power-of-two) batches.
    """
    most = MESSAGE_SAMPLES
    if pace is not None and pace > 0:
        most = max(
            MIN_MESSAGE_SAMPLES, _power_below(min(MESSAGE_SECONDS / pace, MAX_MESSAGE_SAMPLES))
        )
    share = _power_below(samples / MIN_MESSAGES)
    return max(MIN_MESSAGE_SAMPLES, min(most, share))


def split(
    meta: RunMeta, sample_ids: Sequence[int], *, size: int = MESSAGE_SAMPLES, solo: bool = False
) -> Iterator[SampleTask]:
    """One payload of ``meta``'s run per ``size`` consecutive sample ids (per sample when
    ``solo``)."""
    step = 1 if solo else size
    for start in range(0, len(sample_ids), step):
        yield SampleTask(
            run_id=meta.run_id,
            eval=meta.eval,
            spec=meta.spec,
            sample_ids=list(sample_ids[start : start + step]),
            solo=solo,
        )


def publish(
    app: Celery, task_name: str, tasks: Iterable[SampleTask], queue: Queue | None = None
) -> int:
    """Send one ``task_name`` message per payload (kwargs = the payload) to the task's queue,
    or to ``queue``; return how many."""
    sent = 0
    with app.producer_or_acquire() as producer, producer.batch(max_size=PIPELINE_SIZE):
        for task in tasks:
            kwargs = task.model_dump(mode="json")
            route: Any = queue  # Celery takes a Queue as well as a queue's name
            app.send_task(task_name, kwargs=kwargs, producer=producer, queue=route)
            sent += 1
    return sent


def enqueue(app: Celery, task_name: str, meta: RunMeta, sample_ids: Sequence[int]) -> int:
    """Send a run's ``sample_ids`` to ``task_name`` in messages of :func:`message_size`
    samples; return how many messages went."""
    size = message_size(len(sample_ids))
    return publish(app, task_name, split(meta, sample_ids, size=size))
