"""A plugin edited on disk after a worker loaded it: the worker says so in its log, ``status``
shows its code as stale, and ``submit`` warns that the code that will run is not the file."""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path

import pytest

from tests.conftest import Stack
from tests.helpers import evalq, labelled_rows, list_splits, wait_ended, wait_for, write_rows

pytestmark = pytest.mark.integration

PLUGIN = """
import time
from pathlib import Path

from evalq.shared.evaluation import Evaluation, register


@register("edited")
class Edited(Evaluation):
    label_fields = ("label",)

    def infer(self, model, rows):
        while not Path(GATE).exists():  # the test holds the run going while it reads
            time.sleep(0.05)
        return [VERSION for _ in rows]

    def score(self, row, output):
        return {"version": float(output)}


VERSION = 1
GATE = "{gate}"
"""


def test_an_edited_plugin_is_shown_stale_until_the_worker_restarts(
    fresh_stack: Stack, tmp_path: Path
) -> None:
    module = f"edited_{uuid.uuid4().hex[:8]}"
    plugin = tmp_path / "plugins" / f"{module}.py"
    plugin.parent.mkdir()
    gate = tmp_path / "gate"
    gate.touch()
    text = PLUGIN.replace("{gate}", str(gate))
    plugin.write_text(text)
    loaded = hashlib.sha256(plugin.read_bytes()).hexdigest()
    path = os.pathsep.join([str(plugin.parent), os.environ.get("PYTHONPATH", "")])
    env = {"EVALQ_PLUGINS": f"tests.plugins,{module}", "PYTHONPATH": path}
    fresh_stack.start_workers(**env)
    write_rows(tmp_path / "data", "validation", labelled_rows(5))
    name = list_splits(fresh_stack.client, tmp_path / "data", "validation")
    url = fresh_stack.server.url
    submit = ("submit", "edited", "--dataset", name, "--split", "validation", "--json")

    first = evalq(url, *submit, **env)
    assert first.returncode == 0, first.stderr
    assert "warning" not in first.stderr
    run_id = json.loads(first.stdout)["run_id"]
    wait_ended(fresh_stack.client, run_id)
    shown = evalq(url, "status", run_id, **env).stdout
    assert f"code {loaded[:12]}" in shown
    assert "stale" not in shown

    plugin.write_text(text.replace("VERSION = 1", "VERSION = 2"))
    edited = hashlib.sha256(plugin.read_bytes()).hexdigest()
    said = f"runs code {loaded[:12]}, but {plugin} is now {edited[:12]}"
    wait_for(lambda: said in fresh_stack.worker_log(), 60, "the worker to say its code is stale")

    gate.unlink()  # the run goes on while submit reads it: it warns of what runs while it runs
    second = evalq(url, *submit, **env)
    gate.touch()
    assert second.returncode == 0, second.stderr
    assert second.stderr.strip() == (
        f"warning: workers run evaluation 'edited' as code {loaded[:12]} but its file is now "
        f"{edited[:12]} (restart them to run the edit)"
    )
    run_id = json.loads(second.stdout)["run_id"]
    wait_ended(fresh_stack.client, run_id)
    shown = evalq(url, "status", run_id, **env).stdout
    assert f"code {loaded[:12]} (stale: file now {edited[:12]})" in shown
    assert fresh_stack.worker_log().count(said) == 1  # once per change, not per beat or run
