"""Release rules (exact, rounded, the Ladder) on their own, and the store
that fixes a run's release and moves a caller's Ladder atomically."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from pydantic import ValidationError

from evalq.producer.operations.redis_server import RedisServer
from evalq.producer.service.policy_file import apply_policy, load_policy
from evalq.shared.access.ladder import (
    Best,
    Mechanism,
    Release,
    Released,
    ReleaseRule,
    default_eta,
    on_grid,
    release,
    release_rule,
)
from evalq.shared.access.policy import Access, Reader, Tier
from evalq.shared.access.release import ReleaseStore
from evalq.shared.access.tiers import TierRegistry
from evalq.shared.connection import connect
from evalq.shared.errors import PolicyError, SplitNotFoundError
from evalq.shared.models import RunMeta

LADDER = ReleaseRule(Mechanism.LADDER)


@pytest.mark.parametrize(
    ("samples", "eta"), [(1, 1.0), (5, 0.5), (200, 0.1), (1000, 0.05), (2500, 0.02), (10**4, 0.01)]
)
def test_the_default_eta_is_a_round_step_of_at_least_one_over_root_n(
    samples: int, eta: float
) -> None:
    assert default_eta(samples) == eta
    assert eta * samples**0.5 >= 1 - 1e-9


def test_values_round_to_the_nearest_multiple_of_eta() -> None:
    assert [on_grid(v, 0.1) for v in (0.5, 0.549, 0.55, 0.94, 1.0)] == [0.5, 0.5, 0.6, 0.9, 1.0]


def _one(rule: ReleaseRule, value: float, best: Best | None, samples: int = 200) -> float:
    known = {} if best is None else {"accuracy": best}
    return release(rule, {"accuracy": value}, samples, "r", best=known)["accuracy"].released


def test_the_ladder_moves_only_when_beaten_by_more_than_eta() -> None:
    first = release(LADDER, {"accuracy": 0.512}, 200, "r1", best={})["accuracy"]
    assert (first.released, first.best) == (0.5, Best(0.5, "r1"))
    best = Best(0.5, "r1")
    assert _one(LADDER, 0.6, best) == 0.5  # a gain of eta exactly is a tie
    assert _one(LADDER, 0.59, best) == 0.5
    assert _one(LADDER, 0.1, best) == 0.5  # worse: the best so far
    assert _one(LADDER, 0.61, best) == 0.6
    assert _one(ReleaseRule(Mechanism.LADDER, eta=0.01), 0.512, best) == 0.51


def test_a_loss_ladders_downwards() -> None:
    decisions = release(
        LADDER, {"loss": 0.3}, 200, "r2", best={"loss": Best(0.5, "r1")},
        lower_is_better=frozenset({"loss"}),
    )  # fmt: skip
    assert decisions["loss"].released == 0.3


def test_each_ladder_decision_records_the_margin_it_asked_for() -> None:
    """The audit stream records, per metric, the gain the Ladder asked for: the step, whether
    the Ladder starts, stays or moves (a margin recorded as 0 would say any gain moves it); a
    mechanism without memory asks for none."""
    best = {"accuracy": Best(0.5, "r1")}
    first = release(LADDER, {"accuracy": 0.512}, 200, "r1", best={})["accuracy"]
    stays = release(LADDER, {"accuracy": 0.55}, 200, "r2", best=best)["accuracy"]
    moves = release(LADDER, {"accuracy": 0.7}, 200, "r3", best=best)["accuracy"]
    assert (first.best, stays.best, moves.best) == (Best(0.5, "r1"), None, Best(0.7, "r3"))
    assert [d.margin for d in (first, stays, moves)] == [0.1, 0.1, 0.1]  # default_eta(200)
    fine = ReleaseRule(Mechanism.LADDER, eta=0.02)
    assert release(fine, {"accuracy": 0.55}, 200, "r2", best=best)["accuracy"].margin == 0.02
    for rule in (ReleaseRule(Mechanism.ROUNDED), ReleaseRule(Mechanism.EXACT)):
        assert release(rule, {"accuracy": 0.55}, 200, "r2", best=best)["accuracy"].margin is None


def test_rounded_and_exact_releases_keep_no_state() -> None:
    held = Best(0.9, "r1")
    assert _one(ReleaseRule(Mechanism.ROUNDED), 0.512, held) == 0.5
    assert _one(ReleaseRule(Mechanism.ROUNDED, eta=0.25), 0.62, held) == 0.5
    assert _one(ReleaseRule(Mechanism.EXACT), 0.512, held) == 0.512


def test_only_full_readers_get_exact_values_and_non_viewable_defaults_to_the_ladder() -> None:
    user = Reader("d/s", Tier.NON_VIEWABLE, Access.AGGREGATE)
    admin = Reader("d/s", Tier.NON_VIEWABLE, Access.FULL, admin=True)
    viewable = Reader("d/s", Tier.VIEWABLE, Access.FULL)
    rounded = ReleaseRule(Mechanism.ROUNDED)
    assert release_rule(user, None) == LADDER
    assert release_rule(user, rounded) == rounded
    assert release_rule(admin, rounded).mechanism is Mechanism.EXACT
    assert release_rule(viewable, rounded).mechanism is Mechanism.EXACT


def _flip_attack(rule: ReleaseRule, labels: list[int]) -> float:
    """The single-flip attack on the rule alone: a constant-0 candidate, then one run per item
    flipping only its answer; an item whose run scored higher is a 1. Fraction right."""
    n = len(labels)
    scores = {i: float(y == 0) for i, y in enumerate(labels)}
    best: dict[str, Best] = {}

    def submit(flip: int | None, run: str) -> float:
        per_sample = {i: 1 - s if i == flip else s for i, s in scores.items()}
        decision = release(rule, {"accuracy": sum(per_sample.values()) / n}, n, run, best=best)[
            "accuracy"
        ]
        if decision.best is not None:
            best["accuracy"] = decision.best
        return decision.released

    baseline = submit(None, "base")
    guesses = [int(submit(i, f"flip{i}") > baseline) for i in range(n)]
    return sum(g == y for g, y in zip(guesses, labels, strict=True)) / n


def test_single_flips_never_move_either_ladder_but_read_every_label_exactly() -> None:
    labels = [1] * 100 + [0] * 100
    random.Random(3).shuffle(labels)
    assert _flip_attack(ReleaseRule(Mechanism.EXACT), labels) == 1.0
    assert _flip_attack(LADDER, labels) == 0.5
    assert _flip_attack(ReleaseRule(Mechanism.ROUNDED, eta=0.001), labels) == 1.0


def test_the_paired_ladder_is_refused_with_why() -> None:
    """The paired variant had no leakage bound, and keeping the best run's answers while adding
    one sample forced its margin to zero (the attack review: 200 of 200 labels in 201 runs)."""
    with pytest.raises(ValidationError, match="the paired Ladder was removed"):
        Release.model_validate({"mechanism": "ladder", "paired": True})


def test_release_rules_in_a_policy_file(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(
        "datasets:\n  d:\n    a: {tier: non_viewable, release: rounded}\n"
        "    b: {tier: non_viewable, release: {mechanism: ladder, eta: 0.02}}\n"
        "    c: {tier: non_viewable, release: ladder}\n"
    )
    splits = load_policy(path).datasets["d"]
    rules = {s: p.release.rule() for s, p in splits.items() if p.release is not None}
    assert rules == {
        "a": ReleaseRule(Mechanism.ROUNDED),
        "b": ReleaseRule(Mechanism.LADDER, eta=0.02),
        "c": ReleaseRule(Mechanism.LADDER),
    }


@pytest.mark.parametrize(
    "raw",
    ["ladders", {"mechanism": "exact", "eta": 0.1}, {"mechanism": "rounded", "paired": True},
     {"mechanism": "ladder", "paired": True, "eta": 0.1}, {"mechanism": "ladder", "eta": 0},
     {"mechanism": "ladder", "eta": 2}, {"mechanism": "ladder", "step": 0.1},
     {"mechanism": "ladder", "eta": 5e-324}, {"mechanism": "rounded", "eta": 1e-7},
     {"mechanism": "ladder", "eta": True}, {"mechanism": "ladder", "paired": "yes"}],
)  # fmt: skip
def test_a_malformed_release_rule_is_refused(raw: object) -> None:
    with pytest.raises(ValidationError):
        Release.model_validate(raw)


def _meta(run_id: str) -> RunMeta:
    return RunMeta.model_validate(
        {"run_id": run_id, "eval": "e", "dataset_id": "d", "split": "s", "spec": "x", "n": 200,
         "created": 0.0, "principal": "p", "status": "completed"}
    )  # fmt: skip


def test_a_release_is_fixed_once_and_a_moved_ladder_refuses_a_stale_commit(
    redis_only: RedisServer,
) -> None:
    store = ReleaseStore(connect(redis_only.url))
    meta = _meta("r1")
    decisions = release(LADDER, {"accuracy": 0.5}, 200, "r1", best={})
    released = Released(rule="ladder", aggregate={"accuracy": 0.5}, why={"accuracy": "first run"})
    assert store.commit(meta, "ladder", decisions, {}, {"accuracy": 0.5}) == released
    assert store.best(meta) == {"accuracy": Best(0.5, "r1")}
    # the same run read again keeps its release, whatever a later computation says
    other = release(LADDER, {"accuracy": 0.9}, 200, "r1", best={})
    assert store.commit(meta, "ladder", other, {}, {"accuracy": 0.9}) == released
    # a second run computed against the empty Ladder it read before r1 moved it: refused
    stale = release(LADDER, {"accuracy": 0.3}, 200, "r2", best={})
    assert store.commit(_meta("r2"), "ladder", stale, {}, {"accuracy": 0.3}) is None
    assert store.released("r2") is None
    assert store.best(meta) == {"accuracy": Best(0.5, "r1")}


def test_settling_a_release_takes_one_ladder_round_at_the_first_read(
    redis_only: RedisServer,
) -> None:
    """The Ladder's commit loop: a run's first read decides against the caller's best and
    commits; every later read of it gets the same release; the next run reads the moved best."""
    store = ReleaseStore(connect(redis_only.url))
    first = store.settle(_meta("s1"), LADDER, {"accuracy": 0.512}, 200)
    assert first == Released(rule="ladder, eta 0.1", aggregate={"accuracy": 0.5},
                             why={"accuracy": "first run"})  # fmt: skip
    assert store.settle(_meta("s1"), LADDER, {"accuracy": 0.9}, 200) == first
    stays = store.settle(_meta("s2"), LADDER, {"accuracy": 0.58}, 200)
    assert stays.aggregate == {"accuracy": 0.5}
    moves = store.settle(_meta("s3"), LADDER, {"accuracy": 0.71}, 200)
    assert moves.aggregate == {"accuracy": 0.7}
    assert store.best(_meta("s3")) == {"accuracy": Best(0.7, "s3")}


def test_a_policy_file_past_pythons_integer_limit_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("datasets: {d: {s: {budget: {runs: " + "9" * 5000 + "}}}}\n")
    with pytest.raises(PolicyError, match=r"p\.yaml: Exceeds the limit") as caught:
        load_policy(path)
    assert "\n" not in str(caught.value)


def test_rules_for_splits_that_cannot_use_them_are_warned_about(
    redis_only: RedisServer, tmp_path: Path
) -> None:
    client = connect(redis_only.url)
    TierRegistry(client).set("d", "open", Tier.VIEWABLE, who="op")
    path = tmp_path / "p.yaml"
    path.write_text(
        "datasets:\n  d:\n    open: {release: rounded}\n    shut: {release: rounded}\n"
        "    held: {tier: non_viewable, release: rounded}\n"
    )
    warnings = apply_policy(
        load_policy(path), client, registered={"d": ["open", "shut", "held"]}, who="op"
    )
    assert warnings == [
        "d/open: a release rule on a viewable split (released exactly while viewable)",
        "d/shut: a release rule on a no_access split (nothing is released)",
    ]
    unregistered = r"dataset 'd' has no split 'shut' \(splits: open\)"
    with pytest.raises(SplitNotFoundError, match=unregistered):
        apply_policy(load_policy(path), client, registered={"d": ["open"]}, who="op")
