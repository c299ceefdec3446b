"""Publishing per-sample work: a few samples of one run per message, many messages per Redis
round trip.

Each message carries at most ``MESSAGE_SAMPLES`` sample ids of one run (a sample stays its own
unit of work and result; the message is only how it travels). kombu's ``Producer.batch``
buffers the broker's LPUSHes in a Redis pipeline.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from celery import Celery

from shared.models import SampleTask

__all__ = ["MESSAGE_SAMPLES", "publish", "split"]

MESSAGE_SAMPLES = 64
PIPELINE_SIZE = 1000


def split(
    run_id: str,
    eval_name: str,
    spec: str,
    sample_ids: Sequence[int],
    size: int = MESSAGE_SAMPLES,
    solo: bool = False,
) -> Iterator[SampleTask]:
    """One payload per ``size`` consecutive sample ids (per sample when ``solo``)."""
    step = 1 if solo else size
    for start in range(0, len(sample_ids), step):
        chunk = list(sample_ids[start : start + step])
        yield SampleTask(run_id=run_id, eval=eval_name, spec=spec, sample_ids=chunk, solo=solo)


def publish(app: Celery, task_name: str, tasks: Iterable[SampleTask]) -> int:
    """Send one ``task_name`` message per payload (kwargs = the payload); return how many."""
    sent = 0
    with app.producer_or_acquire() as producer, producer.batch(max_size=PIPELINE_SIZE):
        for task in tasks:
            app.send_task(task_name, kwargs=task.model_dump(mode="json"), producer=producer)
            sent += 1
    return sent
