"""The worker's Celery consumer: Celery's own, with a guard around the handler of each task
message, so that no message can stop the worker.

Celery's consumer looks a message's task up by its ``task`` header and hands it to that task's
strategy; an exception on the way (an unhashable task name, a proto-1 body without an id, a
strategy that raises) would otherwise end the worker with "Unrecoverable error", and the
message, never acknowledged, would come back to the next worker and end it too. Here such a
message is logged and dropped; connection errors still go to Celery, which reconnects.

When the connection closes (before Celery reconnects), the batch buffers forget the messages of
that connection, as Celery's consumer forgets its own: otherwise they would wait in a buffer
whose flush timer is gone, fill the prefetch window, and stop the worker taking any work.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery.worker.consumer import Consumer
from vine import promise

from evalq.shared.errors import first_line
from evalq.worker.buffer import SampleBatches

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

    def on_close(self) -> None:
        super().on_close()
        app: Any = getattr(self, "app", None)
        for task in app.tasks.values() if app is not None else ():
            if isinstance(task, SampleBatches) and task.forget():
                log.info("forgot the buffered %s messages of the closed connection", task.name)
