"""The batch pipeline in-process: ``infer_batch`` / ``score_batch`` and the stores' Lua, driven
with :class:`Resources` on a real redis-server and a recording publisher; no worker, no Celery.

Worker subprocesses are for real kills and restarts (``test_recovery.py``); the logic between
a message and a stored result (retries, solo messages, attempts, cancelled runs, settling) is
exercised here, where a broken branch fails in milliseconds.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

from evalq.producer.operations.redis_server import RedisServer
from evalq.producer.service.client import Client
from evalq.producer.service.direct import Direct
from evalq.shared.access.disclosure import Stall
from evalq.shared.access.policy import Tier
from evalq.shared.access.tasks import TaskRegistry
from evalq.shared.access.tiers import TierRegistry
from evalq.shared.connection import connect
from evalq.shared.data.loading import build_spec
from evalq.shared.data.spec import publish_spec
from evalq.shared.evaluation import Evaluation, load_plugins, register
from evalq.shared.keys import TASKS, RunKeys, tiers_key
from evalq.shared.models import ErrorRecord, RunMeta, RunStatus, SampleTask, Stage
from evalq.shared.queue.celery_app import INFER_TASK, SCORE_TASK
from evalq.shared.queue.sizing import split
from evalq.shared.services import Services
from evalq.shared.settings import Settings
from evalq.shared.store.labels import LabelFields
from evalq.shared.store.reader import ResultReader
from evalq.shared.store.runs import RunStore
from evalq.shared.store.writer import Delivery, ResultWriter
from evalq.worker.batch import Resources
from evalq.worker.inference import infer_batch
from evalq.worker.runtime_pool import RuntimePool
from evalq.worker.scoring import score_batch
from evalq.worker.shard_cache import ShardCache
from tests.helpers import ended_view, labelled_rows, record_run, write_rows

pytestmark = pytest.mark.integration

MAX_ATTEMPTS = 3


@dataclass
class Recorder:
    """The publisher the pipeline is given: keeps what it would have sent."""

    sent: list[tuple[str, SampleTask]] = field(default_factory=list)

    def __call__(self, task_name: str, tasks: list[SampleTask]) -> int:
        self.sent += [(task_name, task) for task in tasks]
        return len(tasks)

    def stage_scoring(self, meta: RunMeta, sample_ids: list[int]) -> int:
        """What an inference-only worker stages in a run's score backlog, kept as sent."""
        return self(SCORE_TASK, list(split(meta, sample_ids)))

    def ids(self, task_name: str, *, solo: bool | None = None) -> list[int]:
        return [
            i
            for name, task in self.sent
            if name == task_name and (solo is None or task.solo is solo)
            for i in task.sample_ids
        ]


@dataclass
class Bench:
    client: redis.Redis
    res: Resources
    sent: Recorder
    data: Path

    def run(
        self, eval_name: str, rows: list[dict[str, object]], principal: str = "", **params: str
    ) -> RunMeta:
        """A recorded run of ``eval_name`` over ``rows`` (a split of its own), of
        ``principal``."""
        split = f"s{uuid.uuid4().hex[:8]}"
        write_rows(self.data, split, rows)
        spec, _ = build_spec(str(self.data), split)
        publish_spec(self.client, spec)
        meta = RunMeta(
            run_id=uuid.uuid4().hex[:16],
            eval=eval_name,
            params=params,
            spec=spec.fingerprint,
            dataset_id="bench",
            split=split,
            n=len(rows),
            status=RunStatus.QUEUED,
            created=time.time(),
            principal=principal,
        )
        record_run(self.client, meta, list(range(len(rows))), str(self.data.parent / "archive"))
        return meta

    def status(self, meta: RunMeta) -> RunStatus:
        return self.res.runs.get(meta.run_id).status


def task(meta: RunMeta, ids: list[int], *, solo: bool = False) -> SampleTask:
    return SampleTask(run_id=meta.run_id, eval=meta.eval, spec=meta.spec, sample_ids=ids, solo=solo)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    load_plugins(["tests.plugins"])
    with RedisServer(tmp_path_factory.mktemp("redis")) as running:
        yield running


