"""The dataset registry, the name rule and per-caller budgets on a real redis-server (no
worker): pinning, one content one split, key collisions, a pinned file that changed, callers
metered apart."""

from __future__ import annotations

from pathlib import Path

import pytest

from evalq.producer.operations.redis_server import RedisServer
from evalq.producer.service.policy_file import apply_policy, load_policy
from evalq.shared.access.ledger import Ledger
from evalq.shared.access.policy import Tier
from evalq.shared.access.registry import DatasetRegistry
from evalq.shared.access.tiers import TierRegistry
from evalq.shared.connection import connect
from evalq.shared.data.loading import spec_of
from evalq.shared.data.spec import LocalSource
from evalq.shared.errors import (
    BudgetExhaustedError,
    DataError,
    InputError,
    SpecError,
    SplitNotFoundError,
)
from evalq.shared.keys import DATASET_FILES, budget_key
from tests.helpers import audit_entries, charge_run, labelled_rows, write_rows


def test_a_dataset_is_pinned_split_by_split_and_audited(
    redis_only: RedisServer, tmp_path: Path
) -> None:
    client = connect(redis_only.url)
    write_rows(tmp_path, "test", labelled_rows(3))
    write_rows(tmp_path, "test-hard", labelled_rows(4))
    record, before = DatasetRegistry(client).add("ds", str(tmp_path), who="op")
    assert before is None
    assert sorted(record.splits) == ["test", "test-hard"]
    source = record.source("test")
    assert isinstance(source, LocalSource)
    assert [Path(f.path).name for f in source.files] == ["test.jsonl"]
    with pytest.raises(SplitNotFoundError, match=r"no split 'tes' \(splits: test, test-hard\)"):
        record.source("tes")
    assert [(e["action"], e["who"], e["dataset"]) for e in audit_entries(client)] == [
        ("dataset", "op", "ds")
    ]
    # re-adding re-pins; a file changed after pinning is refused when read, not evaluated
    (tmp_path / "test.jsonl").write_text('{"text": "other", "label": 0}\n')
    with pytest.raises(SpecError, match="differs from the one pinned for it"):
        spec_of(source, "test")
    again, previous = DatasetRegistry(client).add("ds", str(tmp_path), who="op")
    assert previous == record
    assert spec_of(again.source("test"), "test")[0].n_rows == 1


def test_a_link_or_copy_of_a_registered_file_is_refused(
    redis_only: RedisServer, tmp_path: Path
) -> None:
    client = connect(redis_only.url)
    registry = DatasetRegistry(client)
    held = write_rows(tmp_path / "ds", "test", labelled_rows(5))
    registry.add("ds", str(tmp_path / "ds"), who="op")
    (tmp_path / "link").mkdir()
    (tmp_path / "link" / "train.jsonl").symlink_to(held)
    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / "train.jsonl").write_bytes(held.read_bytes())
    for name in ("link", "copy"):
        with pytest.raises(DataError, match="same content as ds/test"):
            registry.add(name, str(tmp_path / name), who="op")
    (tmp_path / "ds" / "train.jsonl").symlink_to(held)  # a sibling split of the same folder
    with pytest.raises(DataError, match="ds/test and ds/train hold files of the same content"):
        registry.add("ds", str(tmp_path / "ds"), who="op")
    assert [r.name for r in registry.all()] == ["ds"]
    assert set(client.hvals(DATASET_FILES)) == {"ds/test"}


def test_names_with_a_separator_never_share_a_key(redis_only: RedisServer) -> None:
    client = connect(redis_only.url)
    for dataset, split in (("a", "b:c"), ("a:b", "c")):
        with pytest.raises(InputError, match="invalid"):
            Ledger(client).set(dataset, split, runs=1, samples=None, max_samples_per_run=None,
                               who="op")  # fmt: skip
        with pytest.raises(InputError, match="invalid"):
            TierRegistry(client).set(dataset, split, Tier.VIEWABLE, who="op")
    assert client.dbsize() == 0


def test_callers_on_one_split_are_metered_apart(redis_only: RedisServer, tmp_path: Path) -> None:
    client = connect(redis_only.url)
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "datasets:\n  ds:\n    validation:\n      budget: {samples: 100}\n"
        "      principals: {agent-a: {runs: 1}, agent-b: {runs: 2, samples: 30}}\n"
    )
    ledger = Ledger(client)
    warnings = apply_policy(
        load_policy(policy), client, registered={"ds": ["validation"]}, who="op"
    )
    assert warnings == ["ds/validation: budgeted with no tier set (no_access), made non_viewable"]
    charge_run(client, "ds", "validation", "r1", 10, "agent-a")
    with pytest.raises(BudgetExhaustedError, match="ds/validation for agent-a has no runs left"):
        charge_run(client, "ds", "validation", "r2", 10, "agent-a")
    charge_run(client, "ds", "validation", "r3", 20, "agent-b")
    with pytest.raises(BudgetExhaustedError, match="for agent-b has 10 samples left"):
        charge_run(client, "ds", "validation", "r4", 11, "agent-b")
    charge_run(client, "ds", "validation", "r5", 5, "someone")  # the split only
    assert ledger.get("ds", "validation").samples_used == 35
    assert ledger.get("ds", "validation", "agent-a").runs_used == 1
    assert not client.exists(budget_key("ds", "validation", "someone"))
    assert ledger.refund("ds", "validation", "r1", runs=1, samples=10, who="op",
                         submitter="agent-a", reason="cancelled") == 10  # fmt: skip
    assert ledger.get("ds", "validation", "agent-a").runs_used == 0
    assert ledger.get("ds", "validation").samples_used == 25
    shown = [(b.caller, b.runs_total) for b in ledger.all()]
    assert shown == [(None, None), ("agent-a", 1), ("agent-b", 2)]
    with pytest.raises(BudgetExhaustedError, match=r"^budget refused: ds/validation has 75"):
        charge_run(client, "ds", "validation", "r6", 76, "agent-a")
