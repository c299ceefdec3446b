"""The worker's Celery consumer: Celery's own, with a guard around the handler of each task
message, so that no message can stop the worker.

Celery's consumer looks a message's task up by its ``task`` header and hands it to that task's
strategy; an exception on the way (an unhashable task name, a proto-1 body without an id, a
strategy that raises) would otherwise end the worker with "Unrecoverable error", and the
message, never acknowledged, would come back to the next worker and end it too. Here such a
message is logged and dropped; connection errors still go to Celery, which reconnects.

When the connection closes (before Celery reconnects), the batch tasks forget the messages of
that connection that no pool process had started, as Celery's consumer forgets its own:
otherwise the heartbeat would name them held for ever
(:meth:`evalq.worker.batches.SampleBatches.forget`).

As the consumer shuts down (a warm shutdown, once the pool has drained and before the
connection closes), the endpoint lane takes no more messages and its running jobs end, so that
their messages are acknowledged rather than asked again by another worker.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery.worker.consumer import Consumer
from vine import promise

from evalq.shared.errors import first_line
from evalq.worker.batches import SampleBatches

__all__ = ["GuardedConsumer"]

log = logging.getLogger(__name__)


class GuardedConsumer(Consumer):
    """Celery's consumer; a message its task handler cannot take is dropped, not fatal."""

    def create_task_handler(self, promise: Any = promise) -> Callable[[Any], None]:
        handle = super().create_task_handler(promise)
        info: Any = self
        recoverable = tuple(info.connection_errors) + tuple(info.channel_errors)

        def on_task_received(message: Any) -> None:
            try:
                handle(message)
            except recoverable:
                raise
            except Exception as exc:
                log.error("dropping a message: %s: %s", type(exc).__name__, first_line(exc))
                try:
                    message.reject(requeue=False)
                except Exception as again:
                    log.warning("could not drop it: %s", first_line(again))

        return on_task_received

    def shutdown(self) -> None:
        for task in self._batches():
            task.close_lane()
        super().shutdown()

    def _batches(self) -> list[SampleBatches]:
        app: Any = getattr(self, "app", None)
        tasks = app.tasks.values() if app is not None else ()
        return [task for task in tasks if isinstance(task, SampleBatches)]

    def on_close(self) -> None:
        super().on_close()
        for task in self._batches():
            if task.forget():
                log.info("forgot the unstarted %s messages of the closed connection", task.name)
