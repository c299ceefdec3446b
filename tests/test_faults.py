"""Nothing stuck, nothing lost: hostile messages, workers without the plugin, Redis out of
memory, killed finalizers, scorers and main processes, a network partition, remote control and
exit codes, each against real redis-server and real worker processes. No case types
``evalq resume``: every run heals by itself and ends with each sample settled exactly once.

The janitor's delay is a setting (``EVALQ_STALL_AFTER``, default 60 s); these tests run it at
``FAST["EVALQ_STALL_AFTER"]`` seconds, with heartbeats every half second. With
``EVALQ_FAULTS_AT_DEFAULTS=1`` they run at the defaults instead, to time each case as shipped
(``pytest tests/test_faults.py --durations=0``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from evalq.producer.service.client import Client
from evalq.producer.service.submit import SubmitRequest
from evalq.shared.connection import server_time
from evalq.shared.models import RunMeta, RunStatus
from evalq.shared.queue.backlog import Backlog
from evalq.shared.queue.celery_app import INFER_QUEUE, SCORE_QUEUE
from evalq.shared.settings import Settings
from evalq.shared.store.presence import HEARTBEAT_MISSES, Presence
from tests.conftest import Stack
from tests.helpers import (
    REPO,
    assert_settled_once,
    cli_env,
    evalq,
    labelled_rows,
    list_splits,
    wait_completed,
    wait_ended,
    wait_for,
    write_rows,
)
from tests.proxy import Proxy

pytestmark = pytest.mark.integration

FAST = (
    {}
    if os.environ.get("EVALQ_FAULTS_AT_DEFAULTS")
    else {"EVALQ_STALL_AFTER": "3", "EVALQ_HEARTBEAT_INTERVAL": "0.5"}
)
"""Janitor after 3 s without progress; a silent worker counts as gone after 2.5 s."""
TIMING = Settings.model_validate({k.removeprefix("EVALQ_").lower(): v for k, v in FAST.items()})
GONE_AFTER = TIMING.heartbeat_interval * HEARTBEAT_MISSES


def _client(stack: Stack) -> Client:
    settings = Settings(
        redis_url=stack.server.url, archive_url=stack.settings.archive_url, principal="tests"
    )
    return Client(settings.model_copy(update={"stall_after": TIMING.stall_after}))


def _submit(
    stack: Stack, folder: Path, eval_name: str, rows: list[dict[str, object]], **params: str
) -> RunMeta:
    split = f"s{uuid.uuid4().hex[:6]}"
    write_rows(folder, split, rows)
    name = list_splits(stack.client, str(folder), split)
    request = SubmitRequest(eval=eval_name, dataset=name, split=split, params=params)
    return _client(stack).submit(request)


def _gated(stack: Stack, folder: Path, n: int = 400) -> RunMeta:
    """A ``slow`` run whose samples from 100 on wait for ``folder/gate``."""
    gate = {"gate": str(folder / "gate"), "open_until": "100"}
    return _submit(stack, folder, "slow", labelled_rows(n), **gate)


def _wait_inferred(stack: Stack, run_id: str, at_least: int) -> None:
    client = _client(stack)
    wait_for(lambda: client.status(run_id).progress.inferred >= at_least, 60, "inference")


def _complete(stack: Stack, meta: RunMeta, timeout: float = 120) -> None:
    assert wait_ended(stack.client, meta.run_id, timeout) is RunStatus.COMPLETED
    assert_settled_once(stack.client, meta.run_id, meta.n)


def _pool_pids(stack: Stack) -> set[int]:
    stats = wait_for(lambda: stack.app.control.inspect(timeout=2).stats() or {}, 60, "the stats")
    return {pid for node in stats.values() for pid in node["pool"]["processes"]}


def _raw(stack: Stack, queue: str, body: Any, **options: Any) -> None:
    """Publish ``body`` on ``queue`` exactly as given (no Celery envelope added)."""
    route = stack.app.amqp.queues[queue]
    with stack.app.connection_for_write() as connection:
        producer = connection.Producer()
        producer.publish(
            body, exchange=route.exchange, routing_key=route.routing_key, declare=[route], **options
        )


def _malformed(stack: Stack, good: dict[str, Any], tmp_path: Path) -> int:
    """Publish the corpus of hostile messages on both queues; return how many."""
    pwned = tmp_path / "pwned"

    def task_id() -> str:
        return str(uuid.uuid4())

    bodies: list[Any] = [
        {"not": "a list"}, [1], "string", None,
        [[], {}, {}, {}],  # wrong arity
        [["positional"], good, {}],
        [[], {**good, "sample_ids": ["3"]}, {}],
        [[], {**good, "sample_ids": [True]}, {}],
        [[], {**good, "sample_ids": [3.0]}, {}],
        [[], {**good, "sample_ids": [10**30]}, {}],
        [[], {**good, "extra": "field"}, {}],
        [[], {**good, "run_id": 5}, {}],
        [[], good, {"callbacks": [{"task": "evalq.infer", "args": [], "kwargs": {}}]}],
        [[], {**good, "run_id": "x" * 5_000_000}, {}],  # huge
    ]  # fmt: skip
    sent = 0
    for queue, task in ((INFER_QUEUE, "evalq.infer"), (SCORE_QUEUE, "evalq.score")):
        headers = {"task": task, "id": task_id(), "lang": "py"}
        for body in bodies:
            _raw(stack, queue, body, serializer="json", headers={**headers, "id": task_id()})
            sent += 1
        raws: list[tuple[Any, str, dict[str, Any]]] = [
            # unknown and built-in task names, bad headers
            ([[], good, {}], "json", {**headers, "task": "evalq.nope"}),
            ([[], good, {}], "json", {**headers, "task": "celery.map"}),
            ([[], good, {}], "json", {**headers, "task": ["evalq.infer"]}),
            ([[], good, {}], "json", {**headers, "task": None}),
            ([[], good, {}], "json", {"task": task}),  # no id
            ([[], good, {}], "json", {**headers, "eta": "2999-01-01T00:00:00"}),
            ([[], good, {}], "json", {**headers, "eta": "not a date"}),
            ([[], good, {}], "json", {**headers, "retries": "many", "timelimit": "x"}),
            ({"task": task, "id": task_id(), "args": [], "kwargs": good}, "json", {}),  # proto 1
            ({"task": task}, "json", {}),
        ]
        for body, serializer, hdrs in raws:
            _raw(stack, queue, body, serializer=serializer, headers=hdrs)
            sent += 1
        pickled = b"\x80\x04\x95\x05\x00\x00\x00\x00\x00\x00\x00K\x01."
        encoded = [
            (pickled, "application/x-python-serialize"),
            (f"!!python/object/apply:os.system ['touch {pwned}']".encode(), "application/x-yaml"),
            (b"plain text", "text/plain"),
            (b"{not json", "application/json"),
            (b"\xff\xfe\x00garbage", "application/json"),
        ]  # fmt: skip
        for payload, content_type in encoded:
            _raw(stack, queue, payload, content_type=content_type, content_encoding="binary",
                 headers={**headers, "id": task_id()})  # fmt: skip
            sent += 1
        _raw(stack, queue, b"\x1f\x8b garbage", content_type="application/json",
             content_encoding="utf-8", headers={**headers, "id": task_id()},
             compression="application/x-gzip")  # fmt: skip
        sent += 1
    return sent


def test_no_message_crashes_a_worker(fresh_stack: Stack, tmp_path: Path) -> None:
    stack = fresh_stack
    stack.crashes_expected = True  # Celery logs an unknown task name with a traceback
    workers = stack.start_workers()
    main = workers.processes[0]
    pool = _pool_pids(stack)
    # a real run's payload, published by hand with every way of being wrong
    victim = _submit(stack, tmp_path / "victim", "spy", labelled_rows(20))
    _complete(stack, victim)
    good = {"run_id": victim.run_id, "eval": "spy", "spec": victim.spec, "sample_ids": [1, 2]}
    sent = _malformed(stack, good, tmp_path)

    def drained() -> bool:
        return not stack.client.llen(INFER_QUEUE) and not stack.client.llen(SCORE_QUEUE)

    wait_for(drained, 60, "the worker to take every hostile message")
    meta = _submit(stack, tmp_path / "after", "spy", labelled_rows(50))
    _complete(stack, meta)
    assert main.poll() is None
    assert _pool_pids(stack) == pool
    log = stack.worker_log()
    assert "Unrecoverable error" not in log
    # all but the message with odd retries/timelimit headers (a payload of the victim, which
    # has ended: ignored) on each queue
    assert log.count("dropping a") + log.count("unregistered task") == sent - 2
    assert not (tmp_path / "pwned").exists()
    assert_settled_once(stack.client, victim.run_id, 20)


def test_a_message_naming_another_eval_spec_or_ids_drops_without_touching_the_run(
    fresh_stack: Stack, tmp_path: Path
) -> None:
    stack = fresh_stack
    other = _submit(stack, tmp_path / "other", "spy", labelled_rows(10))
    meta = _gated(stack, tmp_path, n=20)
    good = {"run_id": meta.run_id, "eval": "spy", "spec": meta.spec, "sample_ids": [0, 1]}
    forged = [
        {**good, "eval": "flaky"},
        {**good, "spec": other.spec},
        {**good, "sample_ids": list(range(1000, 1020))},
    ]
    for task in ("evalq.infer", "evalq.score"):
        for kwargs in forged:
            headers = {"task": task, "id": str(uuid.uuid4())}
            queue = INFER_QUEUE if task == "evalq.infer" else SCORE_QUEUE
            _raw(stack, queue, [[], kwargs, {}], serializer="json", headers=headers)
    # submit put the run's own message at the queue's head: behind the forged ones it goes,
    # so that they meet the run while it is going
    stack.client.lmove(INFER_QUEUE, INFER_QUEUE, "RIGHT", "LEFT")
    stack.start_workers(**FAST)
    _complete(stack, other)
    wait_for(lambda: stack.worker_log().count("dropping a message of run") >= 6, 60, "drops")
    (tmp_path / "gate").touch()
    _complete(stack, meta)
    assert _client(stack).status(meta.run_id).progress.failed == 0


def test_a_worker_without_the_plugin_gives_the_work_back(
    fresh_stack: Stack, tmp_path: Path
) -> None:
    stack = fresh_stack
    without = stack.start_workers(EVALQ_PLUGINS="", **FAST)
    meta = _submit(stack, tmp_path, "spy", labelled_rows(200))
    good = {"run_id": meta.run_id, "eval": "nosuch", "spec": meta.spec, "sample_ids": [1]}
    _raw(stack, INFER_QUEUE, [[], good, {}], serializer="json",
         headers={"task": "evalq.infer", "id": str(uuid.uuid4())})  # fmt: skip
    client = _client(stack)
    stalled = wait_for(lambda: client.status(meta.run_id).stalled, 60, "status to say why")
    assert stalled == "no live worker serves evaluation 'spy' (check its EVALQ_PLUGINS)"
    shown = evalq(stack.server.url, "status", meta.run_id)
    assert "no live worker serves evaluation 'spy'" in shown.stdout
    # the worker without the plugin moved every message to spy's own queue, and dropped the
    # forged one (its run is not of evaluation 'nosuch') instead of making a queue for it
    wait_for(lambda: not stack.client.llen(INFER_QUEUE) and not stack.client.hlen("unacked"))
    assert stack.client.llen("infer.spy") > 0
    assert not stack.client.exists("infer.nosuch")
    assert client.status(meta.run_id).progress.done == 0
    stack.start_workers(**FAST)
    _complete(stack, meta, timeout=60)
    assert without.processes[0].poll() is None
    log = stack.worker_log()
    assert "its messages go to queue 'infer.spy'" in log
    assert "its run is not of evaluation 'nosuch'" in log


def test_redis_out_of_memory_mid_run_loses_nothing(fresh_stack: Stack, tmp_path: Path) -> None:
    stack = fresh_stack
    stack.crashes_expected = True
    stack.start_workers(**FAST)
    meta = _gated(stack, tmp_path, n=2000)
    _wait_inferred(stack, meta.run_id, 64)
    # the run's 31 messages in the queue, not its backlog, more than the worker reserves: its
    # consumer takes the next one (a write, refused) instead of waiting on a queue the refused
    # dispatcher left empty
    Backlog(stack.client).dispatch(INFER_QUEUE, 64)
    # well under what Redis holds: every write is refused until it is lifted, whatever a pop
    # frees meanwhile (a batch's results are a few fields now, so at exactly the memory in use
    # writes could go on while the consumer's pops freed as much, and no write was refused)
    used = int(stack.client.info("memory")["used_memory"])
    stack.client.config_set("maxmemory", str(used // 2))
    (tmp_path / "gate").touch()
    wait_for(lambda: "maxmemory" in stack.worker_log(), 60, "a write refused for memory")
    # out of memory long enough for Celery's consumer to be refused too and reconnect
    wait_for(lambda: "re-establish the connection" in stack.worker_log(), 60, "a reconnect")
    progress_at_oom = _client(stack).status(meta.run_id).progress.done
    stack.client.config_set("maxmemory", "0")
    _complete(stack, meta)
    assert progress_at_oom < meta.n


def test_a_redis_restart_with_a_message_waiting_for_the_pool_heals(
    fresh_stack: Stack, tmp_path: Path
) -> None:
    """The worker's one pool process runs a message held at a gate and the next message waits
    for it, handed to the pool but not started, when Redis restarts under it (AOF on): the
    waiting message is forgotten with the connection, and the run still completes, without
    the visibility timeout."""
    stack = fresh_stack
    stack.crashes_expected = True  # Celery logs the lost connection with a traceback
    stack.start_workers(**FAST)
    meta = _gated(stack, tmp_path, 256)
    wait_for(lambda: stack.client.hlen("unacked") == 2, 30, "a message waiting for the pool")
    stack.server.restart()
    stack.wait_logged("forgot the unstarted evalq.infer messages")
    (tmp_path / "gate").touch()
    _complete(stack, meta, timeout=60)


def test_a_finalizer_killed_in_aggregate_is_taken_over(fresh_stack: Stack, tmp_path: Path) -> None:
    stack = fresh_stack
    stack.crashes_expected = True
    stack.start_workers(**FAST)
    marker = tmp_path / "died-once"
    meta = _submit(stack, tmp_path, "dies_aggregating", labelled_rows(20), marker=str(marker))
    _complete(stack, meta)
    assert marker.exists()
    view = _client(stack).status(meta.run_id)
    assert view.aggregate is not None
    assert set(view.aggregate) == {"correct", "saw_label"}
    # taken over by the janitor's message, or by the dead batch's own message when it came
    # back after the claim had gone stale
    stack.wait_logged("took over from a finalizer that died")


def test_a_score_that_kills_its_process_ends_as_one_error(
    fresh_stack: Stack, tmp_path: Path
) -> None:
    stack = fresh_stack
    stack.crashes_expected = True
    stack.start_workers(EVALQ_MAX_ATTEMPTS="3", **FAST)
    rows = labelled_rows(60)
    rows[7]["text"] = "please kill the scorer"
    meta = _submit(stack, tmp_path, "score_killer", rows)
    _complete(stack, meta)
    client = _client(stack)
    view = client.status(meta.run_id)
    assert (view.progress.scored, view.progress.failed) == (59, 1)
    assert view.errors == {"score/PermanentError": 1}
    (failed,) = [r for r in client.results(meta.run_id) if r.error is not None]
    assert failed.sample_id == 7
    assert failed.error is not None
    assert failed.error.message.startswith("gave up after 3 attempts")


def test_a_killed_main_process_heals_without_the_visibility_timeout(
    fresh_stack: Stack, tmp_path: Path
) -> None:
    stack = fresh_stack
    first = stack.start_workers(**FAST)  # default visibility timeout: an hour
    meta = _gated(stack, tmp_path)
    _wait_inferred(stack, meta.run_id, 64)
    main = first.processes[0]
    held = wait_for(lambda: stack.client.hlen("unacked"), 30, "messages held by the worker")
    os.kill(main.pid, signal.SIGKILL)
    main.wait(30)
    (tmp_path / "gate").touch()
    stack.start_workers(**FAST)
    _complete(stack, meta)  # within its deadline: not after the hour's visibility timeout
    with contextlib.suppress(ProcessLookupError):
        os.killpg(main.pid, signal.SIGKILL)  # the dead main process's pool children, if any
    assert held > 0
    stack.wait_logged("put back")


@pytest.mark.parametrize("fault", ["cut", "stall"])
def test_a_partition_between_worker_and_redis_heals(
    fresh_stack: Stack, tmp_path: Path, fault: str
) -> None:
    stack = fresh_stack
    stack.crashes_expected = True  # Celery logs the lost connection with a traceback
    with Proxy(stack.server.port) as proxy:
        stack.start_workers(url=proxy.url, **FAST)
        meta = _submit(stack, tmp_path, "slow", labelled_rows(400))
        _wait_inferred(stack, meta.run_id, 50)
        getattr(proxy, fault)()
        client = _client(stack)
        stalled = wait_for(
            lambda: client.status(meta.run_id).stalled, GONE_AFTER + 5, "status to say why"
        )
        assert stalled == "no live worker (start one: evalq worker)"
        # the partition itself, not a wait for something: with the worker already counted gone,
        # it lasts twice the janitor's delay more (15 s at the defaults, as it always did)
        time.sleep(min(15.0, 2 * TIMING.stall_after))
        proxy.restore()
        _complete(stack, meta)
        stack.stop_workers()  # while the proxy still lets their warm shutdown through


def test_remote_control_cannot_change_or_stop_a_worker(fresh_stack: Stack) -> None:
    stack = fresh_stack
    locked = stack.start_workers()
    control = stack.app.control

    def answered(command: str, **arguments: Any) -> list[dict[str, Any]]:
        """The worker's reply to ``command`` (asked again until one comes: a busy machine
        may answer after a broadcast's reply window)."""
        return wait_for(
            lambda: control.broadcast(command, arguments=arguments, reply=True, timeout=2) or [],
            60,
            f"a reply to {command}",
        )

    replies = answered("time_limit", task_name="evalq.score", hard=0.5)
    assert all("refused" in reply["error"] for node in replies for reply in node.values())
    control.shutdown()
    control.broadcast("pool_restart", arguments={"modules": ["os"], "reload": True})
    assert len(answered("ping")) == 1
    assert locked.processes[0].poll() is None
    (registered,) = answered("registered")
    assert "evalq.infer" in next(iter(registered.values()))
    stack.stop_workers()
    stack.start_workers(EVALQ_REMOTE_CONTROL="1")
    replies = answered("time_limit", task_name="evalq.score", hard=30)
    assert all("ok" in reply for node in replies for reply in node.values())


