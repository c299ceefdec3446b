"""No timing channel on a split a reader may not read per sample: when a run's samples settled
is per-sample data (a scorer slower on a wrong answer writes each label into it), so a reader
without per-sample access reads a run's times only as a whole, on a coarse grain.

The attack review's script, replayed through the reader's own client (the gateway's code path)
on a real redis-server: a candidate keeps one sample per run (the other four fail at once), the
operator's scorer takes 50 ms longer on a mismatch, and the candidate reads everything a user
may read of each run (timeline, report, status) to guess the label. The settling writes are the
stores' own Lua, made here as a worker would (no worker process: the timing is the scorer's,
so it is the test's to make)."""

from __future__ import annotations

import math
import random
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from evalq.producer.operations.redis_server import RedisServer
from evalq.producer.reports.page import render
from evalq.producer.service.client import Client
from evalq.producer.service.report import gather
from evalq.producer.service.rescore import RescoreRequest
from evalq.producer.service.submit import SubmitRequest
from evalq.producer.service.views import Resumption
from evalq.shared.access.disclosure import Disclosure, Stall
from evalq.shared.access.policy import TIMING_GRAIN, Access, Reader, Tier, coarse_timing
from evalq.shared.access.tiers import TierRegistry
from evalq.shared.connection import connect, server_time
from evalq.shared.errors import InputError, TierRefusedError
from evalq.shared.evaluation import create, load_plugins
from evalq.shared.keys import RunKeys
from evalq.shared.models import ErrorRecord, Progress, RunFilter, RunMeta, RunStatus, Stage
from evalq.shared.queue.celery_app import INFER_QUEUE, SCORE_QUEUE
from evalq.shared.settings import Settings
from evalq.shared.store.presence import Presence, WorkerBeat
from evalq.shared.store.writer import ResultWriter
from tests.helpers import labelled_rows, list_splits, record_run, wilson, write_rows

RUNS = 200
SLOWER = 0.05
"""Seconds the scorer takes longer on a mismatch (the review measured 47-61 ms)."""


@pytest.fixture
def board(redis_only: RedisServer) -> Iterator[tuple[Client, Client]]:
    """A user and an admin on a held-out split of an in-process store."""
    load_plugins(("tests.plugins",))
    TierRegistry(connect(redis_only.url)).set("ds", "held", Tier.NON_VIEWABLE, who="op")
    settings = Settings(redis_url=redis_only.url, plugins=("tests.plugins",))
    user = Client(settings.model_copy(update={"principal": "agent"}))
    admin = Client(settings.model_copy(update={"principal": "root"}), admin=True)
    yield user, admin
    user.close()
    admin.close()


def _run(client: Client, label: int, *, settle: bool = True) -> str:
    """One run of five samples: four fail at inference at once, the kept one is scored, 50 ms
    later when the candidate's answer (always 1) is wrong (none of it unless ``settle``)."""
    redis_client = connect(client.settings.redis_url)
    meta = RunMeta(
        run_id=uuid.uuid4().hex[:16], eval="spy", spec="0" * 64, dataset_id="ds", split="held",
        n=5, status=RunStatus.QUEUED, created=server_time(redis_client), principal="agent",
    )  # fmt: skip
    record_run(redis_client, meta, list(range(5)))
    if not settle:
        return meta.run_id
    writer = ResultWriter(redis_client)
    failed = ErrorRecord(stage=Stage.INFER, kind="ValueError", message="not JSON")
    writer.record_outputs(meta.run_id, {4: '{"pred": 1}'})
    writer.record_errors(meta.run_id, {i: failed for i in range(4)})
    if label != 1:
        time.sleep(SLOWER)  # the operator's scorer, slower on a mismatch: the channel itself
    if writer.record_scores(meta.run_id, {4: {"correct": float(label == 1)}}).finalize:
        writer.finalize(meta.run_id, create("spy", {}))
    redis_client.close()
    return meta.run_id


def _guess(user: Client, run_id: str) -> int:
    """The attack: the gap between the failures' and the kept sample's settling, read off the
    timeline (the report's throughput chart is drawn from it) or, failing that, the run's
    duration as its status shows it."""
    try:
        moments = [t for t, _ in user.samples.timeline(run_id)]
        return int(max(moments) - min(moments) < SLOWER / 2)
    except TierRefusedError:
        meta = user.status(run_id).meta
        if meta.finished is None:
            return 1
        return int(meta.finished - meta.created <= TIMING_GRAIN)


