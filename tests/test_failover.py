"""Redis fails over under evalq: a master, a replica and three sentinels (``tests/sentinel.py``),
real workers, the direct client, all given only the sentinels' URL. The master is SIGKILLed
mid-run, during a burst of submits near a budget's limit, and while a run is being archived;
a supervisor (this test) starts the dead node again as the new master's replica once the
sentinels have promoted the old replica. Every run must complete without a human, every
sample settle once, the budget balance and the audit stream agree."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from evalq.producer.operations.redis_server import RedisServer
from evalq.producer.operations.workers import LocalWorkers
from evalq.producer.service.client import Client
from evalq.producer.service.submit import SubmitRequest
from evalq.shared.access.ledger import Ledger
from evalq.shared.connection import connect
from evalq.shared.errors import BudgetExhaustedError
from evalq.shared.evaluation import load_plugins
from evalq.shared.keys import RunKeys
from evalq.shared.models import RunMeta, RunStatus
from evalq.shared.queue.celery_app import create_app
from evalq.shared.settings import Settings
from evalq.shared.store.reader import ResultReader
from evalq.shared.store.scripts import register
from tests.helpers import (
    assert_settled_once,
    audit_entries,
    cli_env,
    labelled_rows,
    list_splits,
    wait_ended,
    wait_for,
    write_rows,
)
from tests.sentinel import MASTER, SentinelGroup

pytestmark = pytest.mark.integration

FAST = {"EVALQ_STALL_AFTER": "3", "EVALQ_HEARTBEAT_INTERVAL": "0.5"}


@dataclass
class Fleet:
    group: SentinelGroup
    settings: Settings
    app: Celery
    store: redis.Redis
    root: Path
    _supervisors: list[threading.Thread] = field(default_factory=list)
    _failed: list[BaseException] = field(default_factory=list)
    settled_after: float | None = None

    def client(self) -> Client:
        return Client(self.settings)

    def split(self, rows: int) -> tuple[str, str]:
        split = f"s{uuid.uuid4().hex[:6]}"
        folder = self.root / "data"
        write_rows(folder, split, labelled_rows(rows))
        return list_splits(self.store, str(folder), split), split

    def fail_over(self) -> float:
        """SIGKILL the master; in the background, once the sentinels have promoted the
        replica, start the dead node again as its replica. Return the kill's Unix time."""
        dead = self.group.kill_master()
        killed = time.time()

        def supervise() -> None:
            try:
                self.group.failed_over(dead)
                self.group.rejoin(dead)
            except BaseException as exc:  # raised in the test that failed over (healed)
                self._failed.append(exc)

        thread = threading.Thread(target=supervise, daemon=True)
        thread.start()
        self._supervisors.append(thread)
        return killed

    def first_settle(self, run_id: str, killed_at: float) -> threading.Thread:
        """Watch, from the kill on, for the first sample settled on the new master: its entry
        in the run's settled stream (whose ids are the server's clock in ms) sets
        :attr:`settled_after` to the seconds from ``killed_at`` (Unix time)."""
        since = f"{int(killed_at * 1000)}"

        def watch() -> None:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and self.settled_after is None:
                try:
                    with self.group.master() as master:
                        found = master.xrange(RunKeys(run_id).settled, since, "+", count=1)
                except redis.RedisError:
                    found = []
                if found:
                    self.settled_after = int(found[0][0].split("-")[0]) / 1000 - killed_at
                time.sleep(0.05)

        thread = threading.Thread(target=watch, daemon=True)
        thread.start()
        return thread

    def healed(self) -> None:
        """Wait for each failover's supervisor (its failover and rejoin: 60 s and 90 s at
        most), and fail here if one failed: a rejoin that outlived a 60 s wait raised in
        whichever test the module's process ran next (a clean-clone CI's setup error)."""
        for thread in self._supervisors:
            thread.join(160)
        alive = any(thread.is_alive() for thread in self._supervisors)
        self._supervisors = []
        failed, self._failed = self._failed, []
        if failed:
            raise failed[0]
        assert not alive, "a failover's supervisor did not end"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("failover")
    group = SentinelGroup(root / "redis").start()
    settings = Settings(
        redis_url=group.url,
        redis_sentinel_master=MASTER,
        plugins=("tests.plugins",),
        archive_url=str(root / "archive"),
        principal="tests",
        stall_after=3,
    )
    load_plugins(settings.plugins)
    app = create_app(settings)
    workers = LocalWorkers(
        group.url,
        env={
            **cli_env(group.url),
            "EVALQ_REDIS_SENTINEL_MASTER": MASTER,
            "EVALQ_MAX_BATCH": "16",
            "EVALQ_ARCHIVE_URL": settings.archive_url,
            **FAST,
        },
        log_dir=root,
    ).start(app, timeout=120)
    store = connect(settings.redis, retries=30)
    fleet = Fleet(group, settings, app, store, root)
    try:
        yield fleet
    finally:
        workers.stop()
        store.close()
        group.stop()


def test_a_connection_asks_the_sentinels_for_the_master_once(fleet: Fleet) -> None:
    """A new connection asks where the master is once (redis-py's own path asks, and the
    reconnection fix does not ask again); a connection a retry dropped asks again."""
    client = connect(fleet.settings.redis)
    pool: Any = client.connection_pool  # a SentinelConnectionPool: its connections ask its proxy
    asked: list[object] = []
    real = pool.proxy.get_master_address

    def counted() -> object:
        asked.append(real())
        return asked[-1]

    pool.proxy.get_master_address = counted
    pool.disconnect()
    assert client.ping()  # a new connection
    assert len(asked) == 1
    connection = pool.get_connection()
    connection.disconnect()
    connection.connect_check_health()  # what a retry does after dropping it
    assert len(asked) == 2
    pool.release(connection)
    client.close()


