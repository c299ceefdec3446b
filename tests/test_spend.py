"""The token ledger (:mod:`evalq.shared.store.spend`) on a real redis-server: holds that never take
a budget past its total however many race for it, charges of the usage reported, holds of dead
workers let go after their deadline, and the budgets that show it all."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from evalq.producer.operations.redis_server import RedisServer
from evalq.shared.access.ledger import Ledger
from evalq.shared.connection import connect
from evalq.shared.errors import TokensExhausted
from evalq.shared.keys import HOLDS, UNSENT
from evalq.shared.models import RunMeta
from evalq.shared.store.spend import RunMeter, Scope, TokenSpend
from tests.helpers import evalq_in_process, register_splits, wait_for


def _meta(principal: str = "agent", charged: bool = True) -> RunMeta:
    return RunMeta.model_validate(
        {
            "run_id": "r1", "eval": "sum", "dataset_id": "d", "split": "s", "spec": "f" * 16,
            "n": 10, "created": 1.0, "principal": principal, "charged": charged,
            "status": "running",
        }
    )  # fmt: skip


def _ledger(server: RedisServer, tokens: int | None, caller: str | None = None) -> Ledger:
    ledger = Ledger(connect(server.url))
    ledger.set(
        "d", "s", runs=None, samples=None, max_samples_per_run=None, who="ops", caller=caller,
        tokens=tokens,
    )  # fmt: skip
    return ledger


def test_racing_holds_never_take_a_budget_past_its_total(redis_only: RedisServer) -> None:
    """On the principal's own budget, which it fills alone (on a split's, shared, one principal
    holds at most half of what is left: below)."""
    ledger = _ledger(redis_only, tokens=None)
    _ledger(redis_only, tokens=1000, caller="agent")
    spend = TokenSpend(connect(redis_only.url))
    scope = Scope("d", "s", "agent")
    start = threading.Barrier(8)

    def race(_: int) -> list[str]:
        start.wait()
        got = [spend.hold(scope, 30, 60) for _ in range(20)]
        return [ticket for ticket in got if isinstance(ticket, str)]

    with ThreadPoolExecutor(8) as threads:
        tickets = [t for held in threads.map(race, range(8)) for t in held]
    assert len(tickets) == 1000 // 30  # 160 asked, 33 fit
    budget = ledger.get("d", "s", "agent")
    assert (budget.tokens_reserved, budget.tokens_used, budget.tokens_left) == (990, 0, 10)
    for ticket in tickets:
        spend.charge(scope, ticket, 7)  # each used less than it held
    budget = ledger.get("d", "s", "agent")
    assert (budget.tokens_reserved, budget.tokens_used) == (0, 33 * 7)
    assert ledger.get("d", "s").tokens_used == 33 * 7  # the split's too
    assert set(connect(redis_only.url).hvals(HOLDS)) == {"charged"}  # kept for retries


def test_a_meter_waits_while_holds_could_make_room_and_refuses_when_none_could(
    redis_only: RedisServer,
) -> None:
    _ledger(redis_only, tokens=100)
    spend = TokenSpend(connect(redis_only.url))
    meter = spend.meter(_meta())
    assert isinstance(meter, RunMeter)
    first = meter.hold(85, 1)
    assert first is not None
    assert meter.hold(50, 1) is None  # 85 held: wait, its return may leave room
    meter.charge(first, 80)
    with pytest.raises(TokensExhausted, match=r"d/s exhausted: 80 of 100 used.*need 30"):
        meter.hold(30, 1)  # nothing held: nothing could make room
    assert meter.hold(20, 1) is not None  # a smaller one still fits


def test_a_principal_s_own_token_budget_refuses_apart_from_the_split(
    redis_only: RedisServer,
) -> None:
    _ledger(redis_only, tokens=None)
    _ledger(redis_only, tokens=50, caller="agent")
    spend = TokenSpend(connect(redis_only.url))
    mine, theirs = spend.meter(_meta("agent")), spend.meter(_meta("other"))
    assert mine is not None
    assert theirs is not None
    with pytest.raises(TokensExhausted, match="d/s for agent exhausted"):
        mine.hold(51, 1)
    assert theirs.hold(51, 1) is not None
    assert spend.meter(_meta(charged=False)) is None  # an admin's run: not metered


def test_the_janitor_lets_go_of_holds_past_their_deadline(redis_only: RedisServer) -> None:
    ledger = _ledger(redis_only, tokens=100)
    client = connect(redis_only.url)
    spend = TokenSpend(client)
    scope, theirs = Scope("d", "s", None), Scope("d", "s", "b")  # two: each may hold half
    gone = spend.hold(scope, 40, 0.2)  # its worker died mid-try
    live = spend.hold(theirs, 50, 600)
    assert isinstance(gone, str)
    assert isinstance(live, str)
    # its request may have been served: charged whole, never given back to be spent again
    wait_for(lambda: spend.expire() == 40, 10, "the dead hold to expire")
    budget = ledger.get("d", "s")
    assert (budget.tokens_reserved, budget.tokens_used) == (50, 40)
    assert spend.charge(scope, gone, 12) == 0  # a late return: charged already
    assert spend.charge(theirs, live, 20) == 20
    assert spend.charge(theirs, live, 20) == 0  # sent again (its reply lost): once
    budget = ledger.get("d", "s")
    assert (budget.tokens_reserved, budget.tokens_used) == (0, 60)
    assert spend.expire() == 0
    client.hdel(HOLDS, gone, live)  # forgotten, as a minute after their charge
    assert spend.charge(theirs, live, 90) == 40  # later still: never past the total
    assert ledger.get("d", "s").tokens_used == 100


def test_a_hold_sent_again_holds_once(redis_only: RedisServer) -> None:
    ledger = _ledger(redis_only, tokens=100)
    spend = TokenSpend(connect(redis_only.url))
    scope = Scope("d", "s", None)
    assert spend.hold(scope, 60, 60, ticket="t1") == "t1"
    assert spend.hold(scope, 60, 60, ticket="t1") == "t1"  # its reply was lost: sent again
    assert ledger.get("d", "s").tokens_reserved == 60
    assert spend.charge(scope, "t1", 500) == 60  # at most what it held


def test_a_principal_s_token_budget_counts_from_when_it_is_set(redis_only: RedisServer) -> None:
    ledger = _ledger(redis_only, tokens=None)
    spend = TokenSpend(connect(redis_only.url))
    meter = spend.meter(_meta("agent"))
    assert meter is not None
    ticket = meter.hold(500, 1)
    assert ticket is not None
    meter.charge(ticket, 500)
    _ledger(redis_only, tokens=300, caller="agent")
    assert ledger.get("d", "s", "agent").tokens_left == 300
    assert ledger.get("d", "s").tokens_used == 500


def test_unsent_samples_are_given_back_once(redis_only: RedisServer) -> None:
    client = connect(redis_only.url)
    ledger = _ledger(redis_only, tokens=100)
    meta = _meta()
    ledger.set("d", "s", runs=None, samples=50, max_samples_per_run=None, who="ops", tokens=100)
    client.hset("evalq:budget:d:s", "samples_used", 10)
    client.hset("evalq:facts:{r1}", "n", 10)
    client.sadd(UNSENT, "r1")
    assert ledger.refund_unsent(lambda _: (meta, 4)) == 4
    assert ledger.get("d", "s").samples_used == 6
    client.sadd(UNSENT, "r1")
    assert ledger.refund_unsent(lambda _: (meta, 4)) == 0  # once per run
    assert client.scard(UNSENT) == 0


def test_budget_set_tokens_and_show_json_carry_tokens_total_and_used(
    redis_only: RedisServer, tmp_path: Path
) -> None:
    url = redis_only.url
    register_splits(connect(url), tmp_path, "d", "s")
    policy = tmp_path / "policy.yaml"
    policy.write_text("datasets:\n  d:\n    s:\n      budget: {samples: 10, tokens: 300}\n")
    assert evalq_in_process(url, "policy", "apply", str(policy)).returncode == 0
    spend = TokenSpend(connect(url))
    ticket = spend.hold(Scope("d", "s", None), 100, 60)
    assert isinstance(ticket, str)
    spend.charge(Scope("d", "s", None), ticket, 40)
    shown = json.loads(evalq_in_process(url, "budget", "show", "--json").stdout)
    assert [(b["tokens_total"], b["tokens_used"], b["tokens_left"]) for b in shown] == [
        (300, 40, 260)
    ]
    changed = evalq_in_process(url, "budget", "set", "d", "s", "--tokens", "30")
    assert changed.returncode == 0, changed.stderr
    assert "tokens 0/30 left (40 used)" in changed.stdout  # what was used is kept
    refused = evalq_in_process(url, "budget", "set", "d", "s", "--tokens", "-1")
    assert refused.returncode == 2


def test_one_principal_s_holds_leave_another_its_part_of_a_shared_budget(
    redis_only: RedisServer,
) -> None:
    """Issue #50 (7): one user's 50 slow requests held 5,390 of a split's 5,480 tokens while 90
    were used, and another user's run waited for them and ended unsent. A principal's holds
    on a shared budget now stay within a fair share of what is left."""
    ledger = _ledger(redis_only, tokens=5480)
    spend = TokenSpend(connect(redis_only.url))
    slow, other = Scope("d", "s", "mallory"), Scope("d", "s", "alice")
    spent = spend.hold(slow, 90, 600)
    assert isinstance(spent, str)
    spend.charge(slow, spent, 90)
    held = [spend.hold(slow, 107, 600) for _ in range(50)]
    tickets = [t for t in held if isinstance(t, str)]
    assert 107 * len(tickets) <= (5480 - 90) // 2 + 107  # half of what is left (the first free)
    assert held[-1] == ("share", 5480, 90, 107 * len(tickets))  # refused: wait for its own
    # another principal finds room, up to its own share beside the first's holds
    mine = [spend.hold(other, 107, 600) for _ in range(50)]
    assert isinstance(mine[0], str)
    assert 0 < sum(isinstance(t, str) for t in mine) * 107 <= (5480 - 90) // 3 + 107
    budget = ledger.get("d", "s")
    assert budget.tokens_reserved + budget.tokens_used <= 5480
    for ticket in tickets:  # its requests return: the shares are counted again
        spend.charge(slow, ticket, 0)
    assert isinstance(spend.hold(slow, 107, 600), str)
    client = connect(redis_only.url)
    assert client.hget("evalq:spend:d:s", "holders") == "2"