@pytest.mark.integration  # 200 runs: an attack's replay, not a unit of behaviour
def test_a_slow_scorer_s_timing_tells_a_user_nothing_of_the_labels(
    board: tuple[Client, Client],
) -> None:
    user, admin = board
    labels = [0] * (RUNS // 2) + [1] * (RUNS // 2)
    random.Random(28).shuffle(labels)
    guesses = [_guess(user, _run(user, label)) for label in labels]
    right, low, high = wilson(sum(g == y for g, y in zip(guesses, labels, strict=True)), RUNS)
    print(f"timing attack: {right:.3f} of {RUNS} labels right (95% CI {low:.3f}-{high:.3f})")
    assert low <= 0.5 <= high
    # an admin, who may read per-sample results, reads the timing too: the channel is real
    seen = [_guess(admin, _run(admin, label)) for label in labels[:20]]
    assert sum(g == y for g, y in zip(seen, labels[:20], strict=True)) >= 18


QUIET = 0.2
"""``EVALQ_STALL_AFTER`` in the stall-onset attack: seconds without a write before a run
counts as stalled."""


def _pair(client: Client, label: int) -> tuple[str, str]:
    """Two runs of five samples on one held-out sample whose label is ``label``: the first
    answers it 1, the second 0. In each, three samples fail at once, one is held (the run
    stays going) and the kept one is scored: at once when its answer is right, 50 ms later
    when it is wrong (the operator's exact match, else a judge's call)."""
    store = connect(client.settings.redis_url)
    writer = ResultWriter(store)
    failed = ErrorRecord(stage=Stage.INFER, kind="ValueError", message="refused")
    runs = []
    for _ in (1, 0):
        meta = RunMeta(
            run_id=uuid.uuid4().hex[:16], eval="spy", spec="0" * 64, dataset_id="ds",
            split="held", n=5, status=RunStatus.QUEUED, created=server_time(store),
            principal="agent",
        )  # fmt: skip
        record_run(store, meta, list(range(5)))
        runs.append(meta.run_id)
    for run_id, answer in zip(runs, (1, 0), strict=True):
        writer.record_outputs(run_id, {3: f'{{"pred": {answer}}}'})
        writer.record_errors(run_id, {i: failed for i in range(3)})
    right, wrong = runs if label == 1 else runs[::-1]
    writer.record_scores(right, {3: {"correct": 1.0}})
    time.sleep(SLOWER)  # the judge's call on the wrong answer: the channel itself
    writer.record_scores(wrong, {3: {"correct": 0.0}})
    store.close()
    return runs[0], runs[1]


def _onset_guess(user: Client, runs: tuple[str, str]) -> int:
    """The attack: read both runs' ``status`` in a burst and note when each first says it is
    stalled; the run that went quiet sooner holds the right answer. With no onset seen, the
    guess is 1 (a coin that knows nothing)."""
    onset: dict[str, float] = {}
    deadline = time.monotonic() + QUIET + 0.15
    while len(onset) < 2 and time.monotonic() < deadline:
        for run_id in runs:
            if run_id not in onset and user.status(run_id).stalled:
                onset[run_id] = time.monotonic()
    if len(onset) < 2:
        return 1
    return int(onset[runs[0]] <= onset[runs[1]])


def _stall_attack(user: Client, pairs: int) -> tuple[float, float, float]:
    labels = [0] * (pairs // 2) + [1] * (pairs - pairs // 2)
    random.Random(50).shuffle(labels)
    right = sum(_onset_guess(user, _pair(user, label)) == label for label in labels)
    return wilson(right, pairs)


@pytest.mark.integration  # 200 runs: an attack's replay, not a unit of behaviour
def test_the_onset_of_stalled_tells_a_user_nothing_of_the_labels(
    board: tuple[Client, Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attack review's fourth timing channel: ``stalled`` appears a fixed delay after a
    run's last write, so of two runs answering one held-out sample "yes" and "no", the one
    that went quiet sooner was right (19 of 20 labels). A reader without per-sample access is
    told only that no live worker serves a going run, never that it went quiet."""
    agent, _ = board
    user = Client(agent.settings.model_copy(update={"stall_after": QUIET}))
    beat = WorkerBeat(
        hostname="w@attack", pid=1, evaluations=["spy"], queues=[INFER_QUEUE, SCORE_QUEUE]
    )
    Presence(connect(user.settings.redis_url)).beat(beat, interval=600)
    right, low, high = _stall_attack(user, RUNS // 2)
    print(f"stall-onset attack: {right:.3f} of {RUNS // 2} labels right ({low:.3f}-{high:.3f})")
    assert low <= 0.5 <= high
    # the rule switched off (the reader told why a run is stalled as one who sees its timing
    # is): the same attack reads the labels
    rule = Disclosure.stalled
    told = staticmethod(lambda reader, meta, stall: rule(timed(reader), meta, stall))
    monkeypatch.setattr(Disclosure, "stalled", told)
    right, low, _ = _stall_attack(user, 20)
    print(f"with the rule off: {right:.3f} of 20 labels right (from {low:.3f})")
    assert right >= 0.9
    user.close()


def timed(reader: Reader) -> Reader:
    """``reader`` as one with per-sample access (an admin reading the same split)."""
    return Reader(reader.where, reader.tier, Access.FULL, admin=True)


def test_a_held_out_run_is_told_stalled_only_when_no_worker_serves_it() -> None:
    """What a reader without the run's timing is told while it goes: that no live worker
    serves it (a fact of the fleet), never which queue it waits in nor that it went quiet."""
    going = RunMeta(
        run_id="r", eval="e", spec="0" * 64, dataset_id="d", split="s", n=5,
        status=RunStatus.RUNNING, created=100.0,
    )  # fmt: skip
    held = Reader("d/s", Tier.NON_VIEWABLE, Access.AGGREGATE)
    quiet, unserved = Stall(idle=75.0), Stall(unserved="no live worker (start one)")
    waits = Stall(queue="no live worker serving 'e' consumes queue 'score'")
    assert [Disclosure.stalled(held, going, s) for s in (quiet, waits, unserved)] == [
        None, None, "no live worker (start one)",
    ]  # fmt: skip
    assert [Disclosure.stalled(timed(held), going, s) for s in (quiet, waits)] == [
        "no progress for 75s", "no live worker serving 'e' consumes queue 'score'",
    ]  # fmt: skip
    ended = going.model_copy(update={"status": RunStatus.COMPLETED, "finished": 110.0})
    assert Disclosure.stalled(timed(held), ended, unserved) is None


def test_whether_an_aggregate_is_withheld_shows_no_sooner_than_the_run_s_end(
    board: tuple[Client, Client],
) -> None:
    """The attack review's read: a run of 5 with one sample scored read ``withheld: fewer
    than 5 samples`` the moment it truly ended, while its status still said ``running``."""
    user, admin = board
    run_id = _run(user, 0)  # four samples failed, one scored: under the floor once it ends
    store = connect(user.settings.redis_url)
    store.hset(RunKeys(run_id).meta, "finished", server_time(store) + 60)
    seen = user.status(run_id)
    assert (seen.meta.status, seen.withheld) == (RunStatus.RUNNING, None)
    assert admin.status(run_id).meta.status is RunStatus.COMPLETED
    store.hset(RunKeys(run_id).meta, "finished", server_time(store) - 2)
    assert user.status(run_id).withheld == "fewer than 5 samples of a non_viewable split"
    store.close()


def test_a_user_reads_a_held_out_run_s_times_only_as_a_whole(
    board: tuple[Client, Client],
) -> None:
    """No timeline, chart, throughput or ETA; no counts while it goes; its creation and end on
    the grain, and its end shown only from the grain's next step."""
    user, admin = board
    run_id = _run(user, 0)
    with pytest.raises(TierRefusedError, match="per-sample data"):
        user.samples.timeline(run_id)
    assert admin.samples.timeline(run_id)
    view = user.status(run_id)
    assert (view.throughput, view.eta_seconds, view.timed) == (None, None, False)
    assert view.meta.created % TIMING_GRAIN == 0
    exact = admin.status(run_id).meta
    assert exact.finished is not None
    if view.meta.status is RunStatus.COMPLETED:
        assert view.meta.finished is not None
        assert view.meta.finished % TIMING_GRAIN == 0
        assert view.meta.finished >= exact.finished
    else:  # read before the grain's next step after its end: still running, nothing counted
        assert view.meta.status is RunStatus.RUNNING
        assert (view.progress.done, view.aggregate) == (0, None)
    going = _run(user, 0, settle=False)
    seen = user.status(going)  # queued in truth: no write yet
    assert (seen.meta.status, seen.waiting, seen.provenance) == (RunStatus.RUNNING, None, None)
    page = render(gather(user.status(run_id), user.samples))
    assert "per-sample data of this split" in page
    assert "samples/s" not in page
    assert "samples/s" in render(gather(admin.status(run_id), admin.samples))


def test_a_run_s_age_is_on_redis_s_clock_whatever_the_producer_s(
    redis_only: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gateway whose clock ran 600 s ahead wrote that into ``created``, which the janitor
    and ``status`` compare with Redis's time: a run whose messages were lost healed after 662 s
    instead of 71 s, and ``stalled`` stayed empty. Every age is Redis's now."""
    store = connect(redis_only.url)
    write_rows(tmp_path, "validation", labelled_rows(10))
    name = list_splits(store, str(tmp_path), "validation")
    ahead = time.time
    monkeypatch.setattr(time, "time", lambda: ahead() + 600)
    client = Client(Settings(redis_url=redis_only.url, principal="gw", archive_url=str(tmp_path)))
    meta = client.submit(SubmitRequest(eval="spy", dataset=name, split="validation"))
    assert abs(server_time(store) - meta.created) < 30
    assert abs(server_time(store) - client.status(meta.run_id).meta.created) < 30
    cancelled = client.cancel(meta.run_id)
    assert cancelled.cancelled_now
    finished = client.status(meta.run_id).meta.finished
    assert finished is not None
    assert abs(server_time(store) - finished) < 30
    admin = Client(client.settings, admin=True)
    assert admin.purge(older_than=300) == []  # it is seconds old, whatever this clock says


def test_listing_runs_by_status_tells_a_user_no_more_than_their_status(
    board: tuple[Client, Client],
) -> None:
    """``runs --status completed`` listed a held-out run 4-30 ms after its end, while its
    status said ``running`` for up to a second more (the attack review read 36 of 40 labels
    through it). A filter now matches each run as its reader sees it."""
    user, admin = board
    for _ in range(5):  # a run read within the second after its end (almost every one)
        run_id = _run(user, 0)
        finished = admin.status(run_id).meta.finished
        listed = {
            v.meta.run_id for v in user.recent(50, only=RunFilter(status=RunStatus.COMPLETED))
        }
        shown = user.status(run_id).meta.status
        assert finished is not None
        if server_time(connect(user.settings.redis_url)) < math.ceil(finished):
            assert shown is RunStatus.RUNNING
            assert run_id not in listed
            return
    pytest.fail("no run was read within the second after its end")


def test_a_held_out_run_s_archiving_time_tells_no_more_than_its_end() -> None:
    """The attack review read ``archived`` (set 5-70 ms after a run's end, to the microsecond)
    while the run still read as running, and to the microsecond after: its end, to the
    sample. A reader without the timing sees it on the grain, once the grain has passed, and
    why the run failed without the exception's words."""
    meta = RunMeta(
        run_id="r", eval="e", spec="0" * 64, dataset_id="d", split="s", n=5,
        status=RunStatus.FAILED, created=100.2, finished=107.3, archived=107.35,
        reason="aggregate() failed: ValueError: label 3 seen twice",
    )  # fmt: skip
    going, _ = coarse_timing(meta, Progress(scored=5), now=107.4)
    assert (going.status, going.finished, going.archived) == (RunStatus.RUNNING, None, None)
    ended, _ = coarse_timing(meta, Progress(scored=5), now=108.5)
    assert (ended.finished, ended.archived) == (108.0, 108.0)
    assert ended.reason == "aggregate() failed"  # an aggregate's error may name a label


def test_a_grader_s_tokens_are_not_shown_to_a_reader_without_per_sample_access() -> None:
    """The attack review read 5 right of 12 off ``grader_completion_tokens`` (a grader's
    "GRADE: I" came with an explanation, its "GRADE: C" without): they follow the targets."""
    meta = RunMeta(
        run_id="r", eval="e", spec="0" * 64, dataset_id="d", split="s", n=12,
        status=RunStatus.COMPLETED, created=100.2, finished=107.3,
    )  # fmt: skip
    counted = Progress(scored=12, grader_prompt_tokens=900, grader_completion_tokens=101)
    _, seen = coarse_timing(meta, counted, now=200.0)
    assert (seen.scored, seen.grader_prompt_tokens, seen.grader_completion_tokens) == (12, 0, 0)


def test_resume_rescore_and_cancel_tell_a_user_no_more_than_status(
    board: tuple[Client, Client],
) -> None:
    """The attack review's probes, free to repeat every few ms: a rescore's refusal named the
    run's true state (``queued``, then another error the moment it ended), resume answered live
    counts and ``archived``. Each now answers from the run as ``status`` shows it to the user:
    running, no count, until its end shows."""
    user, admin = board
    run_id = _run(user, 0)
    store = connect(user.settings.redis_url)
    # ended in truth; its end shows to the user only a minute from now (the grain's next step)
    store.hset(RunKeys(run_id).meta, "finished", server_time(store) + 60)
    assert user.status(run_id).meta.status is RunStatus.RUNNING
    with pytest.raises(InputError, match=f"^run {run_id} is running; only a completed run"):
        user.rescore(RescoreRequest(run=run_id, eval="no-such-eval"))
    assert user.resume(run_id) == Resumption(run_id, None, None, False)
    going = _run(user, 0, settle=False)  # queued in truth
    with pytest.raises(InputError, match=f"^run {going} is running; only a completed run"):
        user.rescore(RescoreRequest(run=going, eval="spy"))
    assert user.resume(going) == Resumption(going, None, None, False)
    # the admin, who sees the timing, is told the truth
    with pytest.raises(InputError, match=f"^run {going} is queued"):
        admin.rescore(RescoreRequest(run=going, eval="spy"))
    assert admin.resume(going) == Resumption(going, 0, 0, False)  # the user's resume sent all
    store.close()
