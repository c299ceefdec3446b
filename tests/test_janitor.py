"""The janitor in-process, against a real redis-server and kombu's real Redis transport (no
worker): lost samples are sent again and waiting ones are not, messages of gone workers go
back to their queue and held ones stay, and a run whose finalizer died gets finished."""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from evalq.producer.operations.redis_server import RedisServer
from evalq.shared.keys import ACTIVE, AUDIT, RUNS, RunKeys
from evalq.shared.models import RunMeta, RunStatus
from evalq.shared.queue.backlog import SCORE_LANE, Backlog, capture
from evalq.shared.queue.broker import Broker, carried
from evalq.shared.queue.celery_app import (
    ARCHIVE_TASK,
    INFER_QUEUE,
    INFER_TASK,
    SCORE_QUEUE,
    SCORE_TASK,
    create_app,
)
from evalq.shared.queue.sizing import publish, split
from evalq.shared.settings import Settings
from evalq.shared.store.presence import Presence, WorkerBeat
from evalq.shared.store.retention import retain
from evalq.worker.archiver import spill_run
from evalq.worker.janitor import Janitor
from evalq.worker.scoring import score_batch
from tests.helpers import labelled_rows, wait_for
from tests.test_batch import Bench, bench, server, task  # noqa: F401 - fixtures

pytestmark = pytest.mark.integration

STALL = 0.05


@pytest.fixture
def janitor(bench: Bench, server: RedisServer) -> Iterator[tuple[Janitor, Celery]]:  # noqa: F811
    """A janitor that counts a run stalled after 50 ms and a worker gone after 50 ms; the
    broker's queues and the worklist start empty."""
    bench.client.delete(INFER_QUEUE, SCORE_QUEUE, "unacked", "unacked_index", ACTIVE)
    settings = Settings(redis_url=server.url, stall_after=STALL, heartbeat_interval=0.01)
    app = create_app(settings)
    broker = Broker(app, bench.client)
    yield Janitor(bench.client, broker, app, settings), app
    broker.close()


@contextmanager
def _sweeper(on: Bench, app: Celery, settings: Settings) -> Iterator[Janitor]:
    """A janitor with settings of its own, on the fixture's app."""
    broker = Broker(app, on.client)
    try:
        yield Janitor(on.client, broker, app, settings)
    finally:
        broker.close()


def _queued(on: Bench, queue: str) -> list[int]:
    tasks = [carried(str(raw)) for raw in on.client.lrange(queue, 0, -1)]
    return sorted(i for t in tasks if t is not None for i in t.sample_ids)


def _backlogged(on: Bench, meta: RunMeta) -> list[int]:
    tasks = [carried(raw) for raw in Backlog(on.client).messages(meta.run_id)]
    return sorted(i for t in tasks if t is not None for i in t.sample_ids)


def _idle(on: Bench, meta: RunMeta) -> None:
    progress = on.res.reader.progress
    wait_for(lambda: time.time() - (progress(meta.run_id).touched or meta.created) > STALL)


def test_lost_samples_are_sent_again_and_waiting_ones_are_not(
    bench: Bench,  # noqa: F811
    janitor: tuple[Janitor, Celery],
) -> None:
    sweeper, app = janitor
    meta = bench.run("spy", labelled_rows(20))
    results, writer = bench.res.reader, bench.res.writer
    writer.record_outputs(meta.run_id, {i: "{}" for i in range(10)})
    writer.record_scores(meta.run_id, {i: {"m": 1.0} for i in range(5)})
    publish(app, INFER_TASK, split(meta, list(range(10, 15))))  # waiting in the queue
    forged = task(meta, list(range(15, 20))).model_copy(update={"eval": "nope"})
    publish(app, INFER_TASK, [forged])  # a worker drops it: it carries nothing of the run
    bench.client.sadd(ACTIVE, "bogus")
    bench.client.hset("evalq:{bogus}:meta", "foo", "bar")  # an unreadable run record
    _idle(bench, meta)

    swept = sweeper.sweep()

    assert swept.resent == {meta.run_id: 10}
    assert _queued(bench, SCORE_QUEUE) == list(range(5, 10))  # output stored: scoring
    # 10-14 once, as queued before; 15-19 twice: the forged message, and the resent one, which
    # went through the run's backlog to the queue's head (what was just staged moves at once)
    assert _queued(bench, INFER_QUEUE) == [*range(10, 15), *sorted(2 * list(range(15, 20)))]
    assert _backlogged(bench, meta) == []
    assert str(bench.client.lindex(INFER_QUEUE, -1)).find(meta.run_id) > 0  # the head
    assert results.progress(meta.run_id).recovered == 10
    assert sweeper.sweep().resent == {}  # just sent: not stalled again yet


