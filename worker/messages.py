"""A worker's messages as its main process handles them: which it holds unacknowledged
(:class:`Held`, read by the heartbeat), acknowledging or requeueing one, reporting one to event
monitors (Flower) as a task of its own, and the request a pool process receives of one
(:class:`TaskRequest`), read back into a payload."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from celery import Task

from evalq.shared.errors import PayloadError, first_line
from evalq.shared.models import SampleTask
from evalq.shared.queue.broker import release

__all__ = ["Held", "TaskRequest", "ack_or_requeue", "announce", "parse_requests", "send_event"]

log = logging.getLogger(__name__)


class Held:
    """Delivery tags of the messages a worker holds unacknowledged (waiting for a pool process,
    in a running batch, or waiting to go back), and the run of each; read by the heartbeat
    thread."""

    def __init__(self) -> None:
        self._tags: dict[str, str] = {}
        self._lock = threading.Lock()

    def add(self, tag: str, run_id: str) -> None:
        with self._lock:
            self._tags[tag] = run_id

    def discard(self, tag: str) -> None:
        with self._lock:
            self._tags.pop(tag, None)

    def snapshot(self) -> list[str]:
        with self._lock:
            return sorted(self._tags)

    def runs(self) -> set[str]:
        """The runs whose messages are held."""
        with self._lock:
            return set(self._tags.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._tags)


@dataclass(frozen=True)
class TaskRequest:
    """A message's task as a pool process (or an endpoint thread) receives it: picklable."""

    id: str
    """The task id the message carries (its ``id`` header)."""
    name: str
    """The task's name (``evalq.infer``, ``evalq.score``)."""
    kwargs: dict[str, Any]
    """The payload (:class:`evalq.shared.models.SampleTask`'s fields)."""
    args: tuple[Any, ...] = field(default=())
    """Positional arguments: an evalq payload has none."""


def send_event(
    events: Any, task: Task[Any, Any], request: TaskRequest, kind: str, **fields: Any
) -> None:
    """Report ``request`` to event monitors (Flower) as a ``kind`` task event, as Celery's own
    requests do: when the worker's event dispatcher ``events`` is on and ``task`` sends events."""
    if events is not None and events.enabled and task.send_events:
        events.send(kind, uuid=request.id, **fields)


def announce(events: Any, task: Task[Any, Any], message: Any, request: TaskRequest) -> None:
    """Report ``request`` received and started, with what its ``message``'s headers say."""
    headers = message.headers
    send_event(
        events,
        task,
        request,
        "task-received",
        name=request.name,
        args=headers.get("argsrepr"),
        kwargs=headers.get("kwargsrepr"),
        root_id=headers.get("root_id"),
        parent_id=headers.get("parent_id"),
        retries=headers.get("retries", 0),
        eta=None,
        expires=None,
    )
    send_event(events, task, request, "task-started")


def ack_or_requeue(message: Any, requeue: bool) -> bool:
    """Acknowledge a message, or put it back in its queue; False (logged) when Redis refuses.

    A refused message stays in the broker's unacknowledged hash, where the janitor finds it
    (no live worker holds it) and puts it back. Its prefetch slot here is released all the
    same (:func:`evalq.shared.queue.broker.release`, which touches no Redis key): a slot kept
    would stop this worker from taking any more work.
    """
    try:
        if requeue:
            message.reject(requeue=True)
        else:
            message.ack()
    except Exception as exc:
        action = "requeue" if requeue else "acknowledge"
        log.warning("could not %s a message (%s); the janitor restores it", action, first_line(exc))
        release(message)
        return False
    return True


def parse_requests(requests: Sequence[TaskRequest]) -> list[tuple[str, SampleTask]]:
    """(request id, payload) of the valid payloads among ``requests``; the rest are logged and
    dropped (the main process admitted them already: this is the pool's own check)."""
    tasks: list[tuple[str, SampleTask]] = []
    for request in requests:
        try:
            if request.args:
                raise PayloadError("positional arguments are not accepted")
            tasks.append((request.id, SampleTask.parse(request.kwargs).delivered_as(request.id)))
        except (PayloadError, ValueError, TypeError) as exc:
            log.error(
                "dropping malformed %s message %s: %s", request.name, request.id, first_line(exc)
            )
    return tasks
