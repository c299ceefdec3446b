"""The boundary on the worker side: what the gateway decides by is written where the ``worker``
credential cannot write (``evalq:facts:{run}``), so a record rewritten with that credential (from
a compromised worker, or code beside one) changes nothing the gateway serves, deletes nothing
outside the archive and refunds nothing. The attack review's scripts, replayed on a real
redis-server with the ACL file, workers holding the ``worker`` user and the gateway on uvicorn.
"""

from __future__ import annotations

import contextlib
import json
import random
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import redis

from evalq.shared.access.policy import Tier
from evalq.shared.errors import EvalqError
from evalq.shared.keys import RUNS, RunKeys, budget_key
from evalq.shared.models import RunStatus
from tests.helpers import Server, gateway, wait_for, write_rows
from tests.test_endpoint import SUM
from tests.test_gateway import Door, _run_id, door  # noqa: F401

pytestmark = pytest.mark.integration


def _completed(door: Door, *args: str) -> str:  # noqa: F811
    """A run of alice's on the held-out split, followed to its end."""
    run_id = _run_id(
        door.cli(door.alice, "submit", "spy", "--dataset", "ds", "--split", "hidden", "--json",
                 *args)
    )  # fmt: skip
    wait_for(lambda: door.operator.status(run_id).meta.status is RunStatus.COMPLETED, 90, "end")
    return run_id


def test_a_record_rewritten_by_the_worker_credential_changes_what_the_gateway_serves_not_at_all(
    door: Door,  # noqa: F811
) -> None:
    """The critical finding: ``HSET evalq:{R}:meta dataset_id … split validation`` on the
    caller's own non_viewable run made ``GET /v1/runs/R/results`` serve every label."""
    run_id = _completed(door)
    worker = door.redis("worker")
    keys = RunKeys(run_id)
    with pytest.raises(redis.exceptions.NoPermissionError):
        worker.hset(keys.facts, "split", "validation")
    worker.hset(keys.meta, mapping={"dataset_id": "ds", "split": "validation", "principal": "x"})
    shown = door.cli(door.alice, "results", run_id)
    assert shown.returncode == 3, shown.stdout[:200]
    assert shown.stderr.startswith("error: tier refused: ds/hidden is non_viewable")
    status = json.loads(door.cli(door.alice, "status", run_id, "--json").stdout)
    assert (status["split"], status["tier"], status["principal"]) == (
        "hidden", "non_viewable", "alice",
    )  # fmt: skip
    assert door.cli(door.bob, "status", run_id).returncode == 3  # still alice's


def test_a_rewritten_archive_record_deletes_nothing_outside_the_archive(
    door: Door,  # noqa: F811
    tmp_path: Path,
) -> None:
    """``HSET … archive_url file:///…/important/attempt``, then an admin's purge deleted that
    directory recursively."""
    run_id = _completed(door)
    victim = tmp_path / "important" / "attempt"
    victim.mkdir(parents=True)
    (victim / "keep.txt").write_text("keep")
    door.redis("worker").hset(RunKeys(run_id).meta, "archive_url", f"file://{victim}")
    shown = door.cli(door.admin_token, "results", run_id, "--admin")
    assert shown.returncode == 1
    assert "outside the run's own folder" in shown.stderr
    purged = door.cli(door.admin_token, "purge", "--run", run_id, "--json")
    assert purged.returncode == 0, purged.stderr
    assert json.loads(purged.stdout) == {"purged": [run_id]}
    assert (victim / "keep.txt").read_text() == "keep"


def test_a_rewritten_record_refunds_nothing(door: Door) -> None:  # noqa: F811
    """``HSET … status running n 1000000000`` + ``DEL evalq:{R}:refund`` + the owner's cancel
    refunded 900 spent samples, so over-budget submits were accepted. The count and the refund
    mark are facts now, and so is the end of a run a producer saw end (its results may be
    archived, so none is found in Redis to count)."""
    door.operator.set_budget("ds", "hidden", runs=None, samples=1000, max_samples_per_run=None)
    store = door.redis("gateway")
    before = int(store.hget(budget_key("ds", "hidden"), "samples_used") or 0)
    run_id = _completed(door)
    charged = int(store.hget(budget_key("ds", "hidden"), "samples_used") or 0)
    assert charged == before + 20
    worker = door.redis("worker")
    keys = RunKeys(run_id)
    worker.hset(keys.meta, mapping={"status": "running", "n": 1_000_000_000})
    forges: list[Callable[[], object]] = [
        lambda: worker.delete(keys.facts),
        lambda: worker.hset(keys.facts, "n", 1_000_000_000),
        lambda: worker.hdel(keys.facts, "refunded"),
    ]
    for forge in forges:
        with pytest.raises(redis.exceptions.NoPermissionError):
            forge()
    cancelled = door.cli(door.alice, "cancel", run_id)
    assert cancelled.returncode == 1, cancelled.stdout
    assert "has already finished" in cancelled.stderr
    assert int(store.hget(budget_key("ds", "hidden"), "samples_used") or 0) == charged


