"""Tiers and the budget ledger (invariants 1-3): the ledger, budgets and policy files against a
real redis-server, in the unit layer; tiers seen through a worker's runs (integration)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis

from evalq.producer.operations.redis_server import RedisServer
from evalq.producer.service.client import Client
from evalq.producer.service.submit import SubmitRequest
from evalq.shared.access.ledger import Ledger
from evalq.shared.access.policy import Tier
from evalq.shared.access.tiers import TierRegistry
from evalq.shared.connection import connect
from evalq.shared.errors import BudgetExhaustedError, PolicyRefusedError, TierRefusedError
from evalq.shared.keys import AUDIT, FAIR, JANITOR, RUNS, RunKeys, budget_key
from evalq.shared.models import ErrorRecord, Stage
from evalq.shared.queue.celery_app import create_app
from evalq.shared.settings import Settings
from evalq.shared.store.writer import ResultWriter
from tests.conftest import Stack
from tests.helpers import (
    REPO,
    audit_entries,
    charge_run,
    cli_env,
    ended_view,
    evalq,
    evalq_in_process,
    labelled_rows,
    list_splits,
    register_splits,
    wait_completed,
    wait_for,
    write_rows,
)

RACERS = 48
"""Producers racing for one budget: half of them threads of this process, half threads of
:data:`RACER_PROCESSES` other processes (a lock held in one process would not hold there)."""
RACER_PROCESSES = 2

_RACERS = """
import sys, threading
from evalq.shared.connection import connect
from evalq.shared.errors import BudgetExhaustedError
from tests.helpers import charge_run
url, samples, first, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
won = []

def race(index):
    client = connect(url)
    client.incr("test:ready")
    client.blpop(["test:go"], timeout=30)
    try:
        charge_run(client, "race", "validation", f"run{index}", samples, f"p{index}")
        won.append(index)
    except BudgetExhaustedError:
        pass

