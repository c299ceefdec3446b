"""Crash safety with real processes: kills, shutdowns, Redis restarts, poison samples, resume
and streaming results (invariant 4: every sample written exactly once, nothing lost)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from evalq.producer.service.client import Client
from evalq.producer.service.submit import SubmitRequest
from evalq.shared.access.ledger import Ledger
from evalq.shared.models import RunMeta, RunStatus
from evalq.shared.settings import Settings
from evalq.shared.store.reader import ResultReader
from tests.conftest import Stack
from tests.helpers import (
    REPO,
    cli_env,
    dataset_name,
    evalq,
    expected_accuracy,
    labelled_rows,
    list_splits,
    wait_ended,
    wait_for,
    write_rows,
)

pytestmark = pytest.mark.integration

N = 800
FAST_RESTORE = "5"  # EVALQ_VISIBILITY_TIMEOUT: a dead worker's messages return after 5 s


def _submit(stack: Stack, folder: Path, n: int = N) -> RunMeta:
    """A run of the ``slow`` eval whose samples from 200 on wait for ``folder/gate``."""
    rows = labelled_rows(n)
    write_rows(folder, "validation", rows)
    name = list_splits(stack.client, str(folder), "validation")
    client = Client(
        Settings(
            redis_url=stack.server.url, archive_url=stack.settings.archive_url, principal="tests"
        )
    )
    gate = {"gate": str(folder / "gate"), "open_until": "200"}
    request = SubmitRequest(eval="slow", dataset=name, split="validation", params=gate)
    return client.submit(request)


def _open_gate(folder: Path) -> None:
    (folder / "gate").touch()


def _view(stack: Stack, run_id: str) -> Client:
    return Client(
        Settings(
            redis_url=stack.server.url, archive_url=stack.settings.archive_url, principal="tests"
        )
    )


def _wait_inferred(stack: Stack, run_id: str, at_least: int = 100) -> None:
    """Wait until the run is under way; with the gate closed it cannot finish meanwhile."""
    client = _view(stack, run_id)
    wait_for(lambda: client.status(run_id).progress.inferred >= at_least, 60, "inference")
    assert client.status(run_id).progress.done < N


def _signal_workers(stack: Stack, sig: signal.Signals, group: bool) -> None:
    for workers in stack.workers:
        for process in workers.processes:
            if group:
                os.killpg(process.pid, sig)
            else:
                process.send_signal(sig)
            process.wait(60)
            assert process.returncode is not None
    stack.workers = []


def _assert_exactly_once(stack: Stack, meta: RunMeta) -> None:
    view = _view(stack, meta.run_id).status(meta.run_id)
    assert view.meta.status is RunStatus.COMPLETED
    assert (view.progress.scored, view.progress.failed) == (meta.n, 0)
    assert view.progress.inferred == meta.n
    scored = set(ResultReader(stack.client).scores(meta.run_id))
    assert scored == set(range(meta.n))
    assert view.aggregate == pytest.approx(
        {"correct": expected_accuracy(labelled_rows(meta.n)), "saw_label": 1.0}
    )


def test_sigkill_mid_run_loses_nothing(fresh_stack: Stack, tmp_path: Path) -> None:
    stack = fresh_stack
    stack.start_workers(EVALQ_VISIBILITY_TIMEOUT=FAST_RESTORE)
    meta = _submit(stack, tmp_path)
    _wait_inferred(stack, meta.run_id)
    _signal_workers(stack, signal.SIGKILL, group=True)  # main process and its pool child
    _open_gate(tmp_path)
    stack.start_workers(EVALQ_VISIBILITY_TIMEOUT=FAST_RESTORE)
    assert wait_ended(stack.client, meta.run_id) is not RunStatus.CANCELLED
    _assert_exactly_once(stack, meta)


def test_sigterm_mid_run_requeues_or_finishes_in_flight_work(
    fresh_stack: Stack, tmp_path: Path
) -> None:
    stack = fresh_stack
    stack.start_workers()  # default visibility timeout: recovery must not depend on it
    meta = _submit(stack, tmp_path)
    _wait_inferred(stack, meta.run_id)
    worker = stack.workers[0].processes[0]
    _open_gate(tmp_path)  # so the batch in hand can finish during the warm shutdown
    _signal_workers(stack, signal.SIGTERM, group=False)  # warm shutdown of the main process
    assert worker.returncode == 0
    stack.start_workers()
    assert wait_ended(stack.client, meta.run_id) is not RunStatus.CANCELLED
    _assert_exactly_once(stack, meta)


def test_redis_restart_mid_run(fresh_stack: Stack, tmp_path: Path) -> None:
    stack = fresh_stack
    stack.crashes_expected = True  # Celery logs the lost connection with a traceback
    stack.start_workers(EVALQ_VISIBILITY_TIMEOUT=FAST_RESTORE)
    Ledger(stack.client).set(dataset_name(tmp_path), "validation", runs=3, samples=5000,
                             max_samples_per_run=None, who="admin")  # fmt: skip
    meta = _submit(stack, tmp_path)
    _wait_inferred(stack, meta.run_id)
    stack.server.restart()  # SIGTERM (AOF flushed), then a new server on the same port
    _open_gate(tmp_path)
    assert wait_ended(stack.client, meta.run_id) is not RunStatus.CANCELLED
    _assert_exactly_once(stack, meta)
    budget = Ledger(stack.client).get(dataset_name(tmp_path), "validation")
    assert (budget.runs_used, budget.samples_used) == (1, N)


@pytest.mark.parametrize(
    ("text", "env"),
    [
        ("please kill the worker", {}),  # os._exit in infer(): the pool process dies
        # killed at the time limit, which a batch of its innocent neighbours (the first in a
        # new pool process builds the shard) must not reach on a loaded machine: with 4 s, a
        # clean-clone CI at load 4.5 killed one such batch three times
        ("this one will hang", {"EVALQ_TASK_TIME_LIMIT": "10"}),
    ],
)
def test_a_sample_that_kills_its_worker_ends_as_one_terminal_error(
    fresh_stack: Stack, tmp_path: Path, text: str, env: dict[str, str]
) -> None:
    stack = fresh_stack
    stack.crashes_expected = True
    stack.start_workers(EVALQ_MAX_ATTEMPTS="3", **env)
    rows = labelled_rows(200)
    rows[7]["text"] = text
    write_rows(tmp_path, "validation", rows)
    name = list_splits(stack.client, str(tmp_path), "validation")
    client = Client(
        Settings(
            redis_url=stack.server.url, archive_url=stack.settings.archive_url, principal="tests"
        )
    )
    meta = client.submit(SubmitRequest(eval="killer", dataset=name, split="validation"))
    assert wait_ended(stack.client, meta.run_id) is not RunStatus.CANCELLED
    view = client.status(meta.run_id)
    assert (view.progress.scored, view.progress.failed) == (199, 1)
    assert view.errors == {"infer/PermanentError": 1}
    (failed,) = [r for r in client.results(meta.run_id) if r.error is not None]
    assert failed.sample_id == 7
    assert failed.error is not None
    assert failed.error.message.startswith("gave up after 3 attempts")


def test_resume_after_a_kill_reenqueues_only_the_missing(
    fresh_stack: Stack, tmp_path: Path
) -> None:
    stack = fresh_stack
    stack.start_workers()  # default visibility timeout: the killed worker's messages stay away
    meta = _submit(stack, tmp_path)
    _wait_inferred(stack, meta.run_id)
    _signal_workers(stack, signal.SIGKILL, group=True)
    _open_gate(tmp_path)
    ids = list(range(N))
    results = ResultReader(stack.client)
    scored = set(results.scores(meta.run_id))
    inferred = results.inferred(meta.run_id, ids)
    used = Ledger(stack.client).get(str(tmp_path), "validation").samples_used

    resumed = evalq(stack.server.url, "resume", meta.run_id, "--json")
    assert resumed.returncode == 0, resumed.stderr
    counts = json.loads(resumed.stdout)
    # what no message carries any more is sent again (the run's backlog still holds what was
    # never dispatched, and the killed worker's messages come back through the janitor)
    assert counts["inference"] <= len([i for i in ids if i not in inferred])
    assert counts["scoring"] <= len([i for i in ids if i in inferred and i not in scored])
    again = json.loads(evalq(stack.server.url, "resume", meta.run_id, "--json").stdout)
    assert (again["inference"], again["scoring"]) == (0, 0)  # nothing sent twice
    assert Ledger(stack.client).get(str(tmp_path), "validation").samples_used == used

    stack.start_workers()
    assert wait_ended(stack.client, meta.run_id) is not RunStatus.CANCELLED
    _assert_exactly_once(stack, meta)  # the aggregate equals a clean run's


def test_results_follow_streams_lines_before_the_run_completes(
    fresh_stack: Stack, tmp_path: Path
) -> None:
    stack = fresh_stack
    stack.start_workers(queues="infer")
    stack.start_workers(queues="score")  # scoring goes on while inference waits at the gate
    meta = _submit(stack, tmp_path, n=400)
    follower = subprocess.Popen(
        [sys.executable, "-c", "from evalq.shared.cli import main; main()",
         "results", meta.run_id, "--follow"],
        env=cli_env(stack.server.url), cwd=REPO, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert follower.stdout is not None
    first = follower.stdout.readline()
    status_at_first_line = _view(stack, meta.run_id).status(meta.run_id).meta.status
    _open_gate(tmp_path)
    rest = follower.stdout.read().splitlines()
    follower.stdout.close()
    assert follower.wait(60) == 0
    assert status_at_first_line is RunStatus.RUNNING
    ids = [json.loads(line)["sample_id"] for line in [first, *rest]]
    assert sorted(ids) == list(range(400))
    assert _view(stack, meta.run_id).status(meta.run_id).meta.status is RunStatus.COMPLETED