def test_a_gateway_killed_during_submits_leaves_the_ledger_balanced(
    door: Door,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Gateways SIGKILLed at random moments while each handles a burst of submits (the attack
    review once charged 1 run and 100,000 samples with no run recorded): every charge belongs
    to a run that is listed, and every listed run is charged, once."""
    rows = [{"text": f"row {i}", "label": i % 2} for i in range(5_000)]
    write_rows(tmp_path / "big", "validation", rows)
    door.operator.add_dataset("big", str(tmp_path / "big"))
    door.operator.set_tier("big", "validation", Tier.VIEWABLE)
    door.operator.set_budget("big", "validation", runs=None, samples=None, max_samples_per_run=None)
    body = {"eval": "spy", "dataset": "big", "split": "validation"}
    chance = random.Random(28)
    for attempt in range(4):
        with gateway(door.url("gateway"), tmp_path / f"gateway-{attempt}.log") as (api, process), \
                httpx.Client(base_url=api, timeout=30) as http:  # fmt: skip
            headers = {"Authorization": f"Bearer {door.alice}"}
            with ThreadPoolExecutor(5) as pool:
                sent = [pool.submit(http.post, "/v1/runs", json=body, headers=headers)
                        for _ in range(5)]  # fmt: skip
                time.sleep(chance.uniform(0.05, 1.5))  # a random moment to kill at, not a wait
                process.kill()
                for request in sent:
                    with contextlib.suppress(httpx.HTTPError):
                        request.result()
    store = door.redis("gateway")
    listed = [str(r) for r in store.zrange(RUNS, 0, -1)]
    facts = {r: store.hgetall(RunKeys(r).facts) for r in listed}
    mine = {r: f for r, f in facts.items() if f.get("dataset_id") == "big"}
    assert all(f["charged"] == "True" and "refunded" not in f for f in mine.values())
    budget = store.hgetall(budget_key("big", "validation"))
    assert int(budget.get("runs_used", 0)) == len(mine)
    assert int(budget.get("samples_used", 0)) == sum(int(f["n"]) for f in mine.values())
    for run_id in mine:  # their samples are not this module's other tests' business
        with contextlib.suppress(EvalqError):
            door.operator.cancel(run_id)


@pytest.fixture(scope="module")
def endpoint(door: Door, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:  # noqa: F811
    """The scripted OpenAI-compatible server, listed in the policy; the ``sum-chat`` task and
    a viewable split of 12 sums with token budgets (100,000 for the split, 50,000 for alice),
    set up as an operator would, through the gateway with the admin token."""
    root = tmp_path_factory.mktemp("endpoint")
    server = Server(root / "server.log", key=None)  # the workers here hold no key
    try:
        rows = [{"a": i, "b": 2 * i, "answer": str(3 * i)} for i in range(12)]
        write_rows(root / "sums", "validation", rows)
        (root / "sum.yaml").write_text(SUM.replace("CHAT", "true"))
        (root / "policy.yaml").write_text(f"endpoints:\n  {server.base}: {{}}\n")
        for step in (
            ["datasets", "add", "sums", "--data", str(root / "sums")],
            ["tiers", "set", "sums", "validation", "viewable"],
            ["tasks", "add", "sum-chat", "--file", str(root / "sum.yaml")],
            ["policy", "apply", str(root / "policy.yaml")],
            ["budget", "set", "sums", "validation", "--tokens", "100000"],
            ["budget", "set", "sums", "validation", "--tokens", "50000", "--principal", "alice"],
        ):
            done = door.cli(door.admin_token, *step)
            assert done.returncode == 0, (step, done.stderr)
        yield server
    finally:
        server.stop()


def _submit_sums(door: Door, server: Server, *args: str) -> subprocess.CompletedProcess[str]:  # noqa: F811
    return door.cli(
        door.alice, "submit", "sum-chat", "--dataset", "sums", "--split", "validation",
        "--model", "openai/served", "--model-arg", f"base_url={server.base}", *args,
    )  # fmt: skip


def test_a_user_s_metered_endpoint_run_completes_under_the_acl_file(
    door: Door,  # noqa: F811
    endpoint: Server,
) -> None:
    """Issue #50 (3): every sample of a user's endpoint run on a split with a token budget
    ended ``infer/NoPermissionError: … may not EVALSHA evalq:holds … evalq:budget:sums:…``:
    the token script named the budgets, which the ``worker`` user may only read, among its
    keys."""
    followed = _submit_sums(door, endpoint, "--follow", "--json")
    run_id = _run_id(followed)
    status = json.loads(door.cli(door.alice, "status", run_id, "--json").stdout)
    assert status["errors"] == {}, status["errors"]
    assert status["status"] == "completed"
    assert status["stats"]["exact_match"]["mean"] == 1.0
    shown = json.loads(door.cli(door.alice, "budget", "show", "--json").stdout)
    used = {(b["dataset"], b["caller"]): b["tokens_used"] for b in shown}
    # 12 samples of 11 tokens each (10 words asked, 1 answered), on both budgets
    assert used[("sums", None)] == used[("sums", "alice")] == 12 * 11


def test_a_user_may_ask_an_endpoint_no_longer_timeout_nor_more_concurrency_than_listed(
    door: Door,  # noqa: F811
    endpoint: Server,
) -> None:
    """Issue #50 (7): ``--model-arg timeout=3600 concurrency=256`` against a server answering
    after 120 s held every worker process and the split's token budget. The endpoint's entry
    bounds both (defaults 120 s and 16); a run asking more is refused at submit, exit 3."""
    for arg, line in (
        ("timeout=3600", "allows timeout=120 at most, not 3600 (its max_timeout"),
        ("concurrency=256", "allows concurrency=16 at most, not 256 (its max_concurrency"),
    ):
        refused = _submit_sums(door, endpoint, "--model-arg", arg)
        assert refused.returncode == 3, refused.stdout
        assert refused.stderr.startswith("error: model refused: endpoint ")  # one line:
        assert refused.stderr.endswith(f" {line} in the policy's endpoints:)\n")
        assert refused.stderr.count("\n") == 1
    allowed = _submit_sums(door, endpoint, "--model-arg", "timeout=120", "--follow")
    assert allowed.returncode == 0, allowed.stderr
