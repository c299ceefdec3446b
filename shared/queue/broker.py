"""The messages the broker holds, as kombu's Redis transport stores them: waiting ones in one
list per queue (the stage queues ``infer`` and ``score``, and the evaluation queues
``infer.<eval>`` / ``score.<eval>``), delivered-but-unacknowledged ones in the ``unacked``
hash (delivery tag -> ``[message, exchange, routing key]``) with their delivery times in
``unacked_index``.

The janitor reads them to tell samples whose messages were lost from samples whose messages
wait or are being worked on, and puts the messages of workers that are gone back in their
queue with kombu's own ``QoS.restore_by_tag``.
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
from kombu.transport.redis import Channel

from evalq.shared.models import SampleTask
from evalq.shared.queue.celery_app import INFER_QUEUE, SCORE_QUEUE

__all__ = ["Broker", "carried", "queue_names"]

_CHUNK = 1000


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
        for queue in queue_names(self._client):
            start = 0
            while True:
                entries = [str(e) for e in self._client.lrange(queue, start, start + _CHUNK - 1)]
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