threads = [threading.Thread(target=race, args=(i,)) for i in range(first, first + count)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(len(won))
"""


def _reserve(url: str, samples: int, index: int, start: threading.Event) -> bool:
    start.wait(30)
    client = connect(url)
    try:
        charge_run(client, "race", "validation", f"run{index}", samples, f"t{index}")
        return True
    except BudgetExhaustedError:
        return False
    finally:
        client.close()


def _race(url: str, samples: int) -> int:
    """:data:`RACERS` producers charging ``samples`` each, all released at once; how many
    won."""
    half = RACERS // 2
    each = half // RACER_PROCESSES
    client = connect(url)
    client.delete("test:ready", "test:go")
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", _RACERS, url, str(samples), str(i * each), str(each)],
            env=cli_env(url),
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(RACER_PROCESSES)
    ]
    start = threading.Event()
    with ThreadPoolExecutor(half) as threads:
        in_threads = [threads.submit(_reserve, url, samples, half + i, start) for i in range(half)]
        wait_for(lambda: int(client.get("test:ready") or 0) == half, 60, "racers to connect")
        client.rpush("test:go", *["go"] * half)
        start.set()
        thread_wins = sum(f.result(60) for f in in_threads)
    process_wins = sum(int(p.communicate(timeout=60)[0]) for p in processes)
    return thread_wins + process_wins


@pytest.fixture
def server(tmp_path: Path, stop_later: Callable[[RedisServer], None]) -> Iterator[RedisServer]:
    """A redis-server that keeps an append-only file (a restart loses nothing)."""
    running = RedisServer(tmp_path / "redis", appendonly=True).start()
    yield running
    stop_later(running)


@pytest.mark.integration
def test_racing_producers_never_oversubscribe_runs(server: RedisServer) -> None:
    ledger = Ledger(connect(server.url))
    ledger.set("race", "validation", runs=7, samples=None, max_samples_per_run=None, who="admin")
    assert _race(server.url, samples=1) == 7
    budget = ledger.get("race", "validation")
    assert (budget.runs_left, budget.runs_used, budget.samples_used) == (0, 7, 7)


@pytest.mark.integration
def test_racing_producers_never_oversubscribe_samples(server: RedisServer) -> None:
    ledger = Ledger(connect(server.url))
    ledger.set("race", "validation", runs=None, samples=70, max_samples_per_run=None, who="a")
    assert _race(server.url, samples=10) == 7
    budget = ledger.get("race", "validation")
    assert (budget.samples_left, budget.samples_used, budget.runs_used) == (0, 70, 7)


@pytest.mark.integration
def test_a_refused_reservation_changes_nothing_and_names_its_limit(server: RedisServer) -> None:
    client = connect(server.url)
    ledger = Ledger(client)
    ledger.set("d", "s", runs=3, samples=100, max_samples_per_run=20, who="admin")
    charge_run(client, "d", "s", "r1", 20, "me")
    before = client.hgetall(budget_key("d", "s")), client.xlen(AUDIT)
    with pytest.raises(BudgetExhaustedError, match="at most 20 samples per run") as capped:
        charge_run(client, "d", "s", "r2", 21, "me")
    assert capped.value.limit == "max_samples_per_run"
    ledger.set("d", "s", runs=1, samples=100, max_samples_per_run=20, who="admin")
    with pytest.raises(BudgetExhaustedError, match="no runs left") as runs:
        charge_run(client, "d", "s", "r3", 1, "me")
    assert runs.value.limit == "runs"
    ledger.set("d", "s", runs=9, samples=25, max_samples_per_run=None, who="admin")
    with pytest.raises(BudgetExhaustedError, match="5 samples left") as samples:
        charge_run(client, "d", "s", "r4", 6, "me")
    assert samples.value.limit == "samples"
    after = client.hgetall(budget_key("d", "s"))
    assert (after["runs_used"], after["samples_used"]) == (before[0]["runs_used"], "20")


def test_the_per_run_cap_admits_exactly_its_samples_and_refuses_one_more(
    redis_only: RedisServer,
) -> None:
    """The split's cap, then a caller's own cap on the split: a run of exactly the cap's
    samples is charged, a run of one sample more is refused by the cap it is over."""
    client = connect(redis_only.url)
    ledger = Ledger(client)
    ledger.set("d", "s", runs=None, samples=None, max_samples_per_run=20, who="admin")
    charge_run(client, "d", "s", "at-split-cap", 20, "me")
    with pytest.raises(BudgetExhaustedError, match="d/s allows at most 20 samples") as split:
        charge_run(client, "d", "s", "over-split-cap", 21, "me")
    assert split.value.limit == "max_samples_per_run"
    ledger.set("d", "s", runs=None, samples=None, max_samples_per_run=10, who="a", caller="me")
    charge_run(client, "d", "s", "at-own-cap", 10, "me")
    with pytest.raises(BudgetExhaustedError, match="for me allows at most 10 samples") as own:
        charge_run(client, "d", "s", "over-own-cap", 11, "me")
    assert own.value.limit == "max_samples_per_run"
    charge_run(client, "d", "s", "not-capped-by-mine", 20, "you")
    assert (ledger.get("d", "s").runs_used, ledger.get("d", "s", "me").runs_used) == (3, 1)


class _Monitor:
    """Every command the server receives while the block runs (Redis MONITOR)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.commands: list[str] = []

    def __enter__(self) -> _Monitor:
        self._client = redis.Redis.from_url(self.url, decode_responses=True)
        self._monitor = self._client.monitor()  # type: ignore[no-untyped-call]
        self._monitor.__enter__()
        self._thread = threading.Thread(target=self._listen, daemon=True)
        self._thread.start()
        connect(self.url).echo("monitor-start")
        wait_for(lambda: any("monitor-start" in c for c in self.commands), 10, "MONITOR")
        return self

    def _listen(self) -> None:
        for event in self._monitor.listen():
            self.commands.append(str(event["command"]))
            if "monitor-stop" in event["command"]:
                return

    def __exit__(self, *exc: object) -> None:
        connect(self.url).echo("monitor-stop")
        self._thread.join(10)
        self._monitor.__exit__(None, None, None)
        self._client.close()


@pytest.mark.integration
def test_no_access_and_unlisted_are_refused_before_the_ledger(stack: Stack, tmp_path: Path) -> None:
    write_rows(tmp_path, "test", labelled_rows(10))
    write_rows(tmp_path, "train", labelled_rows(10))
    data = str(tmp_path)
    name = list_splits(stack.client, data, "test", tier="no_access")  # train stays unlisted
    runs_before = stack.client.zcard(RUNS)
    with _Monitor(stack.server.url) as seen:
        for split in ("test", "train"):
            refused = evalq(stack.server.url, "submit", "spy", "--dataset", name, "--split", split)
            assert refused.returncode == 3, refused.stderr
            assert refused.stderr.strip() == f"error: tier refused: {name}/{split} is no_access"
    # the shared worker's housekeeping scripts may run meanwhile: kombu's unacked mutex and
    # its sweep of expired binding tables (every few minutes), the janitor's lease and the
    # dispatcher's refill; any other script, or any budget key, is a touch of the ledger
    housekeeping = ("unacked_mutex", "_kombu.binding_deadlines", JANITOR, FAIR.depth)
    touched = [
        c
        for c in seen.commands
        if ("evalq:budget:" in c or "EVALSHA" in c.upper())
        and not any(key in c.split() for key in housekeeping)
    ]
    assert touched == []
    assert not stack.client.exists(budget_key(name, "test"), budget_key(name, "train"))
    assert stack.client.zcard(RUNS) == runs_before

    admin = Client(
        Settings(
            redis_url=stack.server.url, archive_url=stack.settings.archive_url, principal="root-op"
        ),
        admin=True,
    )
    meta = admin.submit(SubmitRequest(eval="spy", dataset=name, split="test"))
    assert meta.admin
    assert not meta.charged
    entries = audit_entries(stack.client, meta.run_id)
    assert [(e["action"], e["who"]) for e in entries] == [("admin_submit", "root-op")]
    assert not stack.client.exists(budget_key(name, "test"))
    wait_completed(stack.client, meta.run_id, 60)


@pytest.mark.integration
def test_non_viewable_runs_are_aggregate_only(stack: Stack, tmp_path: Path) -> None:
    write_rows(tmp_path, "validation", labelled_rows(30))
    data = str(tmp_path)
    name = list_splits(stack.client, data, "validation", tier="non_viewable")
    url = stack.server.url
    user = Client(Settings(redis_url=url, principal="agent"))
    meta = user.submit(SubmitRequest(eval="spy", dataset=name, split="validation", limit=10))
    wait_completed(stack.client, meta.run_id, 60)

    # Python API: aggregate yes, per-sample rows no
    view = ended_view(user, meta.run_id)
    assert set(view.aggregate or {}) == {"correct", "saw_label"}
    with pytest.raises(TierRefusedError, match="non_viewable"):
        user.results(meta.run_id)

    # CLI: the same, with exit code 3 and one line
    refused = evalq(url, "results", meta.run_id)
    assert refused.returncode == 3
    assert refused.stdout == ""
    assert len(refused.stderr.strip().splitlines()) == 1
    assert "per-sample results are not readable" in refused.stderr
    status = json.loads(evalq(url, "status", meta.run_id, "--json").stdout)
    assert status["aggregate"] == view.aggregate
    assert status["tier"] == "non_viewable"

    # an admin may read the rows; the read is audited
    rows = evalq(url, "results", meta.run_id, "--admin").stdout.splitlines()
    assert len(rows) == 10
    actions = [e["action"] for e in audit_entries(stack.client, meta.run_id)]
    assert "admin_read" in actions

    # fewer than 5 samples of a non_viewable split is refused, before any charge
    used = Ledger(stack.client).get(name, "validation").samples_used
    chosen = evalq(url, "submit", "spy", "--dataset", name, "--split", "validation",
                   "--ids", "1,2,3,4,5")  # fmt: skip
    assert chosen.returncode == 3
    assert "its samples are drawn by the server" in chosen.stderr
    small = evalq(url, "submit", "spy", "--dataset", name, "--split", "validation",
                  "--limit", "4")  # fmt: skip
    assert small.returncode == 3
    assert "at least 5 samples" in small.stderr
    assert Ledger(stack.client).get(name, "validation").samples_used == used
    with pytest.raises(TierRefusedError):
        user.submit(SubmitRequest(eval="spy", dataset=name, split="validation", limit=4))


@pytest.mark.integration
def test_budget_survives_a_redis_restart_and_reapplying_policy_never_refunds(
    server: RedisServer, tmp_path: Path
) -> None:
    register_splits(connect(server.url), tmp_path, "demo", "validation")
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "datasets:\n"
        "  demo:\n"
        "    validation:\n"
        "      tier: non_viewable\n"
        "      budget: {runs: 5, samples: 100, max_samples_per_run: 40}\n"
    )
    applied = evalq_in_process(server.url, "policy", "apply", str(policy))
    assert applied.returncode == 0, applied.stderr
    client = connect(server.url)
    charge_run(client, "demo", "validation", "r1", 30, "me")
    charge_run(client, "demo", "validation", "r2", 25, "me")

    server.restart()  # SIGTERM, then a new redis-server replaying the AOF
    ledger = Ledger(connect(server.url))
    budget = ledger.get("demo", "validation")
    assert (budget.runs_used, budget.samples_used) == (2, 55)
    assert TierRegistry(connect(server.url)).resolve("demo", "validation") is Tier.NON_VIEWABLE

    assert evalq_in_process(server.url, "policy", "apply", str(policy)).returncode == 0
    budget = ledger.get("demo", "validation")
    assert (budget.runs_left, budget.samples_left) == (3, 45)
    shown = json.loads(evalq_in_process(server.url, "budget", "show", "--json").stdout)
    assert shown[0]["samples_left"] == 45

    smaller = evalq_in_process(server.url, "budget", "set", "demo", "validation", "--runs", "1",
                    "--samples", "50")  # fmt: skip
    assert smaller.returncode == 0
    budget = ledger.get("demo", "validation")
    assert (budget.runs_left, budget.samples_left, budget.max_samples_per_run) == (0, 0, None)


