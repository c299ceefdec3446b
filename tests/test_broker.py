"""The contract of :mod:`evalq.shared.queue.broker` with the installed kombu, against a real
redis-server: a message is found where the module looks while it waits, once delivered and not
acknowledged, and after it is restored; what the backlogs capture is what kombu delivers."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from importlib.metadata import version
from typing import Any

import pytest
import redis
from celery import Celery
from packaging.specifiers import SpecifierSet

from evalq.producer.operations.redis_server import RedisServer
from evalq.shared.connection import connect
from evalq.shared.models import SampleTask
from evalq.shared.queue.backlog import capture
from evalq.shared.queue.broker import (
    KOMBU_CHECKED,
    Broker,
    carried,
    queue_keys,
    release,
    unacked_count,
)
from evalq.shared.queue.celery_app import INFER_QUEUE, INFER_TASK, create_app
from evalq.shared.queue.sizing import publish
from evalq.shared.settings import Settings


def test_the_installed_kombu_is_one_the_broker_module_was_checked_against() -> None:
    installed = version("kombu")
    assert installed in SpecifierSet(KOMBU_CHECKED), (
        f"kombu {installed} is not in {KOMBU_CHECKED}: check shared/queue/broker.py's "
        "reads of its Redis storage against it (tests/test_broker.py), then widen the range"
    )


def _payload() -> SampleTask:
    return SampleTask(run_id=uuid.uuid4().hex[:16], eval="spy", spec="0" * 64, sample_ids=[3, 4])


@pytest.fixture
def broker(redis_only: RedisServer) -> Iterator[tuple[Broker, Celery, redis.Redis]]:
    app = create_app(Settings(redis_url=redis_only.url))
    client = connect(redis_only.url)
    found = Broker(app, client)
    yield found, app, client
    found.close()
    client.close()


def test_a_message_is_found_waiting_delivered_and_restored(
    broker: tuple[Broker, Celery, redis.Redis],
) -> None:
    found, app, client = broker
    payload = _payload()
    publish(app, INFER_TASK, [payload])
    assert found.waiting() == {payload.run_id: [payload]}
    assert sum(client.llen(key) for key in queue_keys(INFER_QUEUE)) == 1
    with app.connection_for_write() as connection:
        channel: Any = connection.channel()
        message = channel.basic_get(INFER_QUEUE, no_ack=False)
        tag = str(message.delivery_tag)
        assert unacked_count(client) == 1
        assert found.waiting(held={tag}) == {payload.run_id: [payload]}
        assert found.waiting(held=set()) == {}
        assert found.delivered_before(time.time() + 60) == [tag]
        assert found.delivered_before(time.time() - 60) == []

        found.restore(tag)

        assert unacked_count(client) == 0
        assert found.waiting(held=set()) == {payload.run_id: [payload]}
        channel.close()


def test_a_captured_message_is_what_kombu_delivers(
    broker: tuple[Broker, Celery, redis.Redis],
) -> None:
    _, app, client = broker
    payload = _payload()
    (staged,) = capture(app, INFER_TASK, [payload])
    assert staged.queue in queue_keys(INFER_QUEUE)
    assert carried(staged.message) == payload
    client.lpush(staged.queue, staged.message)
    with app.connection_for_write() as connection:
        channel: Any = connection.channel()
        message = channel.basic_get(INFER_QUEUE, no_ack=False)
        assert message.headers["task"] == INFER_TASK
        assert SampleTask.parse(message.decode()[1]) == payload
        message.ack()
        channel.close()


def test_release_frees_the_prefetch_slot_and_leaves_the_message_unacknowledged(
    broker: tuple[Broker, Celery, redis.Redis],
) -> None:
    _, app, client = broker
    publish(app, INFER_TASK, [_payload()])
    with app.connection_for_write() as connection:
        channel: Any = connection.channel()
        channel.basic_qos(0, 1, False)
        message = channel.basic_get(INFER_QUEUE, no_ack=False)
        assert not channel.qos.can_consume()
        release(message)
        assert channel.qos.can_consume()
        assert unacked_count(client) == 1
        channel.qos.restore_unacked_once()
        channel.close()