def test_followers_exit_4_when_the_run_fails(stack: Stack, tmp_path: Path) -> None:
    rows = labelled_rows(10)
    for row in rows:
        row["text"] = f"bust {row['text']}"  # flaky cannot score any of them
    write_rows(tmp_path, "validation", rows)
    name = list_splits(stack.client, str(tmp_path), "validation")
    url = stack.server.url
    data = ["--dataset", name, "--split", "validation"]
    followed = evalq(url, "submit", "flaky", *data, "--follow")
    assert followed.returncode == 4, followed.stderr
    run_id = followed.stdout.split()[0]
    assert followed.stderr.strip() == f"error: run {run_id} ended failed: no sample could be scored"
    assert evalq(url, "watch", run_id).returncode == 4
    assert evalq(url, "watch", run_id, "--json").returncode == 4
    assert evalq(url, "submit", "flaky", *data, "--follow", "--json").returncode == 4
    assert evalq(url, "results", run_id, "--follow").returncode == 4
    assert evalq(url, "status", run_id).returncode == 0


def test_with_no_worker_submit_warns_and_watch_says_why(fresh_stack: Stack, tmp_path: Path) -> None:
    stack = fresh_stack
    write_rows(tmp_path, "validation", labelled_rows(20))
    name = list_splits(stack.client, str(tmp_path), "validation")
    url = stack.server.url
    submitted = evalq(url, "submit", "spy", "--dataset", name, "--split", "validation")
    assert submitted.returncode == 0, submitted.stderr
    assert submitted.stderr.startswith("warning: no live worker (start one: evalq worker)")
    run_id = submitted.stdout.strip()
    watcher = subprocess.Popen(
        [sys.executable, "-c", "from evalq.shared.cli import main; main()", "watch", run_id],
        env=cli_env(url), cwd=REPO, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert watcher.stdout is not None
    try:
        line = watcher.stdout.readline()
        assert line.rstrip().endswith("stalled: no live worker (start one: evalq worker)")
    finally:
        watcher.kill()
        watcher.wait()
        watcher.stdout.close()


def test_watch_rides_out_a_redis_restart(fresh_stack: Stack, tmp_path: Path) -> None:
    stack = fresh_stack
    meta = _submit(stack, tmp_path, "spy", labelled_rows(20))
    url = stack.server.url
    watcher = subprocess.Popen(
        [sys.executable, "-c", "from evalq.shared.cli import main; main()", "watch", meta.run_id],
        env=cli_env(url), cwd=REPO, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert watcher.stdout is not None
    try:
        assert "stalled: no live worker" in watcher.stdout.readline()
        stack.server.stop()
        assert watcher.stdout.readline().strip() == "Redis is unreachable; still watching"
        stack.server.start()
        stack.start_workers()
        rest = watcher.stdout.read()
        assert watcher.wait(60) == 0
        assert f"{meta.run_id} completed" in rest
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()
        watcher.stdout.close()


def test_a_run_a_worker_is_working_on_is_not_called_stalled(
    fresh_stack: Stack, tmp_path: Path
) -> None:
    """A new user's demo-lm printed ``stalled: no progress for 549s`` for 13 minutes while the
    worker generated the whole time: a batch's samples settle only when the whole batch ends,
    and "stalled" was judged by settled samples. A run whose message a live worker holds is
    moving, however long since its last write."""
    stack = fresh_stack
    stack.start_workers()
    gate = tmp_path / "gate"
    write_rows(tmp_path / "data", "validation", labelled_rows(8))
    name = list_splits(stack.client, tmp_path / "data", "validation")
    client = Client(stack.settings.model_copy(update={"stall_after": 0.5}))
    params = {"gate": str(gate), "open_until": "0"}  # the model works until the gate opens
    meta = client.submit(
        SubmitRequest(eval="slow", dataset=name, split="validation", params=params)
    )
    presence = Presence(stack.client)
    wait_for(lambda: any(meta.run_id in w.runs for w in presence.live()), 60, "a worker on it")
    # nothing written for longer than stall_after: the old rule called it stalled from here on
    wait_for(lambda: server_time(stack.client) - meta.created > 1.0, 10, "a second to pass")
    assert client.status(meta.run_id).stalled is None
    assert client.status(meta.run_id).meta.status is RunStatus.QUEUED  # no write yet
    gate.touch()
    wait_completed(stack.client, meta.run_id)
    client.close()
