"""How work travels for throughput: message sizes, what one worker reserves, how its pool is
fed, and the heap settings of its pool processes."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kombu.transport.redis import Channel

from evalq.producer.operations.redis_server import RedisServer
from evalq.producer.operations.workers import LocalWorkers
from evalq.producer.service.client import Client
from evalq.producer.service.submit import SubmitRequest, submit
from evalq.shared.connection import connect
from evalq.shared.evaluation import model_key
from evalq.shared.keys import FAIR
from evalq.shared.models import MAX_MESSAGE_SAMPLES
from evalq.shared.queue.backlog import Backlog
from evalq.shared.queue.celery_app import INFER_QUEUE
from evalq.shared.queue.pace import Pace, PaceMeter
from evalq.shared.queue.sizing import (
    MESSAGE_SAMPLES,
    MESSAGE_SECONDS,
    MIN_MESSAGE_SAMPLES,
    MIN_MESSAGES,
    message_size,
)
from evalq.shared.settings import Settings
from evalq.shared.store.reader import ResultReader
from tests.conftest import Stack
from tests.helpers import (
    REPO,
    cli_env,
    labelled_rows,
    list_splits,
    wait_completed,
    wait_for,
    write_rows,
)
from tests.plugins import CHURN_MIB


@pytest.mark.parametrize("samples", [1, 15, 100, 511, 512, 1000, 4096, 8191, 8192, 10**6])
def test_message_sizes_spread_a_run_and_stay_whole_powers_of_two(samples: int) -> None:
    size = message_size(samples)
    messages = -(-samples // size)
    assert MIN_MESSAGE_SAMPLES <= size <= MESSAGE_SAMPLES
    assert size & (size - 1) == 0  # a power of two: whole batches of 16, 32, 64...
    if samples >= MIN_MESSAGES * MIN_MESSAGE_SAMPLES:
        # big enough to spread: at least MIN_MESSAGES messages, each as large as that allows
        assert messages >= MIN_MESSAGES
        assert size == MESSAGE_SAMPLES or 2 * size * MIN_MESSAGES > samples
    else:
        assert size == MIN_MESSAGE_SAMPLES


@pytest.mark.parametrize(
    ("pace", "most"),
    [
        (None, MESSAGE_SAMPLES),  # not measured yet
        (1e-6, MAX_MESSAGE_SAMPLES),  # a null model: as large as a message may be
        (MESSAGE_SECONDS / 300, 256),
        (1.0, MIN_MESSAGE_SAMPLES),  # a generative model
        (0.0, MESSAGE_SAMPLES),
        (-1.0, MESSAGE_SAMPLES),
        (5e-324, MAX_MESSAGE_SAMPLES),  # MESSAGE_SECONDS / pace is inf: still a size
        (float("inf"), MIN_MESSAGE_SAMPLES),
        (float("nan"), MESSAGE_SAMPLES),
    ],
)
def test_a_model_s_pace_sizes_its_big_runs_messages(pace: float | None, most: int) -> None:
    assert message_size(10**6, pace) == most
    assert message_size(100, pace) == MIN_MESSAGE_SAMPLES  # a small run still spreads


def test_a_worker_writes_each_model_s_pace_at_most_every_few_seconds(
    redis_only: RedisServer,
) -> None:
    client = connect(redis_only.url)
    pace, now = Pace(client), [100.0]
    meter = PaceMeter(pace, every=5.0, clock=lambda: now[0])
    meter.add({"a": 300, "b": 100}, 0.4)  # the first: written at once, time shared by samples
    assert [pace.of("a"), pace.of("b")] == pytest.approx([0.001, 0.001])
    meter.add({"a": 100}, 1.0)
    now[0] += 4.9
    meter.add({"a": 100}, 1.0)
    assert pace.of("a") == pytest.approx(0.001)  # within five seconds of the last write
    now[0] += 0.2
    meter.add({"a": 200}, 1.0)
    assert pace.of("a") == pytest.approx(3.0 / 400)  # the window since the last write
    for garbage in ("nan", "-1", "0", "fast"):
        client.hset(FAIR.pace, "c", garbage)
        assert pace.of("c") is None
    assert pace.of("unknown") is None


def test_submit_sizes_messages_by_the_pace_the_workers_measured(
    fresh_stack: Stack, tmp_path: Path
) -> None:
    """A model measured slow gets small messages; the workers then measure it as it is."""
    stack = fresh_stack
    n = MIN_MESSAGES * MESSAGE_SAMPLES  # a run of 256-sample messages by default
    write_rows(tmp_path, "validation", labelled_rows(n))
    name = list_splits(stack.client, str(tmp_path), "validation")
    model = model_key("null", {})
    Pace(stack.client).set(model, 1.0)
    request = SubmitRequest(eval="null", dataset=name, split="validation")
    meta = submit(
        stack.client, stack.app, request, principal="tests", archive=stack.settings.archive_url
    )
    sizes = set()
    for message in Backlog(stack.client).messages(meta.run_id):
        _, kwargs, _ = json.loads(base64.b64decode(json.loads(message)["body"]))
        sizes.add(len(kwargs["sample_ids"]))
    assert sizes == {MIN_MESSAGE_SAMPLES}
    stack.start_workers()
    wait_completed(stack.client, meta.run_id)
    measured = Pace(stack.client).of(model)
    assert measured is not None
    assert measured < 0.1


def test_one_worker_reserves_two_batches_and_leaves_the_rest_queued(
    fresh_stack: Stack, tmp_path: Path
) -> None:
    """A worker holds (unacknowledged) only two messages, so a second worker finds the rest
    of a run waiting instead of idling beside a hoarder, and a run dispatched now waits behind
    no more than that."""
    stack = fresh_stack
    n = MIN_MESSAGES * MIN_MESSAGE_SAMPLES  # 64 messages of 64 samples, each 4 batches of 16
    write_rows(tmp_path, "validation", labelled_rows(n))
    name = list_splits(stack.client, str(tmp_path), "validation")
    gate = tmp_path / "gate"
    request = SubmitRequest(
        eval="slow",
        dataset=name,
        split="validation",
        params={"gate": str(gate), "open_until": "0"},  # every sample waits at the gate
    )
    meta = submit(
        stack.client, stack.app, request, principal="tests", archive=stack.settings.archive_url
    )
    backlog = Backlog(stack.client)

    def waiting() -> int:
        """Messages in the queue and in the run's backlog."""
        return stack.client.llen(INFER_QUEUE) + len(list(backlog.messages(meta.run_id)))

    assert waiting() == MIN_MESSAGES
    stack.start_workers()
    held = Channel.unacked_key
    wait_for(lambda: stack.client.hlen(held) == 2, 30, "the worker to reserve two messages")
    # Its first batch is stuck at the gate, so nothing more is acknowledged or fetched, and
    # the dispatcher keeps the queue a batch deep for it (one message).
    wait_for(lambda: stack.client.llen(INFER_QUEUE) == 1, 30, "the queue to be refilled")
    assert waiting() == MIN_MESSAGES - 2
    assert stack.client.hlen(held) == 2
    Client(
        Settings(
            redis_url=stack.server.url, archive_url=stack.settings.archive_url, principal="tests"
        )
    ).cancel(meta.run_id)
    gate.touch()


