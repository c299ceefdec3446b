"""``evalq demo``: private Redis, real workers, the real MiniLM model, 1,000 samples."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from evalq.shared.cli import python
from tests.helpers import REPO, wait_for

pytestmark = pytest.mark.integration


MARK = "EVALQ_TEST_DEMO_MARK"
"""An environment variable only this test's demo (and the workers it starts, which inherit its
environment) carries: the processes counted are the demo's own, never others on the host.
redis-server rewrites its process title over its environment, so the demo's redis-server is
found by the address the demo prints instead."""


def _started_by(mark: str, command: str = "") -> set[int]:
    """Pids whose environment carries ``MARK=mark`` and whose command line has ``command``."""
    needle = f"{MARK}={mark}".encode()
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                environ = (entry / "environ").read_bytes().split(b"\0")
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if needle in environ and command in cmdline:
                found.add(int(entry.name))
    return found


def _demo_redis(output: str) -> set[int]:
    """Pids of the redis-server at the address the demo printed."""
    address = re.search(r"private redis-server on redis://([\d.]+:\d+)/", output)
    assert address, output[-2000:]
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if "redis-server" in cmdline and address.group(1) in cmdline:
                found.add(int(entry.name))
    return found


def _demo_env(mark: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVALQ_")}
    return {**env, MARK: mark}


def _decoys(folder: Path) -> Path:
    """A user's project folder holding modules named like evalq and the folders of its repository:
    evalq run from there must still import its own (each decoy fails loudly if imported)."""
    folder.mkdir()
    for name in ("evalq", "shared", "producer", "worker"):
        decoy = f"raise SystemExit('the decoy {name}.py was imported')\n"
        (folder / f"{name}.py").write_text(decoy)
    return folder


def test_demo_prints_accuracy_over_a_thousand_samples(tmp_path: Path) -> None:
    mark = uuid.uuid4().hex
    env = _demo_env(mark)
    result = subprocess.run(
        [*python("-c", "from evalq.shared.cli import main; main()"),
         "demo", "--samples", "1000", "--out", str(tmp_path), "--json"],
        env=env, cwd=_decoys(tmp_path / "project"), capture_output=True, text=True, timeout=600,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads(result.stdout)
    assert summary["scored"] == 1000
    assert summary["failed"] == 0
    assert summary["aggregate"]["accuracy"] > 0.9
    low, high = summary["stats"]["accuracy"]["ci95"]  # the 95% interval the README promises
    assert low < summary["aggregate"]["accuracy"] < high
    lines = Path(summary["results"]).read_text().splitlines()
    assert len(lines) == 1000
    assert json.loads(lines[0])["output"]["label"]
    worker_log = (tmp_path / "worker-0.log").read_text()
    assert "serves evaluations: arithmetic, null, topic" in worker_log
    assert "Loading weights" not in worker_log  # no progress bar logged as WARNING lines
    assert "tiers of evalq-demo: train viewable, validation viewable, test no_access" in (
        result.stderr
    )
    # everything the demo started is gone: no worker and no redis-server of its own is left
    assert not _started_by(mark)
    assert not _demo_redis(result.stderr)


def test_ctrl_c_stops_everything_the_demo_started(tmp_path: Path) -> None:
    mark = uuid.uuid4().hex
    log = tmp_path / "demo.log"
    with log.open("w") as handle:
        demo = subprocess.Popen(
            [sys.executable, "-c", "from evalq.shared.cli import main; main()",
             "demo", "--samples", "20000", "--out", str(tmp_path)],
            env=_demo_env(mark), cwd=REPO, stdout=handle, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_for(lambda: "run " in log.read_text(), 120, "the demo run to start")
        assert _started_by(mark, "-m evalq.worker"), "the demo started no worker"
        assert _demo_redis(log.read_text()), "the demo's redis-server is not running"
        demo.send_signal(signal.SIGINT)
        assert demo.wait(60) != 0
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait(30)
    assert "accuracy" not in log.read_text()
    assert not _started_by(mark)
    assert not _demo_redis(log.read_text())
