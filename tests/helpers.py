"""Test helpers: waiting on conditions with deadlines, test data, running the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import redis

from shared.keys import RunKeys
from shared.models import RunStatus
from shared.policy import Tier
from shared.runs import RunStore
from shared.tiers import TierRegistry
from tests.plugins import predict

T = TypeVar("T")
REPO = Path(__file__).resolve().parent.parent


def wait_for(probe: Callable[[], T], timeout: float = 60.0, what: str = "condition") -> T:
    """Poll ``probe`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def wait_completed(client: redis.Redis, run_id: str, timeout: float = 90.0) -> None:
    """Wait until the run's status is ``completed``; fail after ``timeout`` seconds."""
    runs = RunStore(client)
    wait_for(lambda: runs.get(run_id).status is RunStatus.COMPLETED, timeout, f"run {run_id}")


def wait_ended(client: redis.Redis, run_id: str, timeout: float = 120.0) -> RunStatus:
    """Wait until the run is no longer queued or running; return its status."""
    runs = RunStore(client)

    def ended() -> RunStatus | None:
        status = runs.get(run_id).status
        return None if status.active else status

    status = wait_for(ended, timeout, f"run {run_id} to end")
    assert status is not None
    return status


def assert_settled_once(client: redis.Redis, run_id: str, n: int) -> None:
    """The run completed with each of its ``n`` samples settled exactly once: one score or one
    error (never both), counted once, and listed once in the settled stream."""
    runs = RunStore(client)
    assert runs.get(run_id).status is RunStatus.COMPLETED
    keys = RunKeys(run_id)
    scored = {int(i) for i in client.hkeys(keys.score)}
    failed = {int(i) for i in client.hkeys(keys.err)}
    assert not scored & failed
    assert scored | failed == set(runs.sample_ids(run_id))
    progress = client.hgetall(keys.progress)
    assert int(progress.get("scored", 0)) == len(scored)
    assert int(progress.get("failed", 0)) == len(failed)
    entries: Any = client.xrange(keys.settled)
    streamed = [int(i) for _, fields in entries for i in str(fields["ids"]).split(",")]
    assert sorted(streamed) == sorted(scored | failed)
    assert len(streamed) == n


def write_rows(folder: Path, split: str, rows: list[dict[str, object]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{split}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def list_splits(client: object, dataset: str, *splits: str, tier: str = "viewable") -> None:
    """List ``splits`` of ``dataset`` with ``tier`` (unlisted splits are no_access)."""
    registry = TierRegistry(client)  # type: ignore[arg-type]
    for split in splits:
        registry.set(dataset, split, Tier(tier), who="tests")


def audit_entries(client: object, run_id: str | None = None) -> list[dict[str, str]]:
    """The audit stream's entries, oldest first (only those of ``run_id`` when given)."""
    raw = client.xrange("evalq:audit") or []  # type: ignore[attr-defined]
    entries = [{str(k): str(v) for k, v in (fields or {}).items()} for _, fields in raw]
    return [e for e in entries if run_id is None or e.get("run") == run_id]


def labelled_rows(n: int, salt: str = "") -> list[dict[str, object]]:
    """Rows with a label the spy gets right about a third of the time, and a secret field."""
    rows: list[dict[str, object]] = []
    for i in range(n):
        text = f"sample {salt}{i} " + "x" * (i % 7)
        rows.append({"text": text, "label": (i * 7) % 3, "secret": f"s{i}"})
    return rows


def expected_accuracy(rows: list[dict[str, object]]) -> float:
    return sum(predict(str(r["text"])) == r["label"] for r in rows) / len(rows)


def cli_env(redis_url: str, **extra: str) -> dict[str, str]:
    env = {**os.environ, "EVALQ_REDIS_URL": redis_url, "EVALQ_PLUGINS": "tests.plugins"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.pop("EVALQ_BROKER_URL", None)
    env.update(extra)
    return env


def evalq(redis_url: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run the real ``evalq`` console entry point in a subprocess."""
    return subprocess.run(
        [sys.executable, "-c", "from shared.cli import main; main()", *args],
        env=cli_env(redis_url, **env),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
