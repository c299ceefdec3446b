"""``evalq demo``: private Redis, real workers, the real MiniLM model, 1,000 samples."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, wait_for

pytestmark = pytest.mark.integration


def _processes(marker: str) -> set[int]:
    """Pids whose command line contains ``marker``."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if marker in cmdline:
                found.add(int(entry.name))
    return found


def _demo_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("EVALQ_")}


def test_demo_prints_accuracy_over_a_thousand_samples(tmp_path: Path) -> None:
    before = _processes("-m worker") | _processes("redis-server")
    env = _demo_env()
    result = subprocess.run(
        [sys.executable, "-c", "from shared.cli import main; main()",
         "demo", "--samples", "1000", "--out", str(tmp_path), "--json"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads(result.stdout)
    assert summary["scored"] == 1000
    assert summary["failed"] == 0
    assert summary["aggregate"]["accuracy"] > 0.9
    lines = Path(summary["results"]).read_text().splitlines()
    assert len(lines) == 1000
    assert json.loads(lines[0])["output"]["label"]
    # everything the demo started is gone: no worker and no redis-server of its own is left
    assert (_processes("-m worker") | _processes("redis-server")) <= before


def test_ctrl_c_stops_everything_the_demo_started(tmp_path: Path) -> None:
    before = _processes("-m worker") | _processes("redis-server")
    log = tmp_path / "demo.log"
    with log.open("w") as handle:
        demo = subprocess.Popen(
            [sys.executable, "-c", "from shared.cli import main; main()",
             "demo", "--samples", "20000", "--out", str(tmp_path)],
            env=_demo_env(), cwd=REPO, stdout=handle, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_for(lambda: "run " in log.read_text(), 120, "the demo run to start")
        started = _processes("-m worker") - before
        assert started, "the demo started no worker"
        demo.send_signal(signal.SIGINT)
        assert demo.wait(60) != 0
    finally:
        if demo.poll() is None:
            demo.kill()
    assert "accuracy" not in log.read_text()
    assert not (_processes("-m worker") | _processes("redis-server")) - before
