"""The fair dispatcher's Lua against its Python model (``tests/fair_model.py``): random
scenarios of staging, dispatching, workers taking messages, cancels, withdrawals, the janitor's
depth count and turns ending, played through :class:`evalq.shared.queue.backlog.Backlog` on a
real redis-server and through the model, must leave the same messages in the broker queue in
the same order after every step, and the same virtual times, clocks and turns' models."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from evalq.producer.operations.redis_server import RedisServer
from evalq.shared.connection import connect
from evalq.shared.keys import FAIR, RunKeys
from evalq.shared.models import Priority, RunMeta, RunStatus
from evalq.shared.queue.backlog import INFER_LANE, Backlog, Staged, run_model
from tests.fair_model import FIRST_OF, Entry, FairRound

pytestmark = pytest.mark.integration

QUEUE = INFER_LANE.queue
SCENARIOS = 60
STEPS = 40
PRIORITIES = (Priority.LOW, Priority.NORMAL, Priority.HIGH)
SAMPLES = (1, 7, 64, 100, 256)


@dataclass
class Scenario:
    """One random scenario's runs (each of one principal, priority and model for its life)."""

    rng: random.Random
    metas: dict[str, RunMeta] = field(default_factory=dict)
    ended: set[str] = field(default_factory=set)
    made: int = 0
    messages: int = 0

    def meta(self) -> RunMeta:
        """A run to stage to: a going one, or a new one."""
        going = sorted(set(self.metas) - self.ended)
        if going and self.rng.random() < 0.6:
            return self.metas[self.rng.choice(going)]
        principal = self.rng.choice("abcd")
        self.made += 1
        run_id = f"{principal}{self.made}"
        model = self.rng.choice(["m1", "m2", "m3"])
        self.metas[run_id] = _meta(run_id, model, principal, self.rng.choice(PRIORITIES))
        return self.metas[run_id]


def _snapshot_redis(client: Any) -> dict[str, Any]:
    principals = dict(client.zrange(FAIR.principals, 0, -1, withscores=True))
    return {
        "queue": client.lrange(QUEUE, 0, -1),
        "principals": principals,
        "runs": {p: dict(client.zrange(FAIR.runs(p), 0, -1, withscores=True)) for p in principals},
        "clock": {k: float(v) for k, v in client.hgetall(FAIR.clock).items()},
        "finish": {k: float(v) for k, v in client.hgetall(FAIR.finish).items()},
        "waiting": {k: int(v) for k, v in client.hgetall(FAIR.waiting).items()},
        "turns": {k: v.rsplit("|", 1)[0] for k, v in client.hgetall(FAIR.turn).items()},
    }


def _snapshot_model(model: FairRound) -> dict[str, Any]:
    return {
        "queue": model.queues.get(QUEUE, []),
        "principals": model.principals,
        "runs": {p: model.runs.get(p, {}) for p in model.principals},
        "clock": model.clock,
        "finish": model.finish,
        "waiting": model.waiting,
        "turns": {p: turn[0] for p, turn in model.turn.items()},
    }


def _stage(
    client: Any,
    backlog: Backlog,
    model: FairRound,
    meta: RunMeta,
    entries: list[Entry],
    *,
    refill: int | None = None,
    at_least: int = 0,
) -> None:
    """Stage ``entries`` of ``meta``'s run on both, as ``submit`` or a worker does."""
    client.hset(RunKeys(meta.run_id).meta, "status", "queued")
    staged = [Staged(e.samples, e.queue, e.message) for e in entries]
    got = backlog.stage(meta, staged, INFER_LANE, refill=refill, at_least=at_least)
    want = model.stage(
        meta.run_id, meta.principal, meta.priority.weight, run_model(meta), entries,
        queue=QUEUE, refill=refill, at_least=at_least,
    )  # fmt: skip
    assert got == want


