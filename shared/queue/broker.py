"""kombu's Redis transport's storage: the one module that reads it, or relies on its internals.

Checked against kombu :data:`KOMBU_CHECKED` (``pyproject.toml`` pins the same range; the
contract tests in ``tests/test_broker.py`` run against the installed kombu and a real Redis).
What is relied on, beyond kombu's public API:

- a waiting message is the JSON envelope kombu pushed, in one list per queue and priority step
  (:func:`queue_keys`: the stage queues ``infer`` and ``score``, and the evaluation queues
  ``infer.<eval>`` / ``score.<eval>``; priority ``p > 0`` in ``<queue>\x06\x16<p>``, kombu's
  ``Channel.sep`` and ``PRIORITY_STEPS``);
- a delivered, unacknowledged message is in the hash ``Channel.unacked_key`` (delivery tag ->
  ``[envelope, exchange, routing key]``), with its delivery time in ``unacked_index_key``;
- the Redis channel's ``_put`` pushes what ``_q_for_pri`` and ``_get_message_priority`` name
  (:class:`CapturingTransport` keeps it instead, for the runs' backlogs);
- ``kombu.transport.virtual.QoS.ack`` frees a prefetch slot without touching Redis
  (:func:`release`).

The janitor reads the queues and the hash to tell samples whose messages were lost from samples
whose messages wait or are being worked on, and puts the messages of workers that are gone back
in their queue with kombu's own ``QoS.restore_by_tag``; the metrics count them.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections import defaultdict
from collections.abc import Container, Iterator
from typing import Any

import redis
from celery import Celery
from kombu import Connection
from kombu.transport.redis import PRIORITY_STEPS, Channel
from kombu.transport.redis import Transport as RedisTransport
from kombu.transport.virtual import QoS as VirtualQoS
from kombu.utils.json import dumps

from evalq.shared.models import SampleTask
from evalq.shared.queue.celery_app import INFER_QUEUE, SCORE_QUEUE

__all__ = [
    "CONTROL_PATTERNS",
    "KOMBU_CHECKED",
    "QUEUE_PATTERNS",
    "UNACKED_MUTEX",
    "Broker",
    "CapturingChannel",
    "CapturingTransport",
    "carried",
    "queue_keys",
    "queue_names",
    "release",
    "unacked_count",
]

KOMBU_CHECKED = ">=5.7,<5.8"
"""The kombu versions whose Redis storage this module was checked against."""

QUEUE_PATTERNS = (f"{INFER_QUEUE}*", f"{SCORE_QUEUE}*", f"{Channel.unacked_key}*")
"""Key patterns of the transport's storage: a list per queue, evaluation queue and priority step
(``infer``, ``infer.topic``, ``infer\x06\x163``, ...), the unacked hash, its index and mutex
(what Redis ACLs grant: :mod:`evalq.producer.operations.acl`)."""
UNACKED_MUTEX = Channel.unacked_mutex_key
"""The lock every consumer takes to restore unacknowledged messages (Flower's inspection
replies included)."""
CONTROL_PATTERNS = (f"{Channel.keyprefix_queue.split('.')[0]}.*", "*.pidbox*", "celeryev*")
"""Exchange bindings, the pidbox queues of remote control, the event receivers of gossip and
Flower. ``*.pidbox*`` matches no evalq key: no evalq name holds a ``.``."""
_CHUNK = 1000


def queue_keys(queue: str) -> list[str]:
    """The lists that hold ``queue``'s waiting messages, one per priority step."""
    return [queue if p == 0 else f"{queue}{Channel.sep}{p}" for p in PRIORITY_STEPS]


def unacked_count(client: redis.Redis) -> int:
    """Messages delivered to a consumer and not acknowledged yet."""
    return int(client.hlen(Channel.unacked_key))


def release(message: Any) -> None:
    """Free the prefetch slot of ``message`` in its channel's bookkeeping, without Redis (its
    acknowledgement was refused: it stays in the unacknowledged hash for the janitor)."""
    qos = getattr(message.channel, "qos", None)
    if isinstance(qos, VirtualQoS):
        VirtualQoS.ack(qos, message.delivery_tag)


