"""Fair share: the dispatcher's order against a real redis-server (no worker), and with real
workers a small run that is not queued behind a big one, principals' runs that interleave,
priorities that weight a principal's runs, and kills and a Redis restart mid-dispatch that
lose and duplicate nothing."""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest
from kombu.common import QoS

from evalq.producer.operations.metrics import EvalqCollector
from evalq.producer.operations.redis_server import RedisServer
from evalq.producer.service.client import Client
from evalq.producer.service.rescore import RescoreRequest
from evalq.producer.service.submit import SubmitRequest
from evalq.shared.access.priorities import PriorityStore
from evalq.shared.connection import connect
from evalq.shared.errors import ForbiddenError
from evalq.shared.keys import FAIR, FAIR_SCORE, RunKeys
from evalq.shared.models import Priority, RunMeta, RunStatus, Stage
from evalq.shared.queue.backlog import INFER_LANE, SCORE_LANE, Backlog, Capturer, Lane, Staged
from evalq.shared.queue.broker import carried
from evalq.shared.queue.celery_app import SCORE_QUEUE, create_app
from evalq.shared.settings import Settings
from evalq.shared.store.reader import ResultReader
from evalq.worker.inference import infer_batch
from evalq.worker.prefetch import LONG_BATCH, RECENT, Reserve
from evalq.worker.scoring import score_batch
from tests.conftest import Stack
from tests.helpers import (
    assert_settled_once,
    labelled_rows,
    list_splits,
    wait_completed,
    wait_ended,
    wait_for,
    write_rows,
)
from tests.test_batch import Bench, bench, server, task  # noqa: F401 - fixtures

QUEUE = "q"


def _meta(
    run_id: str, principal: str, priority: Priority = Priority.NORMAL, model: str = "m"
) -> RunMeta:
    """A run of ``principal`` on ``model`` (the evaluation's parameter: what a worker loads)."""
    return RunMeta(
        run_id=run_id, eval="spy", params={"model": model}, spec="s", dataset_id="d", split="v",
        n=640, status=RunStatus.QUEUED, created=0.0, principal=principal, priority=priority,
    )  # fmt: skip


class Round:
    """A lane's backlogs on a real Redis with turns of ``turn`` seconds, staged and drained by
    hand as workers would drain its queue."""

    def __init__(self, on: RedisServer, lane: Lane = INFER_LANE, turn: float = 3600) -> None:
        self.client = connect(on.url)
        self.backlog = Backlog(self.client, turn_seconds=turn)
        self.lane = lane
        self.queue = f"{QUEUE}-{lane.queue}"

    def stage(self, meta: RunMeta, messages: int = 10, samples: int = 64) -> None:
        self.client.hset(RunKeys(meta.run_id).meta, "status", "queued")
        entries = [
            Staged(samples, self.queue, f"{meta.run_id}:{i}:{samples}") for i in range(messages)
        ]
        assert self.backlog.stage(meta, entries, self.lane) == samples * messages

    def take(self, count: int) -> list[str]:
        """Dispatch ``count`` messages one at a time; the runs they were of, in order."""
        taken = []
        for _ in range(count):
            assert self.backlog.dispatch(self.queue, 1, lane=self.lane) == 1
            taken.append(str(self.client.rpop(self.queue)).split(":")[0])
        return taken


def test_principals_share_evenly_and_runs_by_priority_in_turns(redis_only: RedisServer) -> None:
    fair = Round(redis_only)
    fair.stage(_meta("a1", "a"))
    fair.stage(_meta("a2", "a"))
    fair.stage(_meta("b1", "b"))
    first = fair.take(12)
    # a and b alternate whatever number of runs each has; a's runs, on one model, interleave
    assert [r[0] for r in first] == ["a", "b"] * 6
    assert [r for r in first if r[0] == "a"] == ["a1", "a2"] * 3
    fair.stage(_meta("c-high", "c", Priority.HIGH), 40)
    fair.stage(_meta("c-low", "c", Priority.LOW), 40)
    assert fair.take(1) == ["c-high"]  # a newcomer joins at the clock: served next
    fair.stage(_meta("a1", "a"), 40)  # so that a and b have enough left
    fair.stage(_meta("b1", "b"), 40)
    later = Counter(fair.take(40))
    # c weighs as its highest run (4) against a's and b's 2 each: half of all; within c,
    # c-high 4 to c-low's 1, and c-low still moves
    assert later["c-high"] + later["c-low"] == 20
    assert 14 <= later["c-high"] <= 18


