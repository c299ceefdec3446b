"""What a task, a run or a policy needs is checked before any work, where it is registered
(issue #44, findings 2, 3 and 7): a caller's CLI shows the server's tasks as data whatever
plugins it loaded; a target the scorer cannot score and a prompt field the split lacks are
refused at ``tasks add`` and at submit, before anything is charged; tiers, budgets and
policies attach only to registered splits, and a split no tier was set for reads
``no_access`` in every command."""

from __future__ import annotations

import json
from pathlib import Path

from evalq.producer.service.client import Client
from evalq.shared.access.ledger import Ledger
from evalq.shared.access.policy import Tier
from evalq.shared.access.roles import Role
from evalq.shared.access.tasks import TaskRegistry
from evalq.shared.access.tiers import TierRegistry
from evalq.shared.keys import RUNS
from tests.conftest import Door, Stack
from tests.helpers import NOWHERE, audit_entries, cli_env, gateway, list_splits, write_rows

GSM8K = """
prompt: "Question: {question}\\nAnswer:"
target: answer
generate: {max_new_tokens: 32}
scorer: gsm8k_match
"""
NUMERIC = GSM8K.replace("gsm8k_match", "numeric")
PLUGINS = "tests.plugins,tests.plugins.scorers"
"""The gateway's plugins: the CLIs load ``tests.plugins`` alone, without ``gsm8k_match``."""


def _gsm8k_rows(n: int, salt: str) -> list[dict[str, object]]:
    return [
        {"question": f"{salt} {i}: how many clips did Natalia sell?",
         "answer": f"She sold {i} clips in April, then {i * 2} in May.\n#### {i * 3}"}
        for i in range(n)
    ]  # fmt: skip


def _cells(table: str, *first: str) -> list[str]:
    """The cells of the row of a rich table that begins with the cells ``first``."""
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("│┃").split("│")]
        if cells[: len(first)] == list(first):
            return cells
    raise AssertionError(f"no row {first} in:\n{table}")


def _admin(stack: Stack, door: Door) -> Door:
    """The same door with an admin's rights: the operator, or an admin token."""
    if door.name == "redis":
        return door
    token = Client(stack.settings).create_token(f"checks-admin-{door.name}", Role.ADMIN)
    return Door(door.name, {**door.env, "EVALQ_TOKEN": token})


