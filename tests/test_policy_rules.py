"""The policy module's rules on their own: no Redis, no worker."""

from __future__ import annotations

from pathlib import Path

import pytest

from evalq.producer.service.policy_file import load_policy
from evalq.producer.service.submit import draw_ids
from evalq.shared.access.policy import (
    MIN_AGGREGATE_SAMPLES,
    Access,
    Tier,
    admit_run,
    admit_sample_choice,
    admit_source,
    admit_split,
    budgeted_tier,
    read_access,
    run_tier,
    server_draws,
    stored_tier,
)
from evalq.shared.access.roles import Caller, Role, admit_admin_flag, admit_owner, require_admin
from evalq.shared.connection import connect, redact
from evalq.shared.errors import ForbiddenError, InputError, PolicyError, TierRefusedError
from evalq.shared.names import check_name, is_name


@pytest.mark.parametrize("raw", [None, "", "VIEWABLE", "viewable ", "public", b"x", 3])
def test_anything_but_a_known_stored_tier_reads_as_no_access(raw: object) -> None:
    assert stored_tier(raw) is Tier.NO_ACCESS


def test_known_stored_tiers_read_as_themselves() -> None:
    assert [stored_tier(t.value) for t in Tier] == list(Tier)


def test_no_access_is_refused_to_a_non_admin_only() -> None:
    with pytest.raises(TierRefusedError, match="d/s is no_access"):
        admit_split("d/s", Tier.NO_ACCESS, admin=False)
    admit_split("d/s", Tier.NO_ACCESS, admin=True)
    admit_split("d/s", Tier.NON_VIEWABLE, admin=False)


def test_a_non_viewable_run_needs_the_floor_unless_admin() -> None:
    below = MIN_AGGREGATE_SAMPLES - 1
    with pytest.raises(TierRefusedError, match=f"at least {MIN_AGGREGATE_SAMPLES} samples"):
        admit_run("d/s", Tier.NON_VIEWABLE, admin=False, samples=below)
    admit_run("d/s", Tier.NON_VIEWABLE, admin=False, samples=MIN_AGGREGATE_SAMPLES)
    admit_run("d/s", Tier.NON_VIEWABLE, admin=True, samples=1)
    admit_run("d/s", Tier.VIEWABLE, admin=False, samples=1)


@pytest.mark.parametrize(
    ("tier", "admin", "samples", "expected"),
    [
        (Tier.VIEWABLE, False, 1, Access.FULL),
        (Tier.NON_VIEWABLE, False, MIN_AGGREGATE_SAMPLES, Access.AGGREGATE),
        (Tier.NON_VIEWABLE, False, MIN_AGGREGATE_SAMPLES - 1, Access.NONE),
        (Tier.NO_ACCESS, False, 1000, Access.NONE),
        (Tier.NON_VIEWABLE, True, 1, Access.FULL),
        (Tier.NO_ACCESS, True, 1, Access.FULL),
    ],
)
def test_read_access(tier: Tier, admin: bool, samples: int, expected: Access) -> None:
    reader = read_access("d/s", tier, admin, samples)
    assert reader.access is expected
    assert reader.bypasses is (admin and tier is not Tier.VIEWABLE)
    assert (reader.withheld is None) is (expected is not Access.NONE)
    if expected is Access.FULL:
        reader.require_samples()
    else:
        with pytest.raises(TierRefusedError, match="per-sample results are not readable"):
            reader.require_samples()


def test_budgets_reconcile_with_tiers() -> None:
    assert budgeted_tier("d/s", None)[0] is Tier.NON_VIEWABLE
    assert budgeted_tier("d/s", Tier.NON_VIEWABLE) == (None, None)
    tier, warning = budgeted_tier("d/s", Tier.VIEWABLE)
    assert tier is None
    assert warning is not None
    with pytest.raises(PolicyError, match="no_access split cannot have a budget"):
        budgeted_tier("d/s", Tier.NO_ACCESS)