@pytest.fixture
def bench(server: RedisServer, tmp_path: Path) -> Iterator[Bench]:
    client = connect(server.url)
    sent = Recorder()
    runtimes = RuntimePool(Services(Settings(device="cpu", max_models=2), client))
    res = Resources(
        runs=RunStore(client),
        reader=ResultReader(client),
        writer=ResultWriter(client),
        shards=ShardCache(client, capacity=4),
        runtimes=runtimes,
        publish=sent,
        stage_scoring=sent.stage_scoring,
        labels=LabelFields(client),
        max_batch=16,
        max_attempts=MAX_ATTEMPTS,
    )
    yield Bench(client, res, sent, tmp_path / "data")
    runtimes.close()
    client.close()


def test_outputs_are_stored_once_without_labels_and_sent_on_to_scoring(bench: Bench) -> None:
    meta = bench.run("spy", labelled_rows(20))
    infer_batch(bench.res, [task(meta, list(range(20)))])
    outputs = bench.res.reader.outputs(meta.run_id, list(range(20)))
    assert len(outputs) == 20
    assert all(o["fields"] == ["text"] for o in outputs.values())
    assert sorted(bench.sent.ids(SCORE_TASK)) == list(range(20))
    assert bench.status(meta) is RunStatus.RUNNING

    infer_batch(bench.res, [task(meta, list(range(20)))])  # a redelivery
    assert bench.res.reader.progress(meta.run_id).inferred == 20
    # the message was counted once: a third delivery finds it delivered once before
    again = Delivery(task(meta, list(range(20))).delivery, False, [0])
    assert bench.res.writer.attempt(meta.run_id, [again]) == {0: -1}


SOLVE = """
prompt: "Solve {text}"
target: solution
generate: {max_new_tokens: 8}
scorer: exact_match
"""


def test_every_registered_label_field_is_scrubbed_whichever_evaluation_runs(bench: Bench) -> None:
    """Issue #50 (5), the worker's own line: rows reach ``infer()`` without any field that a
    registered task calls a label (``solution``, ``solve``'s target) or that another loaded
    evaluation declares (``answer``, the built-in ``arithmetic``'s), though the running
    evaluation (``spy``: ``label``, ``secret``) declares neither; the worker reads them from the
    task registry itself. Was: only the running evaluation's label fields were scrubbed."""
    TaskRegistry(bench.client).add("solve", SOLVE, who="tests")
    try:
        rows = [{**row, "solution": f"s{i}", "answer": i} for i, row in enumerate(labelled_rows(6))]
        meta = bench.run("spy", rows)
        infer_batch(bench.res, [task(meta, list(range(6)))])
        outputs = bench.res.reader.outputs(meta.run_id, list(range(6)))
        assert [o["fields"] for o in outputs.values()] == [["text"]] * 6
    finally:
        bench.client.hdel(TASKS, "solve")


def test_scoring_settles_every_sample_and_the_last_write_finalizes(bench: Bench) -> None:
    rows = labelled_rows(20)
    rows[4]["text"] = "a bust row"
    meta = bench.run("flaky", rows)
    infer_batch(bench.res, [task(meta, list(range(20)))])
    score_batch(bench.res, [task(meta, list(range(10)))])
    assert bench.status(meta) is RunStatus.RUNNING
    score_batch(bench.res, [task(meta, list(range(10, 20)))])

    progress = bench.res.reader.progress(meta.run_id)
    assert (progress.scored, progress.failed) == (19, 1)
    assert bench.status(meta) is RunStatus.COMPLETED
    error = bench.res.reader.fetch(meta.run_id, [4])[0].error
    assert error is not None
    assert (error.stage, error.kind) == (Stage.SCORE, "ValueError")
    assert bench.res.reader.aggregate(meta.run_id) is not None


def test_a_raising_batch_retries_its_rows_alone_then_ends_them(bench: Bench) -> None:
    rows = labelled_rows(8)
    rows[3]["text"] = "boom goes the row"
    meta = bench.run("flaky", rows)
    infer_batch(bench.res, [task(meta, list(range(8)))])

    # the batch raised: every row ran alone, the seven clean ones were stored
    assert bench.res.reader.progress(meta.run_id).inferred == 7
    assert bench.sent.ids(INFER_TASK, solo=True) == [3]
    for attempt in range(2, MAX_ATTEMPTS + 1):
        bench.sent.sent.clear()
        infer_batch(bench.res, [task(meta, [3], solo=True)])
        if attempt < MAX_ATTEMPTS:
            assert bench.sent.ids(INFER_TASK, solo=True) == [3]
    assert bench.sent.ids(INFER_TASK) == []
    error = bench.res.reader.fetch(meta.run_id, [3])[0].error
    assert error is not None
    assert error.stage is Stage.INFER
    assert error.message == f"boom in the batch (attempt {MAX_ATTEMPTS} of {MAX_ATTEMPTS})"