def test_a_plugin_scorer_the_cli_lacks_is_registered_and_listed(
    stack: Stack, tmp_path: Path
) -> None:
    """Finding 2: the gateway (and the workers) load the plugin registering ``gsm8k_match``,
    the caller's CLI does not; ``tasks add`` is answered as the gateway stored it and
    ``tasks list`` lists it, for admins and users, and for an operator holding Redis."""
    (tmp_path / "gsm.yaml").write_text(GSM8K, encoding="utf-8")
    admin_token = Client(stack.settings).create_token("gsm-admin", Role.ADMIN)
    user_token = Client(stack.settings).create_token("gsm-user", Role.USER)
    with gateway(stack.server.url, tmp_path / "gw.log", EVALQ_PLUGINS=PLUGINS) as (api, _):
        admin = Door("gateway", cli_env(NOWHERE, EVALQ_API_URL=api, EVALQ_TOKEN=admin_token))
        user = Door("gateway", cli_env(NOWHERE, EVALQ_API_URL=api, EVALQ_TOKEN=user_token))
        added = admin.run("tasks", "add", "gsm-plugin", "--file", str(tmp_path / "gsm.yaml"))
        assert (added.returncode, added.stderr) == (0, "")
        assert added.stdout.strip() == "registered task gsm-plugin: generation, scorer gsm8k_match"
        for caller in (admin, user):
            listed = caller.run("tasks", "list", "--json")
            assert listed.returncode == 0, listed.stderr
            found = {t["name"]: t["spec"] for t in json.loads(listed.stdout)}
            assert found["gsm-plugin"]["scorer"] == "gsm8k_match"  # (other tests' lm-eval
            # tasks, on the shared stack, have no scorer of their own)
            table = caller.run("tasks", "list")
            assert table.returncode == 0, table.stderr
            assert "gsm8k_match" in table.stdout
        # a scorer the gateway does not have is refused where the task is registered
        (tmp_path / "bad.yaml").write_text(GSM8K.replace("gsm8k_match", "nope"), encoding="utf-8")
        bad = admin.run("tasks", "add", "gsm-bad", "--file", str(tmp_path / "bad.yaml"))
        assert bad.returncode == 2
        assert bad.stderr.startswith("error: unknown scorer 'nope' (registered: accuracy, ")
        assert "gsm8k_match" in bad.stderr  # the gateway's scorers, not the CLI's
    assert TaskRegistry(stack.client).get("gsm-bad") is None
    operator = Door("redis", cli_env(stack.server.url))  # without the plugin too
    listed = operator.run("tasks", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert "gsm-plugin" in {t["name"] for t in json.loads(listed.stdout)}


def test_a_target_the_scorer_cannot_score_is_refused_at_submit_before_any_charge(
    stack: Stack, door: Door, tmp_path: Path
) -> None:
    """Finding 3: a GSM8K-shaped split (answers ``...#### 72``) under scorer ``numeric`` is
    refused at submit in one line (exit 2), nothing charged, no run; who may read the rows
    sees the value at fault, who may not sees only the problem."""
    write_rows(tmp_path / "data", "test", _gsm8k_rows(6, f"open {door.name}"))
    write_rows(tmp_path / "data", "held", _gsm8k_rows(6, f"held {door.name}"))
    name = list_splits(stack.client, tmp_path / "data", "test")
    TierRegistry(stack.client).set(name, "held", Tier.NON_VIEWABLE, who="tests")
    ledger = Ledger(stack.client)
    for split in ("test", "held"):
        ledger.set(name, split, runs=5, samples=100, max_samples_per_run=None, who="tests")
    task = f"gsm-numeric-{door.name}"
    TaskRegistry(stack.client).add(task, NUMERIC, who="tests")
    before = stack.client.zcard(RUNS)

    def submit(split: str) -> tuple[int, str]:
        found = door.run(
            "submit", task, "--dataset", name, "--split", split, "--model", "hf/org/tiny",
            "--limit", "6",
        )  # fmt: skip
        return found.returncode, found.stderr

    code, said = submit("test")
    assert (code, said.count("\n")) == (2, 1), said
    assert said.startswith(
        "error: sample 0: label field 'answer' is not a number (scorer 'numeric'): "
        "'She sold 0 clips in April"
    ), said
    assert said.rstrip().endswith("(and 5 more of the run's samples)")
    code, said = submit("held")
    assert (code, said.strip()) == (
        2, "error: 6 of the run's 6 samples: label field 'answer' is not a number "
        "(scorer 'numeric')",
    )  # fmt: skip
    assert stack.client.zcard(RUNS) == before
    for split in ("test", "held"):
        budget = ledger.get(name, split)
        assert budget is not None
        assert (budget.runs_used, budget.samples_used) == (0, 0)
    assert not [e for e in audit_entries(stack.client) if e.get("dataset") == name and e.get(
        "action") == "reserve"]  # fmt: skip


def test_tasks_add_checks_the_task_against_a_split_before_storing_it(
    stack: Stack, door: Door, tmp_path: Path
) -> None:
    """Finding 3: ``tasks add --dataset D --split S`` refuses (exit 2, one line, nothing
    stored) a prompt field the split lacks and a target the scorer cannot score; what it
    accepts is stored; without them the scorer and its options are still checked."""
    admin = _admin(stack, door)
    write_rows(tmp_path / "data", "test", _gsm8k_rows(3, f"add {door.name}"))
    name = list_splits(stack.client, tmp_path / "data", "test")

    def add(task: str, text: str, *where: str) -> tuple[int, str]:
        path = tmp_path / f"{task}.yaml"
        path.write_text(text, encoding="utf-8")
        found = admin.run("tasks", "add", task, "--file", str(path), *where)
        return found.returncode, found.stderr.strip()

    split = ("--dataset", name, "--split", "test")
    exact = NUMERIC.replace("numeric", "exact_match")
    lacking = exact.replace("{question}", "{context}")
    base = f"gsm-{door.name}"
    assert add(f"{base}-field", lacking, *split) == (
        2, "error: the split's rows has no field 'context' (the prompt uses it)",
    )  # fmt: skip
    code, said = add(f"{base}-num", NUMERIC, *split)
    assert code == 2
    assert said.startswith("error: sample 0: label field 'answer' is not a number"), said
    assert add(f"{base}-split", exact, "--dataset", name, "--split", "nope") == (
        2, f"error: dataset '{name}' has no split 'nope' (splits: test)",
    )  # fmt: skip
    assert add(f"{base}-tol", exact + "tolerance: 0.5\n") == (
        2, "error: 'tolerance' is not an option of scorer 'exact_match'",
    )  # fmt: skip
    tasks = TaskRegistry(stack.client)
    for refused in ("field", "num", "split", "tol"):
        assert tasks.get(f"{base}-{refused}") is None
    assert add(f"{base}-ok", exact, *split) == (0, "")
    assert tasks.get(f"{base}-ok") is not None


def test_tiers_budgets_and_policies_refuse_unregistered_names(
    stack: Stack, door: Door, tmp_path: Path
) -> None:
    """Finding 7: ``tiers set``, ``budget set`` and ``policy apply`` refuse a dataset or a
    split nobody registered (exit 2, nothing set); a registered split with no tier set reads
    ``no_access`` in ``tiers set``, ``tiers list`` (and its JSON) and ``datasets list``."""
    admin = _admin(stack, door)
    write_rows(tmp_path / "data", "listed", _gsm8k_rows(2, f"tiers {door.name}"))
    write_rows(tmp_path / "data", "fresh", _gsm8k_rows(2, f"fresh {door.name}"))
    name = list_splits(stack.client, tmp_path / "data", "listed")
    ghost = f"nosuchdataset{door.name}"
    for args, expected in [
        (("tiers", "set", ghost, "tset", "viewable"), f"unknown dataset '{ghost}'"),
        (("tiers", "set", name, "tset", "viewable"), f"dataset '{name}' has no split 'tset'"),
        (("budget", "set", ghost, "tset", "--runs", "1"), f"unknown dataset '{ghost}'"),
        (("budget", "set", name, "tset", "--runs", "1"), f"dataset '{name}' has no split"),
    ]:
        found = admin.run(*args)
        assert found.returncode == 2, (args, found.stdout, found.stderr)
        assert found.stderr.startswith(f"error: {expected}"), found.stderr
    for dataset, split in [(ghost, "tset"), (name, "tset")]:
        policy = tmp_path / f"{dataset}.yaml"
        policy.write_text(
            f"datasets:\n  {name}:\n    listed: {{tier: non_viewable}}\n"
            f"  {dataset}:\n    {split}: {{tier: viewable}}\n",
            encoding="utf-8",
        )
        applied = admin.run("policy", "apply", str(policy))
        assert applied.returncode == 2, applied.stderr
    tiers = TierRegistry(stack.client)
    assert tiers.lookup(ghost, "tset") is None
    assert tiers.lookup(name, "tset") is None
    assert tiers.lookup(name, "listed") is Tier.VIEWABLE  # the refused file set nothing
    assert not [b for b in Ledger(stack.client).all() if ghost == b.dataset or b.split == "tset"]

    listed = admin.run("tiers", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)[name] == {"fresh": "no_access", "listed": "viewable"}
    for command in ("tiers", "datasets"):
        table = admin.run(command, "list", COLUMNS="250")
        assert _cells(table.stdout, name, "fresh")[:3] == [name, "fresh", "no_access"], table
    changed = admin.run("tiers", "set", name, "fresh", "viewable")
    assert (changed.returncode, changed.stdout.strip()) == (
        0, f"{name}/fresh: no_access -> viewable",
    )  # fmt: skip