@pytest.mark.integration
def test_policy_reconciliation(server: RedisServer, tmp_path: Path) -> None:
    register_splits(connect(server.url), tmp_path, "d", "a", "b", "unlisted", "open")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"datasets": {"d": {
        "a": {"tier": "viewable"},
        "b": {"tier": "no_access", "budget": {"runs": 3}},
    }}}))  # fmt: skip
    refused = evalq_in_process(server.url, "policy", "apply", str(bad))
    assert refused.returncode == 2
    assert "d.b" not in refused.stderr
    assert "d/b: a no_access split cannot have a budget" in refused.stderr
    assert TierRegistry(connect(server.url)).lookup("d", "a") is None  # nothing applied

    good = tmp_path / "good.yaml"
    good.write_text(
        "datasets:\n  d:\n    unlisted: {budget: {samples: 10}}\n"
        "    open: {tier: viewable, budget: {runs: 2}}\n"
    )
    applied = evalq_in_process(server.url, "policy", "apply", str(good))
    assert applied.returncode == 0, applied.stderr
    assert "d/unlisted: budgeted with no tier set (no_access), made non_viewable" in applied.stderr
    assert "d/open: budgeted but viewable" in applied.stderr
    tiers = TierRegistry(connect(server.url))
    assert tiers.resolve("d", "unlisted") is Tier.NON_VIEWABLE
    assert tiers.resolve("d", "open") is Tier.VIEWABLE
    malformed = tmp_path / "malformed.yaml"
    malformed.write_text("datasets: {d: {s: {tier: secret}}}\n")
    assert evalq_in_process(server.url, "policy", "apply", str(malformed)).returncode == 2