def test_a_sample_tried_before_is_not_run_with_others_but_sent_on_alone(bench: Bench) -> None:
    meta = bench.run("spy", labelled_rows(6))
    # sample 2's earlier attempt, alone, started and never finished (its worker died)
    assert bench.res.writer.attempt(meta.run_id, [Delivery("earlier", True, [2])]) == {2: 1}
    infer_batch(bench.res, [task(meta, list(range(6)))])

    assert set(bench.res.reader.outputs(meta.run_id, list(range(6)))) == {0, 1, 3, 4, 5}
    assert bench.sent.ids(INFER_TASK, solo=True) == [2]
    assert 2 not in bench.sent.ids(SCORE_TASK)

    infer_batch(bench.res, [task(meta, [2], solo=True)])  # alone, it runs
    assert 2 in bench.res.reader.outputs(meta.run_id, [2])


def test_a_message_is_counted_once_and_its_redelivery_sends_each_sample_alone(
    bench: Bench,
) -> None:
    """A first delivery writes one count for the whole message, none per sample; delivered
    again (its worker died mid-batch), every sample goes alone, counted from the message's
    deliveries, and alone goes on counting from there up to the limit."""
    meta = bench.run("spy", labelled_rows(6))
    keys = RunKeys(meta.run_id)
    attempts = keys.attempts_of(Stage.INFER)
    message = Delivery("task-1", False, list(range(6)))
    assert bench.res.writer.attempt(meta.run_id, [message]) == dict.fromkeys(range(6), 1)
    assert bench.client.hgetall(keys.deliveries_of(Stage.INFER)) == {"task-1": "1"}
    assert not bench.client.exists(attempts)

    assert bench.res.writer.attempt(meta.run_id, [message]) == dict.fromkeys(range(6), -1)
    assert bench.client.hmget(attempts, [str(i) for i in range(6)]) == ["1"] * 6
    alone = Delivery("task-2", True, [4])
    assert bench.res.writer.attempt(meta.run_id, [alone]) == {4: 2}
    assert bench.res.writer.attempt(meta.run_id, [alone]) == {4: 3}
    third = bench.res.writer.attempt(meta.run_id, [message])
    assert third == dict.fromkeys(range(6), -2) | {4: -3}


def test_a_sample_whose_every_attempt_died_ends_as_one_terminal_error(bench: Bench) -> None:
    meta = bench.run("spy", labelled_rows(5))
    for _ in range(MAX_ATTEMPTS):
        bench.res.writer.attempt(meta.run_id, [Delivery("alone", True, [1])])
    infer_batch(bench.res, [task(meta, [1], solo=True)])

    record = bench.res.reader.fetch(meta.run_id, [1])[0]
    assert record.output is None
    assert record.error is not None
    assert record.error.message.startswith(f"gave up after {MAX_ATTEMPTS} attempts")
    assert bench.sent.sent == []


def test_a_cancelled_run_gets_no_inference_and_no_scoring(bench: Bench) -> None:
    meta = bench.run("spy", labelled_rows(10))
    infer_batch(bench.res, [task(meta, list(range(5)))])
    assert bench.res.runs.cancel(meta.run_id) == (1, 5)
    infer_batch(bench.res, [task(meta, list(range(5, 10)))])
    score_batch(bench.res, [task(meta, list(range(5)))])

    progress = bench.res.reader.progress(meta.run_id)
    assert (progress.inferred, progress.scored, progress.failed) == (5, 0, 0)
    assert bench.status(meta) is RunStatus.CANCELLED