def test_a_malformed_policy_file_names_its_line_and_column(tmp_path: Path) -> None:
    broken = tmp_path / "policy.yaml"
    broken.write_text("datasets:\n  d:\n    s: {tier: viewable\n  e: {}\n")
    with pytest.raises(PolicyError) as error:
        load_policy(broken)
    message = str(error.value)
    assert message.startswith(f"{broken} is not valid YAML or JSON: line 4, column 4:")
    assert "\n" not in message


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:hunter2@h:1/0", "redis://:***@h:1/0"),
        ("redis://user:hunter2@h/0", "redis://user:***@h/0"),
        ("redis://h:1/0?password=hunter2&db=1", "redis://h:1/0?password=***&db=1"),
        ("redis://h:1/0", "redis://h:1/0"),
    ],
)
def test_a_redis_url_is_shown_without_its_password(url: str, shown: str) -> None:
    assert redact(url) == shown


@pytest.mark.parametrize("url", ["garbage", "redis://:hunter2@h:notaport/0"])
def test_a_malformed_redis_url_is_one_input_error_without_the_url(url: str) -> None:
    with pytest.raises(InputError, match="EVALQ_REDIS_URL") as error:
        connect(url)
    assert "hunter2" not in str(error.value)


def test_roles_admin_operations_and_other_principals_runs() -> None:
    admin, alice = Caller("root", Role.ADMIN), Caller("alice", Role.USER)
    require_admin(admin, "tiers set")
    with pytest.raises(ForbiddenError, match=r"^forbidden: tiers set needs the admin role"):
        require_admin(alice, "tiers set")
    assert admit_admin_flag(admin, True) is True
    assert admit_admin_flag(alice, False) is False
    with pytest.raises(ForbiddenError, match="--admin"):
        admit_admin_flag(alice, True)
    admit_owner(alice, "r1", "alice")
    admit_owner(admin, "r1", "alice")
    with pytest.raises(ForbiddenError, match="r1 belongs to another principal"):
        admit_owner(alice, "r1", "bob")


def test_an_unregistered_source_is_no_access_to_all_but_admins() -> None:
    assert run_tier(Tier.VIEWABLE, registered=False) is Tier.NO_ACCESS
    assert run_tier(Tier.VIEWABLE, registered=True) is Tier.VIEWABLE
    with pytest.raises(TierRefusedError, match="not a registered dataset"):
        admit_source("/tmp/x/train", registered=False, admin=False)
    admit_source("/tmp/x/train", registered=False, admin=True)


@pytest.mark.parametrize(
    "name", ["a:b", "b:c", "a/b", "", "-x", "{run}", "a b", "x" * 65, "é", "team.pidbox"]
)
def test_names_that_could_share_a_key_are_refused(name: str) -> None:
    assert not is_name(name)
    with pytest.raises(InputError, match="invalid split"):
        check_name("split", name)


def test_documented_names_pass() -> None:
    for name in ("validation", "test-hard", "train-clean-100", "MMLU_pro", "x" * 64):
        assert check_name("dataset name", name) == name


def test_the_server_draws_a_non_viewable_runs_samples_for_non_admins() -> None:
    assert server_draws(Tier.NON_VIEWABLE, admin=False)
    assert not server_draws(Tier.NON_VIEWABLE, admin=True)
    assert not server_draws(Tier.VIEWABLE, admin=False)
    with pytest.raises(TierRefusedError, match="drawn by the server"):
        admit_sample_choice("d/s", Tier.NON_VIEWABLE, admin=False, ids_given=True)
    admit_sample_choice("d/s", Tier.NON_VIEWABLE, admin=False, ids_given=False)
    admit_sample_choice("d/s", Tier.NON_VIEWABLE, admin=True, ids_given=True)
    admit_sample_choice("d/s", Tier.VIEWABLE, admin=False, ids_given=True)


def test_drawn_ids_are_a_uniform_subset_or_the_whole_split() -> None:
    assert draw_ids(7, None) == list(range(7))
    assert draw_ids(7, 70) == list(range(7))
    draws = [tuple(draw_ids(1000, 5)) for _ in range(50)]
    assert all(len(set(d)) == 5 and list(d) == sorted(d) for d in draws)
    assert all(0 <= i < 1000 for d in draws for i in d)
    assert len(set(draws)) == 50  # fresh draws (two equal 5-subsets of 1000: odds ~1e-10)
    assert sum(i < 500 for d in draws for i in d) in range(75, 176)  # about half, not the head