def _step(scenario: Scenario, backlog: Backlog, client: Any, model: FairRound) -> str:
    """One random step on both; what it was, for the failure's story."""
    rng = scenario.rng
    kind = rng.choices(
        ["stage", "dispatch", "take", "withdraw", "cancel", "turns", "depth"],
        weights=[6, 5, 4, 1, 1, 1, 1],
    )[0]
    if kind == "stage":
        meta = scenario.meta()
        samples = rng.choice(SAMPLES)
        entries = []
        for _ in range(rng.randint(1, 6)):
            scenario.messages += 1
            entries.append(Entry(samples, QUEUE, f"{meta.run_id}:{scenario.messages}"))
        refill, at_least = rng.choice([(None, 0), (1, 1), (1, 0)])  # staged, submit, scoring
        _stage(client, backlog, model, meta, entries, refill=refill, at_least=at_least)
        who = f"{meta.run_id}/{meta.principal} w{meta.priority.weight} {run_model(meta)}"
        return f"stage {who} {len(entries)}x{samples} refill={refill} at_least={at_least}"
    if kind == "dispatch":
        depth, at_least = rng.randint(1, 6), rng.randint(0, 2)
        assert backlog.dispatch(QUEUE, depth, at_least=at_least) == model.dispatch(
            QUEUE, depth, at_least=at_least
        )
        return f"dispatch depth={depth} at_least={at_least}"
    if kind == "take":
        count = rng.randint(1, 4)
        for _ in range(count):
            assert client.rpop(QUEUE) == model.pop(QUEUE)
        return f"take {count}"
    if kind in ("withdraw", "cancel"):
        if not scenario.metas:
            return "nothing to cancel"
        run = rng.choice(sorted(scenario.metas))
        scenario.ended.add(run)
        if kind == "cancel":  # cancel.lua deletes the backlog; the dispatcher finds it empty
            client.delete(RunKeys(run).backlog)
            model.backlogs.pop(run, None)
            return f"cancel {run}"
        assert backlog.withdraw(run) == model.withdraw(run)
        return f"withdraw {run}"
    if kind == "turns":  # every turn's time is up (Redis's clock cannot be moved: its deadlines)
        for principal, turn in client.hgetall(FAIR.turn).items():
            client.hset(FAIR.turn, principal, f"{turn.rsplit('|', 1)[0]}|0")
        model.advance(model.turn_seconds)
        return "turns end"
    messages = rng.randint(1, 4)
    backlog.set_depth(messages, ttl=3600)
    model.set_depth(messages)
    return f"depth {messages}"


def test_the_lua_dispatches_in_the_models_order(redis_only: RedisServer) -> None:
    client = connect(redis_only.url)
    for seed in range(SCENARIOS):
        client.flushall()
        rng = random.Random(seed)
        turn = rng.choice([0.0, 3600.0])
        backlog = Backlog(client, turn_seconds=turn)
        model = FairRound(turn_seconds=turn)
        scenario = Scenario(rng)
        story: list[str] = [f"seed {seed}, turns of {turn} s"]
        for _ in range(STEPS):
            story.append(_step(scenario, backlog, client, model))
            assert _snapshot_redis(client) == _snapshot_model(model), "\n".join(story)
        while client.llen(QUEUE) or model.principals:  # drain both to the end
            assert backlog.dispatch(QUEUE, 8) == model.dispatch(QUEUE, 8), "\n".join(story)
            assert _snapshot_redis(client) == _snapshot_model(model), "\n".join(story)
            client.delete(QUEUE)
            model.queues.pop(QUEUE, None)
        assert model.principals == {}
        assert model.owner == {}


def test_the_lua_looks_for_the_turns_model_among_the_64_lowest_runs_as_the_model_does(
    redis_only: RedisServer,
) -> None:
    """``fair_first_of``'s window, which the random scenarios' few runs never fill: a turn on
    m2 whose one run is 64th of the principal's runs, then 65th."""
    client = connect(redis_only.url)
    for ahead in (FIRST_OF - 1, FIRST_OF):
        client.flushall()
        backlog = Backlog(client, turn_seconds=3600)
        model = FairRound(turn_seconds=3600)
        metas = [_meta(f"a{i:02}", "m1") for i in range(ahead)] + [_meta("az", "m2")]
        for meta in metas:
            _stage(client, backlog, model, meta, [Entry(64, QUEUE, f"{meta.run_id}:0")])
        turn = run_model(metas[-1])
        client.hset(FAIR.turn, "a", f"{turn}|{time.time() + 3600:.6f}")
        model.turn["a"] = (turn, model.now + 3600)
        assert backlog.dispatch(QUEUE, 1) == model.dispatch(QUEUE, 1) == 1
        assert _snapshot_redis(client) == _snapshot_model(model)
        assert client.lrange(QUEUE, 0, -1) == ["az:0" if ahead < FIRST_OF else "a00:0"]


def _meta(
    run_id: str, model: str, principal: str = "a", priority: Priority = Priority.NORMAL
) -> RunMeta:
    """A run of ``principal`` on ``model`` (the evaluation's parameter: its warm model)."""
    return RunMeta(
        run_id=run_id, eval="spy", params={"model": model}, spec="s", dataset_id="d", split="v",
        n=640, status=RunStatus.QUEUED, created=0.0, principal=principal, priority=priority,
    )  # fmt: skip