class CapturingChannel(Channel):
    """kombu's Redis channel, except that a published message is kept here instead of being
    pushed to its queue: the same routing, serialization and envelope, the Redis commands
    left to the caller."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.captured: list[tuple[str, str]] = []

    def _put(self, queue: str, message: dict[str, Any], **_: Any) -> None:
        kombu: Any = self  # kombu's type stubs leave out the Redis channel's helpers
        priority = kombu._get_message_priority(message, reverse=False)
        self.captured.append((kombu._q_for_pri(queue, priority), dumps(message)))


class CapturingTransport(RedisTransport):
    """kombu's Redis transport whose channels keep what they publish (``channel.captured``:
    ``(list key, envelope)`` pairs, oldest first) instead of pushing it."""

    Channel = CapturingChannel


def queue_names(client: redis.Redis) -> list[str]:
    """The stage queues, then every evaluation queue (``infer.<eval>``, ...) that holds
    messages (kombu deletes an empty list's key)."""
    named = [INFER_QUEUE, SCORE_QUEUE]
    for stage in (INFER_QUEUE, SCORE_QUEUE):
        found = client.scan_iter(match=f"{stage}.*", count=_CHUNK, _type="list")
        named.extend(sorted(k for k in map(str, found) if Channel.sep not in k))
    return named


def carried(raw: str) -> SampleTask | None:
    """The evalq payload of one stored message (a queue entry or an ``unacked`` value), or
    None when it carries none."""
    try:
        message: Any = json.loads(raw)
        if isinstance(message, list):  # unacked: [message, exchange, routing key]
            message = message[0]
        body = message["body"]
        if message.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        _, kwargs, _ = json.loads(body)
        return SampleTask.parse(kwargs)
    except (ValueError, KeyError, TypeError, IndexError, AttributeError, binascii.Error):
        return None  # binascii.Error and pydantic's ValidationError are ValueErrors too


class Broker:
    """Reads the broker's queues and unacknowledged messages; restores messages by tag."""

    def __init__(self, app: Celery, client: redis.Redis) -> None:
        self._app = app
        self._client = client
        self._connection: Connection | None = None

    def _channel(self) -> Any:
        if self._connection is None:
            self._connection = self._app.connection_for_write()
        return self._connection.default_channel

    def delivered_before(self, cutoff: float) -> list[str]:
        """Tags of the unacknowledged messages delivered before ``cutoff`` (Unix time)."""
        key = self._channel().unacked_index_key
        return [str(tag) for tag in self._client.zrangebyscore(key, "-inf", cutoff)]

    def restore(self, tag: str) -> None:
        """Put an unacknowledged message back at the head of its queue (nothing if it was
        acknowledged meanwhile)."""
        self._channel().qos.restore_by_tag(tag, leftmost=False)

    def waiting(self, held: Container[str] | None = None) -> dict[str, list[SampleTask]]:
        """Run id -> the payloads of the queued and unacknowledged messages naming that run
        (of the unacknowledged, only those whose tags are in ``held``, when given: the ones a
        live worker holds)."""
        found: dict[str, list[SampleTask]] = defaultdict(list)
        for raw in self._stored(held):
            payload = carried(raw)
            if payload is not None:
                found[payload.run_id].append(payload)
        return found

    def _stored(self, held: Container[str] | None) -> Iterator[str]:
        for key in (k for queue in queue_names(self._client) for k in queue_keys(queue)):
            start = 0
            while True:
                entries = [str(e) for e in self._client.lrange(key, start, start + _CHUNK - 1)]
                yield from entries
                if len(entries) < _CHUNK:
                    break
                start += _CHUNK
        for tag, raw in self._client.hscan_iter(self._channel().unacked_key, count=_CHUNK):
            if held is None or str(tag) in held:
                yield str(raw)

    def close(self) -> None:
        """Release the broker connection."""
        if self._connection is not None:
            self._connection.release()
            self._connection = None