def test_cancel_refunds_exactly_the_unproduced_samples_once(
    redis_only: RedisServer, tmp_path: Path
) -> None:
    client = connect(redis_only.url)  # no worker: the test decides which samples produced
    write_rows(tmp_path, "validation", labelled_rows(20))
    data = str(tmp_path)
    name = list_splits(client, data, "validation")
    Ledger(client).set(name, "validation", runs=5, samples=100, max_samples_per_run=None,
                       who="admin")  # fmt: skip
    user = Client(
        Settings(redis_url=redis_only.url, archive_url=str(tmp_path / "archive"), principal="agent")
    )
    meta = user.submit(SubmitRequest(eval="spy", dataset=name, split="validation"))
    assert Ledger(client).get(name, "validation").samples_used == 20

    writer = ResultWriter(client)
    writer.record_outputs(meta.run_id, {i: '{"pred": 0}' for i in range(6)})
    writer.record_scores(meta.run_id, {0: {"correct": 1.0}})
    writer.record_errors(meta.run_id, {15: ErrorRecord(stage=Stage.INFER, kind="E", message="x")})

    first = json.loads(evalq_in_process(redis_only.url, "cancel", meta.run_id, "--json").stdout)
    assert first == {"run_id": meta.run_id, "cancelled_now": True, "refunded_samples": 13}
    second = json.loads(evalq_in_process(redis_only.url, "cancel", meta.run_id, "--json").stdout)
    assert second == {"run_id": meta.run_id, "cancelled_now": False, "refunded_samples": 0}
    budget = Ledger(client).get(name, "validation")
    assert (budget.samples_used, budget.runs_used) == (7, 1)
    # nothing is written after cancellation, so the refund stays exact
    assert writer.record_outputs(meta.run_id, {10: '{"pred": 1}'}) == 0
    refunds = [e for e in audit_entries(client) if e["action"] == "refund"]
    assert [(e["run"], e["samples"]) for e in refunds] == [(meta.run_id, "13")]