def test_settle_writes_nothing_once_the_run_is_cancelled(bench: Bench) -> None:
    """The Lua check, not only the Python one: a scorer that started before the cancellation
    must not write after it (the cancellation's refund counted those samples)."""
    meta = bench.run("spy", labelled_rows(5))
    bench.res.writer.record_outputs(meta.run_id, {0: "1", 1: "1"})
    bench.res.runs.cancel(meta.run_id)
    error = ErrorRecord(stage=Stage.SCORE, kind="E", message="late")

    assert bench.res.writer.record_scores(meta.run_id, {0: {"m": 1.0}}).finalize is False
    assert bench.res.writer.record_errors(meta.run_id, {1: error}).finalize is False
    assert bench.res.writer.record_outputs(meta.run_id, {2: "1"}) == 0
    progress = bench.res.reader.progress(meta.run_id)
    assert (progress.inferred, progress.scored, progress.failed) == (2, 0, 0)
    assert bench.res.reader.settled(meta.run_id, [0, 1]) == set()


def test_a_sample_is_settled_once_by_whichever_write_comes_first(bench: Bench) -> None:
    meta = bench.run("spy", labelled_rows(5))
    error = ErrorRecord(stage=Stage.SCORE, kind="E", message="first")
    assert bench.res.writer.record_errors(meta.run_id, {0: error}).finalize is False
    assert (
        bench.res.writer.record_scores(meta.run_id, {0: {"m": 1.0}, 1: {"m": 1.0}}).finalize
        is False
    )
    assert bench.res.writer.record_errors(meta.run_id, {1: error}).finalize is False
    progress = bench.res.reader.progress(meta.run_id)
    assert (progress.scored, progress.failed) == (1, 1)
    assert bench.res.writer.record_scores(meta.run_id, {i: {"m": 0.0} for i in range(5)}).finalize
    assert not bench.res.writer.record_scores(
        meta.run_id, {i: {"m": 0.0} for i in range(5)}
    ).finalize


def test_cancel_counts_each_sample_without_a_result_once(bench: Bench) -> None:
    """Unproduced = samples with neither an output nor an error. A sample with an output and
    a scoring error was produced once, not twice."""
    meta = bench.run("spy", labelled_rows(5))
    writer = bench.res.writer
    writer.record_outputs(meta.run_id, {0: "1", 1: "1"})
    score_error = ErrorRecord(stage=Stage.SCORE, kind="E", message="m")
    data_error = ErrorRecord(stage=Stage.DATA, kind="E", message="m")
    writer.record_errors(meta.run_id, {0: score_error, 2: data_error})
    # 0: output + error, 1: output, 2: error only, 3 and 4: nothing
    assert bench.res.runs.cancel(meta.run_id) == (1, 2)
    assert bench.res.runs.cancel(meta.run_id) == (0, 2)


def test_messages_of_unknown_or_finished_runs_touch_nothing(bench: Bench) -> None:
    meta = bench.run("spy", labelled_rows(5))
    ghost = task(meta, [0]).model_copy(update={"run_id": "nosuchrun"})
    infer_batch(bench.res, [ghost])
    assert bench.sent.sent == []
    assert not bench.client.exists(RunKeys("nosuchrun").out)


def test_an_unreadable_stored_tier_is_no_access(bench: Bench) -> None:
    tiers = TierRegistry(bench.client)
    bench.client.hset(tiers_key("d"), "validation", "VIEWABLE ")
    assert tiers.resolve("d", "validation") is Tier.NO_ACCESS
    assert tiers.lookup("d", "validation") is Tier.NO_ACCESS
    assert tiers.resolve("d", "unlisted") is Tier.NO_ACCESS


def test_a_non_viewable_run_under_the_floor_shows_no_aggregate(
    bench: Bench, server: RedisServer
) -> None:
    """An admin may run four samples of a non_viewable split; a non-admin reading that run
    still sees no aggregate (four scores would give four labels away)."""
    meta = bench.run("spy", labelled_rows(4))
    TierRegistry(bench.client).set(meta.dataset_id, meta.split, Tier.NON_VIEWABLE, who="t")
    infer_batch(bench.res, [task(meta, [0, 1, 2, 3])])
    score_batch(bench.res, [task(meta, [0, 1, 2, 3])])
    settings = Settings(redis_url=server.url)
    reader, admin = Client(settings), Client(settings, admin=True)
    try:
        assert bench.status(meta) is RunStatus.COMPLETED
        assert admin.status(meta.run_id).aggregate is not None
        view = reader.status(meta.run_id)
        assert view.aggregate is None
        assert view.withheld == "fewer than 5 samples of a non_viewable split"
        assert json.loads(json.dumps(view.as_dict()))["aggregate"] is None
    finally:
        reader.close()
        admin.close()