def test_samples_whose_scoring_waits_in_a_score_backlog_are_not_sent_again(
    bench: Bench,  # noqa: F811
    janitor: tuple[Janitor, Celery],
) -> None:
    """An inference-only worker staged the scoring of a stalled run's inferred samples: they
    wait their turn in the score backlog, so the janitor sends none of them again, and a
    scoring worker's refill hands them to ``score``."""
    sweeper, app = janitor
    meta = bench.run("spy", labelled_rows(10))
    bench.res.writer.record_outputs(meta.run_id, {i: "{}" for i in range(10)})
    backlog = Backlog(bench.client)
    staged = capture(app, SCORE_TASK, split(meta, list(range(10))))
    assert backlog.stage(meta, staged, SCORE_LANE) == 10  # staged, no refill: not dispatched
    _idle(bench, meta)

    assert sweeper.sweep().resent == {}
    assert _backlogged(bench, meta) == list(range(10))
    assert backlog.refill(1, [SCORE_QUEUE]) == 1
    assert _queued(bench, SCORE_QUEUE) == list(range(10))
    assert _backlogged(bench, meta) == []


def test_messages_of_gone_workers_go_back_and_held_ones_stay(
    bench: Bench,  # noqa: F811
    janitor: tuple[Janitor, Celery],
) -> None:
    sweeper, app = janitor
    meta = bench.run("spy", labelled_rows(4))
    publish(app, INFER_TASK, [task(meta, [0, 1]), task(meta, [2, 3])])
    with app.connection_for_write() as connection:
        channel: Any = connection.channel()
        taken = [channel.basic_get(INFER_QUEUE, no_ack=False) for _ in range(2)]
        tags = [str(message.delivery_tag) for message in taken]
        assert bench.client.llen(INFER_QUEUE) == 0
        beat = WorkerBeat(hostname="w1", pid=1, evaluations=["spy"], queues=["infer"])
        Presence(bench.client).beat(beat.model_copy(update={"held": tags[:1]}), interval=10)
        wait_for(
            lambda: time.time() - float(bench.client.zscore("unacked_index", tags[1]) or 0) > 0.05
        )

        swept = sweeper.sweep()

        assert swept.restored == 1
        assert bench.client.hkeys("unacked") == tags[:1]
        assert _queued(bench, INFER_QUEUE) == [2, 3]
        # give back what the channel holds while its connections are open: kombu's close
        # restores it after closing them, on a connection it never closes
        channel.qos.restore_unacked_once()
        channel.close()


def test_a_run_whose_finalizer_died_is_finished(
    bench: Bench,  # noqa: F811
    janitor: tuple[Janitor, Celery],
) -> None:
    sweeper, _ = janitor
    meta = bench.run("spy", labelled_rows(5))
    results, writer = bench.res.reader, bench.res.writer
    writer.record_outputs(meta.run_id, {i: '{"pred": 0}' for i in range(5)})
    # the finalizer claims the run, then dies before aggregate() returns
    assert writer.record_scores(meta.run_id, {i: {"correct": 1.0} for i in range(5)}).finalize
    score_batch(bench.res, [task(meta, [0])])  # a redelivery: the claim is young, it waits
    assert bench.status(meta) is RunStatus.RUNNING
    _idle(bench, meta)

    swept = sweeper.sweep()

    assert swept.nudged == [meta.run_id]
    (nudge,) = [carried(str(raw)) for raw in bench.client.lrange(SCORE_QUEUE, 0, -1)]
    assert nudge is not None
    patient = dataclasses.replace(bench.res, stall_after=STALL)
    assert score_batch(patient, [nudge]) == set()
    assert bench.status(meta) is RunStatus.COMPLETED
    assert results.aggregate(meta.run_id) == {"correct": 1.0}
    # ended: the next sweep sends it to be archived, and keeps it until it is sealed
    assert sweeper.sweep().archiving == [meta.run_id]
    assert sweeper.sweep().archiving == []  # sent lately: not again
    assert meta.run_id in bench.res.runs.active()