def test_a_turn_serves_one_model_for_its_time_then_the_next(redis_only: RedisServer) -> None:
    """A principal's runs on two models: the turn's model is served while the turn lasts (no
    model swap at every batch), its runs interleaving by time; once the turn's time is up the
    lowest-time run's model gets the next turn. A small run on the model being served is
    served at once (the 8,000-sample run no longer keeps it waiting 4,096 samples)."""
    held = Round(redis_only)
    held.stage(_meta("big", "a", model="m1"), 20)
    held.stage(_meta("other", "a", model="m2"), 5)
    assert held.take(3) == ["big"] * 3
    held.stage(_meta("small", "a", model="m1"), 2)  # same model: joins at the clock
    assert held.take(4) == ["small", "big", "small", "big"]
    assert "other" not in held.take(6)  # m2 waits for the turn's end
    held.client.flushall()
    brief = Round(redis_only, turn=0)  # every turn over at once: the lowest time each time
    brief.stage(_meta("big", "a", model="m1"), 20)
    brief.stage(_meta("other", "a", model="m2"), 5)
    assert brief.take(6) == ["big", "other"] * 3


def test_leaving_and_coming_back_gains_a_principal_nothing(redis_only: RedisServer) -> None:
    """A principal submitting one-message runs as fast as they drain (each submit moves the
    fair choice to the queue's head) against a big run of 256-sample messages, four worker
    processes taking from the head: it comes back at its own virtual time, not the clock, so
    it gets about its half of the samples, not every message."""
    fair = Round(redis_only)
    fair.stage(_meta("victim", "v"), 40, samples=256)
    served = Counter[str]()
    for i in range(40):
        fair.stage(_meta(f"x{i}", "x"), 1)
        fair.backlog.dispatch(fair.queue, 4, at_least=1)  # what submit does
        run, _, samples = str(fair.client.rpop(fair.queue)).split(":")  # a worker takes the head
        served[run[0]] += int(samples)
    share = served["x"] / (served["x"] + served["v"])
    assert 0.35 <= share <= 0.65, served


def test_a_cancelled_run_leaves_the_round_at_once(redis_only: RedisServer) -> None:
    fair = Round(redis_only)
    fair.stage(_meta("gone", "a"))
    fair.stage(_meta("kept", "b"))
    fair.client.delete(RunKeys("gone").backlog)  # what cancel.lua does
    assert fair.backlog.withdraw("gone")
    assert fair.client.hget(FAIR.owner, "gone") is None
    standing = fair.backlog.standing("kept")
    assert standing is not None
    assert (standing.principals, standing.share) == (1, 1.0)
    assert fair.take(3) == ["kept"] * 3
    fair.client.hset(RunKeys("ended").meta, "status", "completed")
    assert fair.backlog.stage(_meta("ended", "a"), [Staged(64, QUEUE, "x")]) == 0


def test_scoring_has_a_round_of_its_own_where_principals_alternate(
    redis_only: RedisServer,
) -> None:
    """Scoring messages (staged by inference-only workers and by rescore) wait in the runs'
    score backlogs and are dispatched by their own round: principals alternate whatever runs
    each has, a principal's runs take turns, a newcomer is served next; what a principal took
    of the scorers does not count against its inference, nor the other way round."""
    score = Round(redis_only, SCORE_LANE)
    infer = Round(redis_only)
    score.stage(_meta("a1", "a"))
    score.stage(_meta("a2", "a", model="m2"))
    score.stage(_meta("b1", "b"))
    infer.stage(_meta("a1", "a"))
    infer.stage(_meta("b1", "b"))
    assert score.take(4) == ["a1", "b1", "a1", "b1"]
    infer.stage(_meta("c1", "c"))
    assert infer.take(3) == ["a1", "b1", "c1"]  # a's scoring left its inference time alone
    first = score.take(8)
    assert [r[0] for r in first] == ["a", "b"] * 4
    assert [r for r in first if r[0] == "a"] == ["a1"] * 4  # a2's model waits for its turn
    score.stage(_meta("d1", "d"), 2)
    assert score.take(1) == ["d1"]  # joins at the clock: next
    assert Counter(infer.take(6)) == {"a1": 2, "b1": 2, "c1": 2}  # nor a's and b's scoring
    standing = score.backlog.standing("a2")  # no inference waiting: its place in scoring
    assert standing is not None
    assert (standing.principals, standing.runs, standing.share) == (3, 2, 0.5 / 3)
    assert score.backlog.waiting()["b1"] == ("b", (10 - 6 + 10 - 3) * 64)  # both lanes