def test_the_master_killed_mid_run_loses_no_sample(fleet: Fleet) -> None:
    name, split = fleet.split(600)
    gate = fleet.root / "gate"
    request = SubmitRequest(
        eval="slow", dataset=name, split=split, params={"gate": str(gate), "open_until": "200"}
    )
    meta = fleet.client().submit(request)
    reader = ResultReader(fleet.store)
    wait_for(lambda: reader.progress(meta.run_id).inferred >= 48, 60, "inference")
    killed = fleet.fail_over()
    watching = fleet.first_settle(meta.run_id, killed)
    gate.touch()
    fleet.healed()
    watching.join(130)
    assert wait_ended(fleet.store, meta.run_id, 180) is RunStatus.COMPLETED
    assert_settled_once(fleet.store, meta.run_id, meta.n)
    reserved = [e for e in audit_entries(fleet.store, meta.run_id) if e["action"] == "reserve"]
    assert len(reserved) == 1
    assert fleet.settled_after is not None
    print(f"kill to the first settle on the new master: {fleet.settled_after:.1f} s")


def test_a_burst_of_submits_near_the_budget_accepts_no_more_than_it_allows(
    fleet: Fleet,
) -> None:
    name, split = fleet.split(20)
    Ledger(fleet.store).set(
        name, split, runs=6, samples=None, max_samples_per_run=None, who="tests"
    )
    request = SubmitRequest(eval="spy", dataset=name, split=split)

    def submit(_: int) -> RunMeta | str:
        try:
            return fleet.client().submit(request)
        except BudgetExhaustedError:
            return "refused"

    with ThreadPoolExecutor(6) as pool:
        first = [pool.submit(submit, i) for i in range(6)]
        wait_for(lambda: any(f.done() for f in first), 60, "a first submit")
        fleet.fail_over()
        rest = [pool.submit(submit, i) for i in range(6, 14)]
        answers = [f.result(timeout=180) for f in first + rest]
    fleet.healed()
    accepted = [a for a in answers if isinstance(a, RunMeta)]
    assert len(accepted) + answers.count("refused") == len(answers)
    assert len(accepted) <= 6
    budget = Ledger(fleet.store).get(name, split)
    reserves = [
        e
        for e in audit_entries(fleet.store)
        if e["action"] == "reserve" and e["dataset"] == name and e["split"] == split
    ]
    # every accepted submit was charged once, and nothing else was
    assert budget.runs_used == len(accepted) == len(reserves)
    assert {e["run"] for e in reserves} == {m.run_id for m in accepted}
    for meta in accepted:
        assert wait_ended(fleet.store, meta.run_id, 120) is RunStatus.COMPLETED
        assert_settled_once(fleet.store, meta.run_id, meta.n)


def test_the_master_killed_while_a_run_is_archived_keeps_the_run(fleet: Fleet) -> None:
    name, split = fleet.split(400)
    meta = fleet.client().submit(SubmitRequest(eval="spy", dataset=name, split=split))
    assert wait_ended(fleet.store, meta.run_id, 120) is RunStatus.COMPLETED
    # the worker that finalized it archives it now (archive_after is 0): kill under it
    fleet.fail_over()
    fleet.healed()
    wait_for(lambda: fleet.store.hget(RunKeys(meta.run_id).meta, "archived"), 120, "the archive")
    assert_settled_once(fleet.store, meta.run_id, meta.n)
    view = fleet.client().status(meta.run_id)
    assert view.meta.status is RunStatus.COMPLETED
    assert len(list(ResultReader(fleet.store).results(meta.run_id))) == meta.n


class _LoadsElsewhere(redis.Redis):
    """A client whose ``SCRIPT LOAD`` reaches a server that is not the one its next
    ``EVALSHA`` reaches (a failover between the two: here the script is flushed right after
    it was loaded, as a freshly promoted master would lack it)."""

    def script_load(self, script: Any) -> str:
        sha = str(super().script_load(script))
        self.script_flush()
        return sha


def test_a_script_runs_when_a_failover_comes_between_its_load_and_its_call(
    redis_only: RedisServer,
) -> None:
    """The clean clone's failover test raised ``NoScriptError: No matching script`` inside
    ``backlog.stage``: redis-py answers a missing script with ``SCRIPT LOAD`` then a second
    ``EVALSHA``, and a failover sent them to different servers. A second miss runs the script
    with ``EVAL``, its source in the same command."""
    client = _LoadsElsewhere.from_url(redis_only.url, decode_responses=True)
    script = register(client, "evalq.shared.store", "lead")
    client.script_flush()
    holder = f"tests-{uuid.uuid4().hex[:6]}"
    assert script(keys=["evalq:tests:lead"], args=[holder, 5000, ""]) == 1
    assert client.get("evalq:tests:lead") == holder
    confirmed = register(client, "evalq.shared.store", "lead", confirmed=True)
    client.script_flush()
    assert confirmed(keys=["evalq:tests:lead"], args=["another", 5000, ""]) == 0
    client.close()


def test_reading_datasets_in_threads_keeps_tqdm_s_lock() -> None:
    """tqdm's ``thread_map`` deletes a class lock it created itself; two dataset reads at once
    (a burst of submits) raced on that delete. The class keeps a lock of its own from the first
    read on, so no read makes or deletes one."""
    from datasets.utils.tqdm import tqdm
    from tqdm.contrib.concurrent import ensure_lock  # type: ignore[import-untyped]

    from evalq.shared.data.loading import _quiet_datasets

    with _quiet_datasets():
        pass
    with ensure_lock(tqdm), ensure_lock(tqdm):  # two readers: the inner one used to delete it
        pass
    assert hasattr(tqdm, "_lock")