def _one_of_five_scored(bench: Bench) -> RunMeta:
    """A completed run of five samples of a non_viewable split, four of which fail to score."""
    rows = labelled_rows(5)
    for row in rows[:4]:
        row["text"] = f"bust {row['text']}"
    meta = bench.run("flaky", rows)
    TierRegistry(bench.client).set(meta.dataset_id, meta.split, Tier.NON_VIEWABLE, who="t")
    infer_batch(bench.res, [task(meta, list(range(5)))])
    score_batch(bench.res, [task(meta, list(range(5)))])
    return meta


def test_the_floor_counts_the_samples_an_aggregate_is_made_of(
    bench: Bench, server: RedisServer
) -> None:
    """Five samples submitted, four of which fail to score: the aggregate is one sample's
    score, and a non-admin does not see it."""
    meta = _one_of_five_scored(bench)
    reader = Client(Settings(redis_url=server.url))
    try:
        assert bench.status(meta) is RunStatus.COMPLETED
        view = ended_view(reader, meta.run_id)
        assert view.progress.scored == 1
        assert view.aggregate is None
        assert view.withheld == "fewer than 5 samples of a non_viewable split"
    finally:
        reader.close()


def test_a_run_read_as_going_shows_no_aggregate_and_error_kinds_need_full_access(
    bench: Bench, server: RedisServer
) -> None:
    """The race the attack review won: a status read that saw the run going, while it
    completed with one scored sample, showed that sample's score (the floor counted the five
    submitted). And a non-admin sees errors by stage only: a class name is the raiser's choice."""
    meta = _one_of_five_scored(bench)
    settings = Settings(redis_url=server.url)
    reader, admin = Client(settings), Client(settings, admin=True)
    try:
        completed = RunStore(bench.client).get(meta.run_id)
        assert completed.status is RunStatus.COMPLETED
        seen_going = completed.model_copy(update={"status": RunStatus.RUNNING})
        direct = Direct(
            settings, False, principal="tests", client=bench.client, app=None, sees_sources=True
        )
        progress = direct.results.progress(meta.run_id)
        now = time.time()
        seen = direct.disclosure.status(seen_going, progress, now, stall=Stall(), waiting=None)
        assert seen.aggregate is None
        assert ended_view(reader, meta.run_id).errors == {"score": 4}
        assert admin.status(meta.run_id).errors == {"score/ValueError": 4}
    finally:
        reader.close()
        admin.close()


def test_a_forged_message_for_a_run_of_an_unknown_eval_harms_no_batch_mate(bench: Bench) -> None:
    """A message naming a served eval for a run whose own eval this worker does not have is
    dropped; the batch goes on for the other runs and asks for no requeue (no loop)."""
    ghost = bench.run("no-such-eval", labelled_rows(4))
    meta = bench.run("spy", labelled_rows(4))
    forged = task(ghost, [0]).model_copy(update={"eval": "spy"})
    assert infer_batch(bench.res, [forged, task(meta, [0, 1, 2, 3])]) == set()
    assert len(bench.res.reader.outputs(meta.run_id, [0, 1, 2, 3])) == 4
    assert bench.res.reader.outputs(ghost.run_id, [0]) == {}


@register("turns")
class Turns(Evaluation):
    """``infer()`` appends a turn to its row's nested list, as a chat evaluation might; the
    score counts the row's turns."""

    label_fields = ("label",)

    def infer(self, model: Any, rows: list[dict[str, Any]]) -> list[Any]:
        for row in rows:
            row["messages"].append({"role": "assistant"})
        return [{1: "an int key", "pair": (1, 2)} for _ in rows]

    def score(self, row: dict[str, Any], output: Any) -> dict[str, float]:
        return {"turns": float(len(row["messages"])), "int_key": float(1 in output)}


HOOK: list[Callable[[], object]] = []