def test_a_cancelled_runs_scoring_is_withdrawn(redis_only: RedisServer) -> None:
    """Cancel deletes the run's score backlog and takes it out of the scoring round at once;
    what an inference-only worker stages for it afterwards is refused."""
    score = Round(redis_only, SCORE_LANE)
    score.stage(_meta("gone", "a"))
    score.stage(_meta("kept", "b"))
    assert score.take(2) == ["gone", "kept"]
    score.client.hset(RunKeys("gone").meta, "status", "cancelled")  # what cancel.lua does
    assert score.backlog.withdraw("gone")
    assert not score.client.exists(RunKeys("gone").backlog_of(Stage.SCORE))
    assert score.client.hget(FAIR_SCORE.owner, "gone") is None
    assert score.take(8) == ["kept"] * 8
    late = [Staged(64, score.queue, "gone:late:64")]
    assert score.backlog.stage(_meta("gone", "a"), late, SCORE_LANE, refill=1) == 0
    assert score.client.llen(score.queue) == 0
    assert not score.backlog.withdraw("gone")


@pytest.mark.integration
def test_an_inference_only_workers_scoring_goes_through_the_dispatcher(
    bench: Bench,  # noqa: F811
    server: RedisServer,  # noqa: F811
) -> None:
    """``infer_batch`` on a worker that does not score (``fuse`` off) stages each batch's
    scoring in the run's score backlog and keeps ``score`` one message deep: another
    principal's run, inferred after four batches of a big run, is scored next, not after them.
    Nothing is lost or scored twice."""
    app = create_app(Settings(redis_url=server.url))
    capturer = Capturer(app)
    backlog = Backlog(bench.client)
    bench.res = dataclasses.replace(
        bench.res, stage_scoring=partial(backlog.stage_scoring, capturer)
    )
    bench.client.delete(SCORE_QUEUE)
    big = bench.run("spy", labelled_rows(64), principal="sweep")
    for start in range(0, 64, 16):
        infer_batch(bench.res, [task(big, list(range(start, start + 16)))])
    small = bench.run("spy", labelled_rows(8), principal="loop")
    infer_batch(bench.res, [task(small, list(range(8)))])
    assert bench.client.llen(SCORE_QUEUE) == 1  # the rest waits in the backlogs
    order = []
    while (raw := bench.client.rpop(SCORE_QUEUE)) is not None:
        payload = carried(str(raw))
        assert payload is not None
        order.append(payload.run_id)
        score_batch(bench.res, [payload])
        backlog.refill(1, [SCORE_QUEUE])  # what the scoring worker does after each batch
    assert order == [big.run_id, small.run_id, *[big.run_id] * 3]
    for meta in (big, small):
        assert bench.status(meta) is RunStatus.COMPLETED
        assert_settled_once(bench.client, meta.run_id, meta.n)
    capturer.close()


def test_priority_is_the_policys_to_grant(redis_only: RedisServer, tmp_path: Path) -> None:
    client = connect(redis_only.url)
    write_rows(tmp_path, "validation", labelled_rows(40))
    dataset = list_splits(client, str(tmp_path), "validation")
    user = Client(Settings(redis_url=redis_only.url, principal="agent"))

    def submit(priority: Priority | None) -> RunMeta:
        return user.submit(
            SubmitRequest(eval="spy", dataset=dataset, split="validation", priority=priority)
        )

    assert submit(None).priority is Priority.NORMAL
    assert submit(Priority.LOW).priority is Priority.LOW
    with pytest.raises(ForbiddenError, match="forbidden: priority 'high' is above"):
        submit(Priority.HIGH)
    PriorityStore(client).set_split(dataset, "validation", Priority.HIGH, who="op")
    assert submit(None).priority is Priority.HIGH
    PriorityStore(client).set_principal("agent", Priority.LOW, who="op")  # before the split's
    assert submit(None).priority is Priority.LOW
    with pytest.raises(ForbiddenError):
        submit(Priority.NORMAL)
    admin = Client(Settings(redis_url=redis_only.url, principal="agent"), admin=True)
    request = SubmitRequest(eval="spy", dataset=dataset, split="validation", priority=Priority.HIGH)
    assert admin.submit(request).priority is Priority.HIGH