def test_a_lease_held_by_a_name_without_a_heartbeat_is_taken_over(
    bench: Bench,  # noqa: F811
    janitor: tuple[Janitor, Celery],
) -> None:
    presence = Presence(bench.client)
    one, two = (f"{name}-{uuid.uuid4().hex[:6]}" for name in ("one", "two"))
    bench.client.set("evalq:janitor", "evil@nowhere")  # by hand, without an expiry
    assert presence.lead(one, lease=10)
    assert presence.lead(two, lease=10)  # one holds it, but one has no heartbeat either
    presence.beat(WorkerBeat(hostname=two, pid=1, evaluations=[], queues=[]), interval=10)
    assert not presence.lead(one, lease=10)  # a live holder keeps it
    assert presence.lead(two, lease=10)


def test_retention_purges_old_runs_and_trims_old_audit_entries_only(
    bench: Bench,  # noqa: F811
    janitor: tuple[Janitor, Celery],
    server: RedisServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    """``EVALQ_KEEP_RUNS_DAYS`` and ``EVALQ_AUDIT_DAYS``: a run submitted longer ago than the
    first goes whole (audited), a younger one and a going one stay; audit entries older than the
    second go, younger ones stay. The janitor leaves both alone: it is the operator's."""
    _, app = janitor
    settings = Settings(
        redis_url=server.url, stall_after=STALL, keep_runs_days=30, audit_days=365,
        archive_url=str(tmp_path / "archive"),
    )  # fmt: skip
    old, young, going = (bench.run("spy", labelled_rows(4)) for _ in range(3))
    for meta in (old, young):
        bench.client.hset(RunKeys(meta.run_id).meta, "status", "completed")
    month = 31 * 86400
    bench.client.zadd(RUNS, {old.run_id: time.time() - month, going.run_id: time.time() - month})
    stale_id = f"{int((time.time() - 400 * 86400) * 1000)}-0"
    bench.client.xadd(AUDIT, {"action": "stale"}, id=stale_id)
    bench.client.xadd(AUDIT, {"action": "fresh"})

    with _sweeper(bench, app, settings) as sweeper:
        sweeper.sweep()
    assert bench.client.exists(RunKeys(old.run_id).meta) == 1
    assert len(bench.client.xrange(AUDIT)) == 2  # type: ignore[arg-type]
    done = retain(bench.client, settings, who="janitor")

    assert done.purged == [old.run_id]
    assert bench.client.exists(RunKeys(old.run_id).meta) == 0
    assert bench.client.zscore(RUNS, old.run_id) is None
    assert bench.client.exists(RunKeys(young.run_id).meta, RunKeys(going.run_id).meta) == 2
    entries: Any = bench.client.xrange(AUDIT)
    assert [e["action"] for _, e in entries] == ["fresh", "purge"]
    assert (entries[1][1]["who"], entries[1][1]["run"]) == ("janitor", old.run_id)


def test_the_janitor_asks_for_the_spill_a_late_sample_made_possible(
    bench: Bench,  # noqa: F811
    janitor: tuple[Janitor, Celery],
    server: RedisServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Workers ask for a spill only when a write takes the settled count past a multiple of a
    segment: with each segment's first sample settling last, none of their asks finds a
    complete segment, and the last writes cross nothing. The janitor asks (once per
    EVALQ_STALL_AFTER), and the spill it asks for moves every complete segment."""
    _, app = janitor
    settings = Settings(redis_url=server.url, stall_after=60, spill_rows=16)
    meta = bench.run("spy", labelled_rows(80))  # 70..79 are in flight throughout
    writer, late = bench.res.writer, [0, 16, 32, 48]
    writer.record_outputs(meta.run_id, {i: "{}" for i in range(70)})
    for i in (i for i in range(70) if i not in late):
        if writer.record_scores(meta.run_id, {i: {"m": 1.0}}).filled(16):
            assert spill_run(bench.client, meta.run_id, 16) == 0
    assert not writer.record_scores(meta.run_id, {i: {"m": 1.0} for i in late}).filled(16)
    bench.client.delete(SCORE_QUEUE)
    with _sweeper(bench, app, settings) as sweeper:
        assert sweeper.sweep().spilling == [meta.run_id]
        assert sweeper.sweep().spilling == []  # asked lately
    (raw,) = bench.client.lrange(SCORE_QUEUE, 0, -1)
    message = json.loads(raw)
    assert message["headers"]["task"] == ARCHIVE_TASK
    assert message["headers"]["argsrepr"] == repr([meta.run_id])
    assert spill_run(bench.client, meta.run_id, 16) == 4