@register("raced")
class Raced(Evaluation):
    """``infer()`` first runs what a test put in ``HOOK`` (another worker's writes)."""

    label_fields = ("label",)

    def infer(self, model: Any, rows: list[dict[str, Any]]) -> list[Any]:
        while HOOK:
            HOOK.pop()()
        return [{"pred": 1} for _ in rows]

    def score(self, row: dict[str, Any], output: Any) -> dict[str, float]:
        return {"m": 1.0}


def _chat(n: int) -> list[dict[str, object]]:
    tag = uuid.uuid4().hex[:8]
    return [{"text": f"t{i} {tag}", "label": 1, "messages": [{"role": "user"}]} for i in range(n)]


def test_scoring_in_the_same_job_scores_what_a_scoring_job_would(bench: Bench) -> None:
    """A worker that scores what it just inferred scores the row as read, not as ``infer()``
    left it, and the output as stored (JSON), not as returned (the attack review: it scored
    the row infer() had changed)."""
    separate = bench.run("turns", _chat(4))
    infer_batch(bench.res, [task(separate, list(range(4)))])
    score_batch(bench.res, [t for name, t in bench.sent.sent if name == SCORE_TASK])
    bench.res = dataclasses.replace(bench.res, fuse=True)
    fused = bench.run("turns", _chat(4))
    infer_batch(bench.res, [task(fused, list(range(4)))])
    for meta in (separate, fused):
        assert bench.status(meta) is RunStatus.COMPLETED
    expected = [r.scores for r in bench.res.reader.results(separate.run_id)]
    assert expected == [{"turns": 1.0, "int_key": 0.0}] * 4
    assert [r.scores for r in bench.res.reader.results(fused.run_id)] == expected


def test_scoring_in_the_same_job_leaves_no_count_for_a_sample_settled_meanwhile(
    bench: Bench,
) -> None:
    """Another worker ends sample 0 while this one infers it: nothing is written for it
    twice, and no attempt count of it is left behind."""
    bench.res = dataclasses.replace(bench.res, fuse=True)
    meta = bench.run("raced", labelled_rows(3))
    failed = ErrorRecord(stage=Stage.INFER, kind="RuntimeError", message="another gave up")
    HOOK.append(lambda: bench.res.writer.record_errors(meta.run_id, {0: failed}))
    infer_batch(bench.res, [task(meta, [0, 1, 2])])
    assert bench.status(meta) is RunStatus.COMPLETED
    progress = bench.res.reader.progress(meta.run_id)
    assert (progress.scored, progress.failed) == (2, 1)
    keys = RunKeys(meta.run_id)
    assert bench.client.exists(keys.attempts_of(Stage.INFER), keys.attempts_of(Stage.SCORE)) == 0
    assert bench.client.exists(keys.deliveries_of(Stage.INFER)) == 0


def test_an_output_over_the_limit_ends_its_sample_and_is_never_stored(bench: Bench) -> None:
    """``EVALQ_MAX_OUTPUT_BYTES``: whatever made the output (a Python evaluation here, an
    endpoint or a local model alike), one over it ends its sample ``infer/OutputTooLarge``."""
    meta = bench.run("spy", labelled_rows(6))
    small = dataclasses.replace(bench.res, max_output_bytes=16)  # a spy output: ~40 bytes
    infer_batch(small, [task(meta, list(range(6)))])
    assert bench.res.reader.outputs(meta.run_id, list(range(6))) == {}
    assert bench.res.reader.errors_by_kind(meta.run_id) == {"infer/OutputTooLarge": 6}


def test_a_batch_that_would_pass_the_run_s_bytes_is_stored_nowhere(bench: Bench) -> None:
    """``EVALQ_MAX_RUN_BYTES``: the first batch fits, the second would pass the run's bound."""
    meta = bench.run("spy", labelled_rows(8))
    capped = dataclasses.replace(bench.res, max_run_bytes=200)
    infer_batch(capped, [task(meta, list(range(4)))])
    held = bench.res.writer.live_bytes(meta.run_id, 0)
    assert 0 < held <= 200
    infer_batch(capped, [task(meta, list(range(4, 8)))])
    assert sorted(bench.res.reader.outputs(meta.run_id, list(range(8)))) == [0, 1, 2, 3]
    assert bench.res.reader.errors_by_kind(meta.run_id) == {"infer/RunTooLarge": 4}
    assert bench.res.writer.live_bytes(meta.run_id, 0) == held  # the refused ones uncounted