def test_status_and_metrics_say_where_queued_runs_stand(
    redis_only: RedisServer, tmp_path: Path
) -> None:
    client = connect(redis_only.url)
    write_rows(tmp_path, "validation", labelled_rows(640))
    dataset = list_splits(client, str(tmp_path), "validation")
    a = Client(Settings(redis_url=redis_only.url, principal="a"))
    b = Client(Settings(redis_url=redis_only.url, principal="b"))
    request = SubmitRequest(eval="spy", dataset=dataset, split="validation")
    a_runs = [a.submit(request), a.submit(request)]
    b_run = b.submit(request)  # no worker: all three wait in their backlogs
    mine = b.status(b_run.run_id).waiting
    assert mine is not None
    assert (mine.share, mine.principals, mine.runs) == (0.5, 2, 1)
    assert mine.waiting == 640 - 64  # one message went to the queue at submit
    assert "shares the workers with 1 other principal(s)" in mine.why
    theirs = a.status(a_runs[0].run_id).waiting
    assert theirs is not None
    assert (theirs.share, theirs.runs) == (0.25, 2)
    assert "1 other run(s) of its principal" in theirs.why
    family = {m.name: m for m in EvalqCollector(client).collect()}["evalq_principal_samples"]
    found = {(s.labels["principal"], s.labels["state"]): s.value for s in family.samples}
    assert found == {
        ("a", "queued"): 2 * 640 - 2 * 64, ("a", "running"): 2 * 64,
        ("b", "queued"): 640 - 64, ("b", "running"): 64,
    }  # fmt: skip


def _client(stack: Stack, principal: str) -> Client:
    return Client(
        Settings(
            redis_url=stack.server.url, archive_url=stack.settings.archive_url, principal=principal
        )
    )


def _dataset(stack: Stack, folder: Path, n: int) -> str:
    write_rows(folder, "validation", labelled_rows(n))
    return list_splits(stack.client, str(folder), "validation")


def _submit(
    client: Client, dataset: str, limit: int, eval_name: str = "slow", **params: str
) -> RunMeta:
    request = SubmitRequest(
        eval=eval_name, dataset=dataset, split="validation", limit=limit, params=params
    )
    return client.submit(request)


@pytest.mark.integration
def test_a_small_run_submitted_after_a_big_one_finishes_before_it(
    fresh_stack: Stack, tmp_path: Path
) -> None:
    """FIFO would settle every one of the big run's 2,000 samples (10 s of the slow model)
    before the small run's first; fair share starts the small run within a batch or two."""
    stack = fresh_stack
    stack.start_workers()
    dataset = _dataset(stack, tmp_path, 2000)
    sweep, loop = _client(stack, "sweep"), _client(stack, "loop")
    big = _submit(sweep, dataset, 2000)
    small = _submit(loop, dataset, 20)
    wait_completed(stack.client, small.run_id, timeout=60)
    assert sweep.status(big.run_id).progress.done < big.n // 2
    sweep.cancel(big.run_id)


class _Consumer:
    """What :class:`Reserve` uses of Celery's worker consumer: its prefetch (kombu's QoS)."""

    def __init__(self) -> None:
        self.initial_prefetch_count = 4
        self.qos = QoS(lambda _count: None, 4)


def test_a_worker_reserves_one_batch_while_batches_are_long() -> None:
    """Celery's prefetch (two batches' worth) drops to one batch's worth after a long batch
    and comes back once the last RECENT batches were short; it is set, not stepped, so
    Celery's own changes to it (autoscale) cannot make it drift; a new connection starts
    again at Celery's."""
    consumer = _Consumer()
    reserve = Reserve.of(consumer)
    assert Reserve.of(consumer) is reserve
    reserve.finished(0.01)
    assert consumer.qos.value == 4
    reserve.finished(LONG_BATCH * 3)
    reserve.finished(LONG_BATCH * 3)
    assert consumer.qos.value == 2
    for _ in range(RECENT - 1):
        reserve.finished(0.01)
        assert consumer.qos.value == 2  # a long batch among the last RECENT
    reserve.finished(0.01)
    assert consumer.qos.value == 4
    for count in (6, 8, 4, 6, 8):  # Celery's pool grows and shrinks between batches
        consumer.initial_prefetch_count = count
        reserve.finished(LONG_BATCH * 3)
        assert consumer.qos.value == count // 2
    consumer.qos = QoS(lambda _count: None, 8)  # the consumer reconnected
    reserve.finished(0.01)
    assert consumer.qos.value == 8


