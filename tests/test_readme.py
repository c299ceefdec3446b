"""The README's cheat sheet runs as written: each of its commands, in its order, with the
placeholders (``RUN``, ``ID``, ``task.yaml``, ...) filled in, through the real CLI against a
real Redis and worker, exits 0. A new user ran ``--sweep threshold=0.3,0.5,0.7`` on ``topic`` as
the README showed it and got ``evaluation 'topic' has no parameter 'threshold'``."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from evalq.producer.operations.demo_data import write_demo_dataset
from evalq.producer.service.client import Client
from evalq.producer.service.submit import SubmitRequest
from tests.conftest import Stack
from tests.helpers import REPO, cli_env, cli_in_process, wait_completed

pytestmark = pytest.mark.integration

RUNS_ELSEWHERE = {"demo", "worker", "serve", "up", "metrics"}
"""Commands that start processes and run until stopped: tests/test_demo.py, test_deploy.py,
test_gateway.py and test_monitoring.py run them."""
TASK = """
prompt: "What is {text}?"
target: label
generate: {max_new_tokens: 4}
scorer: exact_match
"""
USERS = ("GATEWAY", "WORKER", "MONITOR")
"""The Redis users ``evalq acl`` writes, each with its password from the environment."""
POLICY = {"datasets": {"news": {"test": {"tier": "non_viewable"}}}}


def cheat_sheet() -> list[list[str]]:
    """The README's cheat sheet: its commands, in order, as argument lists (two commands on a
    line are two; comments dropped)."""
    readme = (REPO / "README.md").read_text()
    block = re.search(r"```bash\n(evalq demo .*?)```", readme, re.S)
    assert block is not None, "the README's cheat sheet is gone"
    commands = []
    for written in block.group(1).splitlines():
        line = written.split(" # ", 1)[0].strip()
        for command in re.split(r"\s{2,}(?=evalq )", line):
            if command:
                commands.append(shlex.split(command)[1:])
    return commands


def _filled(args: list[str], names: dict[str, str]) -> list[str]:
    filled = []
    for arg in args:
        if arg == "[RUN...]":
            continue
        filled.append(names.get(arg, arg))
    return filled


@pytest.mark.timeout(600)  # 2,000 samples of MiniLM through one worker, and 25 commands
def test_the_readme_s_cheat_sheet_runs_as_written(
    fresh_stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stack = fresh_stack
    stack.start_workers()
    write_demo_dataset(tmp_path / "data", validation_size=500)
    (tmp_path / "task.yaml").write_text(TASK)
    (tmp_path / "policy.yaml").write_text(json.dumps(POLICY))
    monkeypatch.chdir(tmp_path)  # ./data, task.yaml, policy.yaml, the files it writes
    passwords = {f"EVALQ_ACL_{user}_PASSWORD": f"{user.lower()}-secret-123" for user in USERS}
    env = cli_env(stack.server.url, EVALQ_ARCHIVE_URL=str(tmp_path / "archive"), **passwords)
    names = {"OTHER": "topic", "NAME": "news-task"}
    commands = cheat_sheet()
    # the dataset the others name is registered and its tiers set first (the sheet lists
    # them with the admin's commands)
    commands.sort(key=lambda args: args[:2] not in (["datasets", "add"], ["tiers", "set"]))
    ran = set()
    for args in commands:
        if args[0] in RUNS_ELSEWHERE or any(a.startswith("s3://") for a in args):
            continue  # object storage: tests/test_object_store.py
        named = names
        if args[0] in ("cancel", "resume"):  # a going run: an ended one is archived
            going = SubmitRequest(eval="topic", dataset="news", split="validation", limit=500)
            admin = Client(stack.settings, admin=True)
            named = {**names, "RUN": admin.submit(going).run_id}
            admin.close()
        answer = cli_in_process(env, *_filled(args, named))
        assert answer.returncode == 0, f"evalq {shlex.join(args)}: {answer.stderr[-800:]}"
        ran.add(args[0])
        if args[0] == "submit":  # a user reads its runs once they ended
            names.update(_runs(stack))
            for run in {names["RUN"], names["RUN_A"], names["RUN_B"]}:
                wait_completed(stack.client, run, 300)
    assert {"submit", "status", "compare", "rescore", "report", "tasks"} <= ran
    assert (tmp_path / "r.parquet").exists()
    assert (tmp_path / "report.html").exists()


def _runs(stack: Stack) -> dict[str, str]:
    """Names for the runs made so far: RUN, the first; RUN_A and RUN_B, the sweep's first
    two (or the first run twice); ID, the sweep."""
    admin = Client(stack.settings, admin=True)
    try:
        views = sorted(admin.recent(50), key=lambda v: v.meta.created)
    finally:
        admin.close()
    swept = [v.meta for v in views if v.meta.sweep]
    first = views[0].meta.run_id
    pair = [m.run_id for m in swept[:2]] or [first, first]
    return {
        "RUN": first, "RUN_A": pair[0], "RUN_B": pair[-1],
        "ID": swept[0].sweep if swept and swept[0].sweep else "none",
    }  # fmt: skip
