"""End to end on a real redis-server and real Celery worker processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from evalq.producer.service.submit import SubmitRequest, submit
from evalq.shared.keys import RunKeys
from evalq.shared.models import RunMeta
from evalq.shared.queue.backlog import Backlog
from evalq.shared.queue.celery_app import INFER_QUEUE, INFER_TASK, SCORE_QUEUE, SCORE_TASK
from evalq.shared.queue.sizing import MIN_MESSAGE_SAMPLES, publish, split
from evalq.shared.store.reader import ResultReader
from tests.conftest import Stack
from tests.helpers import (
    expected_accuracy,
    fork_server,
    gateway,
    labelled_rows,
    list_splits,
    wait_completed,
    wait_for,
    write_rows,
)
from tests.plugins import LABELS
from tests.zygote import CLI, WORKER, ForkedProcess

pytestmark = pytest.mark.integration


def _run(stack: Stack, folder: Path, rows: list[dict[str, object]], eval_name: str) -> RunMeta:
    """Write ``rows`` as a validation split, submit them all and wait for completion."""
    write_rows(folder, "validation", rows)
    name = list_splits(stack.client, str(folder), "validation")
    meta = submit(
        stack.client,
        stack.app,
        SubmitRequest(eval=eval_name, dataset=name, split="validation"),
        principal="tests",
        archive=stack.settings.archive_url,
    )
    wait_completed(stack.client, meta.run_id)
    return meta


def test_the_tests_workers_and_gateways_are_forked_by_the_fork_server(
    fresh_stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Most of the suite's time is starting processes: a worker or gateway whose environment
    the fork server accepts (tests/zygote.py) is forked from it, not started anew, whichever
    test pytest is running (``PYTEST_CURRENT_TEST`` differs from when the server started) and
    whatever this process's own environment gained since (a library imported here sets
    variables: lm-eval ``HF_XET_HIGH_PERFORMANCE``; a clean-clone CI forked no worker after)."""
    monkeypatch.setenv("TESTS_A_LIBRARY_SET_THIS", "1")
    other = {"PYTEST_CURRENT_TEST": "tests/test_other.py::test_other (call)"}
    workers = fresh_stack.start_workers(**other)
    forked = all(isinstance(process, ForkedProcess) for process in workers.processes)
    assert forked, fork_server(WORKER).refused
    with gateway(fresh_stack.server.url, tmp_path / "gw.log", **other) as (_, process):
        assert isinstance(process, ForkedProcess), fork_server(CLI).refused


def test_every_sample_scored_once_with_the_direct_aggregate(stack: Stack, tmp_path: Path) -> None:
    rows = labelled_rows(300)
    meta = _run(stack, tmp_path, rows, "spy")

    results = ResultReader(stack.client)
    progress = results.progress(meta.run_id)
    assert (progress.inferred, progress.scored, progress.failed) == (300, 300, 0)
    exported = list(results.results(meta.run_id))
    assert [r.sample_id for r in exported] == list(range(300))
    assert all(r.scores is not None and r.error is None for r in exported)
    assert results.aggregate(meta.run_id) == pytest.approx(
        {"correct": expected_accuracy(rows), "saw_label": 1.0}
    )


def test_infer_never_receives_a_label_field(stack: Stack, tmp_path: Path) -> None:
    meta = _run(stack, tmp_path, labelled_rows(40), "spy")
    outputs = ResultReader(stack.client).outputs(meta.run_id, list(range(40)))
    assert len(outputs) == 40
    for output in outputs.values():
        assert output["fields"] == ["text"]
        assert not set(output["fields"]) & set(LABELS)
    # scoring, in contrast, saw the full row (the spy's saw_label metric is 1.0 for every sample)
    assert ResultReader(stack.client).aggregate(meta.run_id)["saw_label"] == 1.0  # type: ignore[index]