@pytest.mark.integration
def test_a_worker_holds_one_message_behind_a_long_batch(fresh_stack: Stack, tmp_path: Path) -> None:
    """The slow model's messages of 64 samples take 0.3 s: once one has, the worker reserves
    only the message it runs, so a run dispatched next waits behind one batch, not two."""
    stack = fresh_stack
    stack.start_workers()
    dataset = _dataset(stack, tmp_path, 640)
    client = _client(stack, "a")
    meta = _submit(client, dataset, 640)
    wait_for(lambda: client.status(meta.run_id).progress.done >= 128, 60, "two batches")
    held: set[int] = set()

    def observed() -> bool:
        held.add(stack.client.hlen("unacked"))
        return client.status(meta.run_id).progress.done >= 448

    wait_for(observed, 60, "three more batches")
    assert max(held) == 1, held
    wait_completed(stack.client, meta.run_id)


@pytest.mark.integration
def test_principals_runs_interleave(fresh_stack: Stack, tmp_path: Path) -> None:
    """``a`` submits two runs and ``b`` one, all alike: when ``b``'s run completes, ``a``'s
    two together have had about as much (not twice as much, not nothing)."""
    stack = fresh_stack
    stack.start_workers()
    dataset = _dataset(stack, tmp_path, 320)
    a, b = _client(stack, "a"), _client(stack, "b")
    a_runs = [_submit(a, dataset, 320), _submit(a, dataset, 320)]
    b_run = _submit(b, dataset, 320)
    wait_completed(stack.client, b_run.run_id, timeout=240)
    a_done = [a.status(m.run_id).progress.done for m in a_runs]
    assert 0.6 * 320 <= sum(a_done) <= 1.4 * 320, a_done
    for meta in a_runs:
        wait_completed(stack.client, meta.run_id, timeout=240)


@pytest.mark.integration
def test_a_worker_killed_and_redis_restarted_mid_dispatch_settle_every_run_once(
    fresh_stack: Stack, tmp_path: Path
) -> None:
    stack = fresh_stack
    stack.crashes_expected = True  # Celery logs the lost connection with a traceback
    fast = {"EVALQ_VISIBILITY_TIMEOUT": "5"}
    stack.start_workers(**fast)
    dataset = _dataset(stack, tmp_path, 384)
    gate = {"gate": str(tmp_path / "gate"), "open_until": "200"}
    a, b = _client(stack, "a"), _client(stack, "b")
    runs = [_submit(a, dataset, 384, **gate), _submit(a, dataset, 256, **gate)]
    runs.append(_submit(b, dataset, 384, **gate))
    backlog = Backlog(stack.client)
    wait_for(lambda: sum(a.status(m.run_id).progress.done for m in runs) >= 128, 60, "progress")
    assert backlog.waiting()  # the dispatcher still holds work of the runs
    for process in stack.workers[0].processes:
        os.killpg(process.pid, signal.SIGKILL)  # main process and pool child, mid-batch
        process.wait(60)
    stack.workers = []
    stack.server.restart()  # SIGTERM (AOF flushed), then a new server on the same port
    (tmp_path / "gate").touch()
    stack.start_workers(**fast)
    for meta in runs:
        wait_ended(stack.client, meta.run_id)
        assert_settled_once(stack.client, meta.run_id, meta.n)
    assert not backlog.waiting()


def _split_workers(stack: Stack) -> None:
    """The compose topology: one inference-only worker and one scoring-only worker."""
    stack.start_workers(queues="infer")
    stack.start_workers(queues="score")


