"""What a person sees when something goes other than planned, through both doors (Redis
directly, and the gateway holding only a token): Ctrl-C while following, a malformed run id,
a dataset name typo, a gateway without the plugin, ``runs`` at 80 columns."""

from __future__ import annotations

import select
import signal
import subprocess
import time
from pathlib import Path

import pytest

from evalq.producer.service.client import Client
from evalq.shared.access.roles import Role
from evalq.shared.keys import RUNS
from tests.conftest import Door, Stack
from tests.helpers import (
    NOWHERE,
    cli_env,
    gateway,
    labelled_rows,
    list_splits,
    wait_ended,
    write_rows,
)

pytestmark = pytest.mark.integration


def _line_with(process: subprocess.Popen[str], needle: str, timeout: float = 60) -> str:
    """The first line of ``process``'s stdout that holds ``needle`` (waiting on the output,
    with a deadline)."""
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        ready, _, _ = select.select([process.stdout], [], [], 0.5)
        if ready:
            line = process.stdout.readline()
            seen.append(line)
            if needle in line:
                return line
            if not line:
                break
    raise AssertionError(f"no line with {needle!r} in {seen!r}")


@pytest.mark.parametrize("command", ["submit", "watch"])
def test_ctrl_c_while_following_says_the_run_goes_on_and_exits_130(
    stack: Stack, door: Door, tmp_path: Path, command: str
) -> None:
    write_rows(tmp_path / "data", "validation", labelled_rows(20))
    name = list_splits(stack.client, tmp_path / "data", "validation")
    gate = tmp_path / "gate"
    submit = ("submit", "slow", "--dataset", name, "--split", "validation",
              "--param", f"gate={gate}", "--param", "open_until=4")  # fmt: skip
    run_id = ""
    try:
        if command == "submit":
            process = door.popen(*submit, "--follow")
            run_id = _line_with(process, "").strip()
        else:
            submitted = door.run(*submit)
            assert submitted.returncode == 0, submitted.stderr
            run_id = submitted.stdout.strip()
            process = door.popen("watch", run_id)
        _line_with(process, f"{run_id} slow validation: ")
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
        assert process.returncode == 130, stderr
        assert stderr.strip().splitlines()[-1] == (
            f"detached: run {run_id} goes on (evalq watch {run_id}, evalq cancel {run_id})"
        )
        assert "Traceback" not in stderr
    finally:
        gate.touch()
        if run_id:
            wait_ended(stack.client, run_id)


RUN_ID_COMMANDS = [
    ["status"], ["watch"], ["cancel"], ["resume"], ["results"], ["report"],
    ["rescore", "--eval", "spy"], ["compare", "0123abcd"],
]  # fmt: skip


@pytest.mark.parametrize("command", RUN_ID_COMMANDS, ids=lambda c: c[0])
def test_a_malformed_run_id_is_no_run(door: Door, command: list[str]) -> None:
    result = door.run(command[0], *command[1:], "nonexistent")
    assert (result.returncode, result.stderr.strip()) == (2, "error: no run 'nonexistent'")


def test_a_run_id_with_a_newline_is_no_run_in_one_line(door: Door) -> None:
    """The attack review: ``status $'0123abcd\\n'`` printed ``no run '0123abcd`` and ``'`` on a
    second line (and the gateway answered the raw newline)."""
    result = door.run("status", "0123abcd\n")
    assert (result.returncode, result.stderr.strip()) == (2, "error: no run '0123abcd\\n'")


def test_a_well_formed_run_id_of_no_run_is_no_run(door: Door) -> None:
    result = door.run("status", "0123abcd")
    assert (result.returncode, result.stderr.strip()) == (2, "error: no run '0123abcd'")


def test_a_dataset_name_typo_is_bad_input_with_a_suggestion_for_admins_only(
    stack: Stack, door: Door, tmp_path: Path
) -> None:
    write_rows(tmp_path / "data", "validation", labelled_rows(5))
    name = list_splits(stack.client, tmp_path / "data", "validation")
    typo = name[:-1]
    before = stack.client.zcard(RUNS)
    user = door.run("submit", "spy", "--dataset", typo, "--split", "validation")
    assert user.returncode == 2, user.stderr
    if door.name == "gateway":  # a user: no hint of which datasets exist
        assert user.stderr.strip() == f"error: unknown dataset '{typo}'"
    else:  # an operator holding Redis may list every dataset anyway
        assert user.stderr.strip() == f"error: unknown dataset '{typo}'; did you mean '{name}'?"
    assert stack.client.zcard(RUNS) == before


def test_an_admin_token_gets_the_suggestion(
    stack: Stack, served: tuple[str, str], tmp_path: Path
) -> None:
    write_rows(tmp_path / "data", "validation", labelled_rows(5))
    name = list_splits(stack.client, tmp_path / "data", "validation")
    token = Client(stack.settings).create_token("ux-admin", Role.ADMIN)
    api, _ = served  # the users' gateway: what a token may do is the token's
    admin = Door("gateway", cli_env(NOWHERE, EVALQ_API_URL=api, EVALQ_TOKEN=token))
    found = admin.run("submit", "spy", "--dataset", name[:-1], "--split", "validation")
    assert (found.returncode, found.stderr.strip()) == (
        2, f"error: unknown dataset '{name[:-1]}'; did you mean '{name}'?"
    )  # fmt: skip
    far = admin.run("submit", "spy", "--dataset", "zzzzzz", "--split", "validation")
    assert (far.returncode, far.stderr.strip()) == (
        2, "error: unknown dataset 'zzzzzz' (evalq datasets list)"
    )  # fmt: skip


def test_a_gateway_without_the_plugin_says_it_lacks_it(stack: Stack, tmp_path: Path) -> None:
    write_rows(tmp_path / "data", "validation", labelled_rows(5))
    name = list_splits(stack.client, tmp_path / "data", "validation")
    token = Client(stack.settings).create_token("ux-plain", Role.USER)
    with gateway(stack.server.url, tmp_path / "gateway.log", EVALQ_PLUGINS="") as (api, _):
        plain = Door("gateway", cli_env(NOWHERE, EVALQ_API_URL=api, EVALQ_TOKEN=token))
        found = plain.run("submit", "spy", "--dataset", name, "--split", "validation")
    assert (found.returncode, found.stderr.strip()) == (
        2,
        "error: the gateway has no evaluation 'spy' (it loads: arithmetic, null, topic; "
        "plugins come from EVALQ_PLUGINS on the gateway)",
    )


def test_runs_fits_80_columns_one_line_per_run(stack: Stack, door: Door, tmp_path: Path) -> None:
    write_rows(tmp_path / "data", "validation", labelled_rows(8))
    name = list_splits(stack.client, tmp_path / "data", "validation")
    tag = f"narrow-{door.name}"
    run_ids = []
    for flip in ("sample", "x" * 60):
        submitted = door.run(
            "submit", "guess", "--dataset", name, "--split", "validation", "--param",
            f"flip={flip}", "--param", "use_cue=0", "--tag", tag, "--tag", "a-long-tag-" * 3,
        )  # fmt: skip
        assert submitted.returncode == 0, submitted.stderr
        run_ids.append(submitted.stdout.strip())
    for run_id in run_ids:
        wait_ended(stack.client, run_id)
    listed = door.run("runs", "--tag", tag, COLUMNS="80")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.rstrip("\n").splitlines()
    assert all(len(line) <= 80 for line in lines), listed.stdout
    for run_id in run_ids:
        assert sum(run_id in line for line in lines) == 1, listed.stdout
    assert len(lines) <= len(run_ids) + 2, listed.stdout  # a header (and its rule) and the runs