def test_a_failing_sample_is_an_error_record_and_the_run_completes(
    stack: Stack, tmp_path: Path
) -> None:
    rows = labelled_rows(60)
    rows[5]["text"] = "boom goes infer"
    rows[17]["text"] = "bust goes score"
    meta = _run(stack, tmp_path, rows, "flaky")
    results = ResultReader(stack.client)
    progress = results.progress(meta.run_id)
    assert (progress.scored, progress.failed) == (58, 2)
    by_id = {r.sample_id: r for r in results.results(meta.run_id)}
    assert by_id[5].error is not None
    assert by_id[5].error.stage == "infer"
    # infer() raised on every attempt: retried, then one terminal error after MAX_ATTEMPTS (3)
    assert by_id[5].error.message == "boom in the batch (attempt 3 of 3)"
    assert by_id[17].error is not None
    assert by_id[17].error.stage == "score"
    assert by_id[17].output is not None
    good = [r for i, r in enumerate(rows) if i not in (5, 17)]
    right = expected_accuracy(good) * len(good)  # the two failed samples count as wrong
    assert results.aggregate(meta.run_id) == pytest.approx({"correct": right / len(rows)})


def test_malformed_messages_are_dropped_and_the_worker_goes_on(
    stack: Stack, tmp_path: Path
) -> None:
    with stack.app.producer_or_acquire() as producer:
        stack.app.send_task(INFER_TASK, kwargs={"run_id": "x", "rows": [1]}, producer=producer)
        stack.app.send_task(INFER_TASK, args=["positional"], producer=producer)
    _run(stack, tmp_path, labelled_rows(10), "spy")
    stack.wait_logged("dropping an evalq.infer message", count=2)


def test_redelivered_messages_change_no_count_and_no_result(
    fresh_stack: Stack, tmp_path: Path
) -> None:
    stack = fresh_stack
    n = 5 * MIN_MESSAGE_SAMPLES  # five messages, each flushed as a batch of its own
    write_rows(tmp_path, "validation", labelled_rows(n))
    name = list_splits(stack.client, str(tmp_path), "validation")
    meta = submit(
        stack.client,
        stack.app,
        SubmitRequest(eval="spy", dataset=name, split="validation"),
        principal="tests",
        archive=stack.settings.archive_url,
    )
    # Deliver every message twice, as a broker redelivery would: the copy (same task id and
    # body) of each message comes right after the next message, so it lands in a later batch
    # (each message is more than the workers' 16), after the original's outputs are
    # stored and while the run is still going.
    queued = stack.client.lrange(INFER_QUEUE, 0, -1)[::-1]  # consumption order
    queued += list(Backlog(stack.client).messages(meta.run_id))[::-1]
    stack.client.delete(RunKeys(meta.run_id).backlog)
    assert len(queued) == 5
    order = [queued[0]]
    for k in range(1, len(queued)):
        order += [queued[k], queued[k - 1]]
    order.append(queued[-1])
    with stack.client.pipeline(transaction=True) as pipe:
        pipe.delete(INFER_QUEUE)
        pipe.lpush(INFER_QUEUE, *order[::-1])
        pipe.execute()
    stack.start_workers()
    wait_completed(stack.client, meta.run_id)
    results = ResultReader(stack.client)
    aggregate = results.aggregate(meta.run_id)
    # After completion, deliver infer and score messages for finished samples once more.
    again = list(split(meta, list(range(40))))
    publish(stack.app, INFER_TASK, again)
    publish(stack.app, SCORE_TASK, again)
    wait_for(
        lambda: (
            stack.client.llen(INFER_QUEUE) == 0
            and stack.client.llen(SCORE_QUEUE) == 0
            and stack.client.hlen("unacked") == 0
        ),
        60,
        "every duplicate to be consumed and acked",
    )
    progress = results.progress(meta.run_id)
    assert (progress.inferred, progress.scored, progress.failed) == (n, n, 0)
    assert len(results.scores(meta.run_id)) == n
    assert results.aggregate(meta.run_id) == aggregate
    stack.assert_no_task_crashed()
