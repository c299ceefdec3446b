"""Publishing per-sample tasks: one message each, many messages per Redis round trip.

kombu's ``Producer.batch`` buffers the broker's LPUSHes in a Redis pipeline, so enqueueing a
hundred thousand samples costs a few hundred round trips instead of a hundred thousand.
"""

from __future__ import annotations

from collections.abc import Iterable

from celery import Celery

from shared.models import SampleTask

__all__ = ["publish"]

PIPELINE_SIZE = 1000


def publish(app: Celery, task_name: str, tasks: Iterable[SampleTask]) -> int:
    """Send one ``task_name`` message per task (kwargs = the payload); return how many."""
    sent = 0
    with app.producer_or_acquire() as producer, producer.batch(max_size=PIPELINE_SIZE):
        for task in tasks:
            app.send_task(task_name, kwargs=task.model_dump(mode="json"), producer=producer)
            sent += 1
    return sent