def test_a_single_process_worker_gets_its_next_batch_while_busy(fresh_stack: Stack) -> None:
    """One pool process: Celery's fcfs scheduling (next batch written to the busy process);
    several: fair scheduling (each batch to an idle process)."""
    url = fresh_stack.server.url
    for concurrency in (1, 2):
        workers = LocalWorkers(url, concurrency=concurrency, env=cli_env(url))
        fresh_stack.workers.append(workers.start(fresh_stack.app))

    def both() -> dict[str, Any]:
        replies = fresh_stack.app.control.inspect(timeout=2).stats() or {}
        return dict(replies) if len(replies) == 2 else {}

    stats = wait_for(both, 30, "both workers' stats")
    strategies = sorted(
        (info["pool"]["max-concurrency"], info["pool"]["writes"]["strategy"])
        for info in stats.values()
    )
    assert strategies == [(1, "fcfs"), (2, "fair")]


_CHURN = """
import sys
sys.path.insert(0, {repo!r})
from tests.plugins import CHURN_MIB, heap_churn
if sys.argv[1] == "keep":
    from evalq.worker.heap import keep_freed_memory
    assert keep_freed_memory()
print(heap_churn(CHURN_MIB))
"""
"""The churn in a fresh process; only the ``keep`` one imports the worker (whose imports would
otherwise leave the default process's heap in whatever shape they happen to)."""
PAGES = CHURN_MIB * 256  # 4 KiB pages


def _churn(mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _CHURN.format(repo=str(REPO)), mode],
        stdout=subprocess.PIPE,
        text=True,
        env={"PATH": "/usr/bin:/bin"},  # no MALLOC_* tuning from the caller
    )


def _faults(churn: subprocess.Popen[str]) -> int:
    out, _ = churn.communicate(timeout=120)
    assert churn.returncode == 0
    return int(out.split()[-1])


@pytest.mark.integration
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc")
def test_kept_heap_memory_is_reused_instead_of_faulted_in_again() -> None:
    """glibc gives a freed heap top back to the kernel and the next batch faults it in again
    page by page; with the worker's heap settings the next batch reuses it."""
    default, keep = _churn("default"), _churn("keep")  # side by side: each its own heap
    assert _faults(default) > 0.9 * PAGES
    assert _faults(keep) < 0.05 * PAGES


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc")
def test_worker_pool_processes_keep_freed_heap_memory(stack: Stack, tmp_path: Path) -> None:
    write_rows(tmp_path, "validation", labelled_rows(4))
    name = list_splits(stack.client, str(tmp_path), "validation")
    request = SubmitRequest(eval="churn", dataset=name, split="validation")
    meta = submit(
        stack.client, stack.app, request, principal="tests", archive=stack.settings.archive_url
    )
    wait_completed(stack.client, meta.run_id, 60)
    outputs = ResultReader(stack.client).outputs(meta.run_id, [0, 1, 2, 3])
    assert len(outputs) == 4
    assert all(output["faults"] < 0.05 * PAGES for output in outputs.values())