_KILLED_AFTER = """
import os, signal, sys
from evalq.shared.cli import main
from evalq.shared.access.ledger import Ledger
from evalq.shared.store.runs import RunStore
owner = {"reserve": Ledger, "create": RunStore}[sys.argv[1]]
original = getattr(owner, sys.argv[1])
def then_killed(self, *args, **kwargs):
    original(self, *args, **kwargs)
    os.kill(os.getpid(), signal.SIGKILL)
setattr(owner, sys.argv[1], then_killed)
sys.argv = ["evalq", *sys.argv[2:]]
main()
"""


@pytest.mark.parametrize("step", ["create", "reserve"])
def test_a_producer_killed_at_its_charge_leaves_a_run_and_its_charge_or_neither(
    redis_only: RedisServer, tmp_path: Path, step: str
) -> None:
    """SIGKILLed right after the run is recorded, or right after it is charged (the attack
    review once found 1 run and 100,000 samples charged with no run recorded): whatever runs
    are listed are charged, and nothing else is."""
    write_rows(tmp_path, "validation", labelled_rows(40))
    store = connect(redis_only.url)
    name = list_splits(store, str(tmp_path), "validation")
    Ledger(store).set(name, "validation", runs=5, samples=None, max_samples_per_run=None, who="a")
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_AFTER, step, "submit", "spy", "--dataset", name,
         "--split", "validation"],
        env=cli_env(redis_only.url, EVALQ_PRINCIPAL="agent"), cwd=REPO, capture_output=True,
        text=True, timeout=120, check=False,
    )  # fmt: skip
    assert killed.returncode == -9, killed.stderr
    listed = [str(r) for r in store.zrange(RUNS, 0, -1)]
    budget = Ledger(store).get(name, "validation")
    assert (budget.runs_used, budget.samples_used) == (len(listed), 40 * len(listed))
    assert len(listed) == (1 if step == "reserve" else 0)


def test_a_failed_enqueue_rolls_the_reservation_back_once(
    redis_only: RedisServer, tmp_path: Path
) -> None:
    write_rows(tmp_path, "validation", labelled_rows(8))
    data = str(tmp_path)
    store = connect(redis_only.url)
    name = list_splits(store, data, "validation")
    Ledger(store).set(name, "validation", runs=2, samples=None, max_samples_per_run=None, who="a")
    broken = Settings(redis_url=redis_only.url, broker_url="redis://127.0.0.1:1/0")
    app = create_app(broken)
    app.conf.broker_transport_options["max_retries"] = 0  # refused at once, not after 5 s
    with pytest.raises(Exception, match=r"(?i)connect|refused") as failed:
        Client(broken, app=app).submit(SubmitRequest(eval="spy", dataset=name, split="validation"))
    assert not isinstance(failed.value, PolicyRefusedError)
    budget = Ledger(store).get(name, "validation")
    assert (budget.runs_used, budget.samples_used) == (0, 0)
    (run_id,) = [str(r) for r in store.zrange(RUNS, 0, -1)]
    assert store.hget(RunKeys(run_id).meta, "status") == "cancelled"
    actions = [e["action"] for e in audit_entries(store, run_id)]
    assert actions == ["reserve", "refund"]


def test_resuming_a_queued_run_sends_nothing_that_is_still_queued(
    redis_only: RedisServer, tmp_path: Path
) -> None:
    """20 resumes of a queued run grew its backlog from 390 to 8,190 messages, at no charge."""
    write_rows(tmp_path, "validation", labelled_rows(300))
    store = connect(redis_only.url)
    name = list_splits(store, str(tmp_path), "validation")
    client = Client(
        Settings(redis_url=redis_only.url, principal="agent", archive_url=str(tmp_path))
    )
    run_id = client.submit(SubmitRequest(eval="spy", dataset=name, split="validation")).run_id

    def queued() -> tuple[int, int]:
        return store.llen(RunKeys(run_id).backlog), sum(store.llen(q) for q in ("infer", "score"))

    before = queued()
    assert sum(before) > 0
    for _ in range(20):
        resumed = client.resume(run_id)
        assert (resumed.inference, resumed.scoring) == (0, 0)
    assert queued() == before
    store.delete(RunKeys(run_id).backlog)  # its messages lost: those samples are sent again
    store.delete("infer")
    assert client.resume(run_id).inference == 300