def _while_big_goes(
    stack: Stack, big: RunMeta, small: Callable[[], RunMeta], what: str
) -> tuple[float, int]:
    """Start ``small`` while ``big`` goes; the seconds it took to complete, and how many of
    ``big``'s samples were settled by then."""
    started = time.monotonic()
    meta = small()
    wait_completed(stack.client, meta.run_id, timeout=120)
    took = time.monotonic() - started
    done = ResultReader(stack.client).progress(big.run_id).done
    print(f"\n{what}: {took:.2f} s; the big run had {done} of {big.n} samples settled")
    return took, done


@pytest.mark.integration
def test_a_small_runs_scoring_waits_behind_no_ones_backlog(
    fresh_stack: Stack, tmp_path: Path
) -> None:
    """Inference-only and scoring-only workers, scoring the bottleneck (5 ms a sample: 20 s
    for the big run, whose inference takes a few seconds). The big run's scoring messages wait
    in its score backlog, not in ``score``: another principal's 20-sample run, submitted once
    three quarters of the big run are inferred, completes while most of the big run is
    unscored. (When inference-only workers sent scoring straight to ``score``, the small run's
    one scoring message queued behind every one the big run had sent.)"""
    stack = fresh_stack
    _split_workers(stack)
    dataset = _dataset(stack, tmp_path, 4000)
    sweep, loop = _client(stack, "sweep"), _client(stack, "loop")
    request = SubmitRequest(eval="slow_score", dataset=dataset, split="validation", limit=4000)
    big = sweep.submit(request)
    wait_for(lambda: sweep.status(big.run_id).progress.inferred >= 3000, 60, "inference")
    small = request.model_copy(update={"limit": 20})
    _, done = _while_big_goes(stack, big, lambda: loop.submit(small), "20-sample run")
    assert done < big.n // 2
    sweep.cancel(big.run_id)


@pytest.mark.integration
def test_a_small_rescore_waits_behind_no_ones_big_rescore(
    fresh_stack: Stack, tmp_path: Path
) -> None:
    """The same topology: a 4,000-sample rescore with the slow scorer (20 s of scoring) is
    staged whole at once; another principal's 64-sample rescore started right after it
    completes while most of the big one is unscored (a rescore used to send every scoring
    message straight to ``score``, behind all that was there)."""
    stack = fresh_stack
    _split_workers(stack)
    dataset = _dataset(stack, tmp_path, 4000)
    sweep, loop = _client(stack, "sweep"), _client(stack, "loop")
    sources = [_submit(sweep, dataset, 4000, "spy"), _submit(loop, dataset, 64, "spy")]
    for meta in sources:
        wait_completed(stack.client, meta.run_id, timeout=120)
    big = sweep.rescore(RescoreRequest(run=sources[0].run_id, eval="slow_score"))
    again = RescoreRequest(run=sources[1].run_id, eval="slow_score")
    _, done = _while_big_goes(stack, big, lambda: loop.rescore(again), "64-sample rescore")
    assert done < big.n // 2
    sweep.cancel(big.run_id)


@pytest.mark.integration
def test_a_scoring_worker_killed_leaves_no_staged_scoring_behind(
    fresh_stack: Stack, tmp_path: Path
) -> None:
    """The split topology, the scoring worker SIGKILLed while two principals' scoring waits in
    their runs' score backlogs (and a message of it is in the worker's hands): a new scoring
    worker's refills dispatch what was staged, what the dead one held comes back, and every
    sample settles exactly once."""
    stack = fresh_stack
    stack.crashes_expected = True
    fast = {"EVALQ_VISIBILITY_TIMEOUT": "5"}
    stack.start_workers(queues="infer", **fast)
    scorer = stack.start_workers(queues="score", **fast)
    dataset = _dataset(stack, tmp_path, 640)
    a, b = _client(stack, "a"), _client(stack, "b")
    runs = [_submit(a, dataset, 640, "slow_score"), _submit(b, dataset, 320, "slow_score")]
    backlog = Backlog(stack.client)
    wait_for(lambda: sum(a.status(m.run_id).progress.done for m in runs) >= 128, 60, "scoring")
    assert backlog.waiting()  # scoring staged and not dispatched yet
    for process in scorer.processes:
        os.killpg(process.pid, signal.SIGKILL)  # main process and pool child, mid-batch
        process.wait(60)
    stack.workers.remove(scorer)
    stack.start_workers(queues="score", **fast)
    for meta in runs:
        wait_ended(stack.client, meta.run_id)
        assert_settled_once(stack.client, meta.run_id, meta.n)
    assert not backlog.waiting()
