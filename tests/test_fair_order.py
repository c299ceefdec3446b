"""Fair share's promises (docs/architecture.md, Fair share) on the dispatcher's Python model
(``tests/fair_model.py``, held to the Lua by ``tests/test_fair_parity.py``), with no Redis:
principals alternate and share by their weights whatever their number of runs, a principal's
runs on one model share its part by priority and ``low`` is never starved, a turn serves one
model until its time is up, a newcomer is served next, leaving and coming back gains nothing,
every staged message is dispatched once and in its run's order, and ``submit``'s message goes
to the queue's head."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from evalq.shared.queue.backlog import TURN_SECONDS
from tests.fair_model import FIRST_OF, Entry, FairRound

QUEUE = "q"
WEIGHTS = st.sampled_from([1, 2, 4])
SIZES = st.sampled_from([1, 7, 64, 100, 256])
examples = settings(max_examples=60, deadline=None)


def _stage(
    round_: FairRound,
    run: str,
    principal: str,
    *,
    weight: int = 2,
    model: str = "m",
    sizes: list[int] | None = None,
) -> None:
    """Stage ``run`` with messages of ``sizes`` samples (ten of 64 by default), oldest first."""
    entries = [Entry(s, QUEUE, f"{run}:{i}:{s}") for i, s in enumerate(sizes or [64] * 10)]
    round_.stage(run, principal, weight, model, entries)


def _take(round_: FairRound, count: int) -> list[tuple[str, int]]:
    """Dispatch ``count`` messages one at a time as a one-process worker drains the queue:
    the runs they were of and their samples, in order."""
    taken = []
    for _ in range(count):
        assert round_.dispatch(QUEUE, 1) == 1
        message = round_.pop(QUEUE)
        assert message is not None
        run, _, samples = message.split(":")
        taken.append((run, int(samples)))
    return taken


def _principal(run: str) -> str:
    return run.split("-", maxsplit=1)[0]


@examples
@given(runs=st.tuples(st.integers(1, 5), st.integers(1, 5)), weight=WEIGHTS, size=SIZES)
def test_two_principals_alternate_whatever_their_runs(
    runs: tuple[int, int], weight: int, size: int
) -> None:
    fair = FairRound(turn_seconds=TURN_SECONDS)
    for principal, count in zip("ab", runs, strict=True):
        for i in range(count):
            _stage(fair, f"{principal}-{i}", principal, weight=weight, sizes=[size] * 20)
    assert [_principal(run) for run, _ in _take(fair, 20)] == ["a", "b"] * 10


@examples
@given(
    a=st.lists(st.tuples(WEIGHTS, SIZES), min_size=1, max_size=8),
    b=st.lists(st.tuples(WEIGHTS, SIZES), min_size=1, max_size=8),
    count=st.integers(1, 60),
)
def test_principals_share_by_their_highest_weight_not_their_number_of_runs(
    a: list[tuple[int, int]], b: list[tuple[int, int]], count: int
) -> None:
    """While both stay backlogged, the samples each was served, over its weight (its
    highest-priority run's), differ by at most a message of each (start-time fair queueing's
    bound), however many runs each has and whatever their message sizes."""
    fair = FairRound(turn_seconds=TURN_SECONDS)
    for principal, runs in (("a", a), ("b", b)):
        for i, (weight, size) in enumerate(runs):
            _stage(fair, f"{principal}-{i}", principal, weight=weight, sizes=[size] * 60)
    served = Counter[str]()
    for run, samples in _take(fair, count):
        served[_principal(run)] += samples
    wa, wb = max(w for w, _ in a), max(w for w, _ in b)
    bound = max(s for _, s in a) / wa + max(s for _, s in b) / wb
    assert abs(served["a"] / wa - served["b"] / wb) <= bound


@examples
@given(runs=st.lists(st.tuples(WEIGHTS, SIZES), min_size=2, max_size=6), count=st.integers(1, 80))
def test_a_principals_runs_on_one_model_share_its_part_by_priority(
    runs: list[tuple[int, int]], count: int
) -> None:
    """Runs on the turn's model interleave by virtual time: each's samples over its weight
    stay within a message of every other's."""
    fair = FairRound(turn_seconds=TURN_SECONDS)
    for i, (weight, size) in enumerate(runs):
        _stage(fair, f"a-{i}", "a", weight=weight, sizes=[size] * 80)
    served = Counter[str]()
    for run, samples in _take(fair, count):
        served[run] += samples
    normalised = [served[f"a-{i}"] / w for i, (w, _) in enumerate(runs)]
    assert max(normalised) - min(normalised) <= max(s / w for w, s in runs)


def test_low_moves_beside_high_one_message_in_five() -> None:
    fair = FairRound(turn_seconds=TURN_SECONDS)
    _stage(fair, "a-high", "a", weight=4, sizes=[64] * 40)
    _stage(fair, "a-low", "a", weight=1, sizes=[64] * 40)
    order = [run for run, _ in _take(fair, 40)]
    assert Counter(order) == {"a-high": 32, "a-low": 8}
    assert all("a-low" in order[i : i + 5] for i in range(len(order) - 4))


def test_a_turn_serves_one_model_until_its_time_is_up() -> None:
    """A principal's runs on two models: only the turn's model moves while the turn lasts,
    however far ahead its runs' times get; once its time is up, the lowest-time run's model
    starts the next turn."""
    fair = FairRound(turn_seconds=TURN_SECONDS)
    _stage(fair, "a-1", "a", model="m1", sizes=[64] * 30)
    _stage(fair, "a-2", "a", model="m2", sizes=[64] * 30)
    assert {run for run, _ in _take(fair, 10)} == {"a-1"}
    fair.advance(TURN_SECONDS - 0.001)
    assert {run for run, _ in _take(fair, 5)} == {"a-1"}
    fair.advance(0.001)
    assert [run for run, _ in _take(fair, 3)] == ["a-2"] * 3  # a-2's time is the lowest
    _stage(fair, "a-3", "a", model="m1", sizes=[64] * 2)  # m1, joins at a-2's time
    assert [run for run, _ in _take(fair, 3)] == ["a-2"] * 3  # waits for m2's turn to end


def test_a_run_joins_its_principals_runs_at_the_principals_clock() -> None:
    """A run staged after its sibling was served joins at the time of the principal's run served
    last: it interleaves with its sibling at once, with no credit for the time it was away."""
    fair = FairRound(turn_seconds=TURN_SECONDS)
    _stage(fair, "a-1", "a", sizes=[64] * 40)
    _take(fair, 20)
    _stage(fair, "a-2", "a", sizes=[64] * 40)
    assert [run for run, _ in _take(fair, 6)] == ["a-2", "a-1"] * 3


def test_a_turn_looks_for_its_model_among_the_64_lowest_runs() -> None:
    """``fair_first_of``: the turn's model is served while a run of it is among the
    principal's 64 lowest-time runs; one further back loses the turn to the lowest."""
    for ahead, served in ((FIRST_OF - 1, "a-z"), (FIRST_OF, "a-00")):
        fair = FairRound(turn_seconds=TURN_SECONDS)
        for i in range(ahead):
            _stage(fair, f"a-{i:02}", "a", model="m1")
        _stage(fair, "a-z", "a", model="m2")  # every run at time 0: 'a-z' sorts last
        fair.turn["a"] = ("m2", fair.now + TURN_SECONDS)
        assert [run for run, _ in _take(fair, 1)] == [served]


@examples
@given(
    before=st.lists(st.tuples(st.sampled_from("abcd"), WEIGHTS, SIZES), min_size=1, max_size=8),
    served=st.integers(0, 30),
)
def test_a_newcomer_is_served_before_anyone_is_served_twice(
    before: list[tuple[str, int, int]], served: int
) -> None:
    """A principal that arrives joins at the clock: at most the principals tied with it go
    first (each once), never anyone's backlog."""
    fair = FairRound(turn_seconds=TURN_SECONDS)
    for i, (principal, weight, size) in enumerate(before):
        _stage(fair, f"{principal}-{i}", principal, weight=weight, sizes=[size] * 40)
    _take(fair, served)
    _stage(fair, "n-0", "n", sizes=[64])
    order = [_principal(run) for run, _ in _take(fair, len(fair.principals))]
    assert "n" in order
    ahead = order[: order.index("n")]
    assert len(ahead) == len(set(ahead))


def test_leaving_and_coming_back_gains_a_principal_nothing() -> None:
    """A principal submitting one-message runs as fast as they drain (each moved to the
    queue's head, as submit does) against a big run, four workers' depth: it comes back at its
    own time when it left, so it gets about half of the samples, not every message."""
    fair = FairRound(turn_seconds=TURN_SECONDS)
    _stage(fair, "v-0", "v", sizes=[256] * 40)
    served = Counter[str]()
    for i in range(40):
        entry = Entry(64, QUEUE, f"x-{i}:0:64")
        fair.stage(f"x-{i}", "x", 2, "m", [entry], queue=QUEUE, refill=4, at_least=1)
        message = fair.pop(QUEUE)
        assert message is not None
        run, _, samples = message.split(":")
        served[_principal(run)] += int(samples)
        assert fair.finish.get("x", 0.0) <= fair.principals.get("x", fair.finish["x"])
    assert 0.35 <= served["x"] / (served["x"] + served["v"]) <= 0.65, served


@examples
@given(
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("stage"), st.integers(0, 5), st.integers(1, 5), SIZES),
            st.tuples(st.just("dispatch"), st.integers(1, 6), st.just(0), st.just(0)),
            st.tuples(st.just("withdraw"), st.integers(0, 5), st.just(0), st.just(0)),
            st.tuples(st.just("turns"), st.just(0), st.just(0), st.just(0)),
        ),
        max_size=40,
    )
)
def test_every_staged_message_is_dispatched_once_in_its_runs_order(
    steps: list[tuple[str, int, int, int]],
) -> None:
    """Whatever is staged, dispatched (workers taking all each time), withdrawn or waited
    for, each message is dispatched at most once, a run's messages in the order they were
    staged, and once the round is drained every message of a run not withdrawn was."""
    fair = FairRound(turn_seconds=TURN_SECONDS)
    staged: dict[str, list[str]] = {}
    withdrawn: set[str] = set()
    moved: list[str] = []

    def drain(depth: int) -> int:
        count = fair.dispatch(QUEUE, depth)
        moved.extend(reversed(fair.queues.pop(QUEUE, [])))  # pushed at the tail, in order
        return count

    for kind, a, b, size in steps:
        run = f"{'abc'[a % 3]}-{a}"
        if kind == "stage" and run not in withdrawn:
            entries = [
                Entry(size, QUEUE, f"{run}:{len(staged.get(run, [])) + i}") for i in range(b)
            ]
            staged.setdefault(run, []).extend(e.message for e in entries)
            fair.stage(run, _principal(run), 1 << (a % 3), f"m{a % 2}", entries)
        elif kind == "dispatch":
            drain(a)
        elif kind == "withdraw":
            withdrawn.add(run)
            fair.withdraw(run)
        elif kind == "turns":
            fair.advance(TURN_SECONDS)
    while drain(8):
        pass
    assert len(moved) == len(set(moved))
    for run, messages in staged.items():
        arrived = [m for m in moved if m.split(":")[0] == run]
        assert arrived == messages[: len(arrived)]
        if run not in withdrawn:
            assert arrived == messages
    assert fair.principals == {}
    assert fair.owner == {}


def test_submits_message_goes_to_the_queues_head() -> None:
    """A queue already deep enough: ``at_least`` moves the fair choice of the moment (the new
    principal, at the clock) to the head, where the next worker takes it."""
    fair = FairRound(turn_seconds=TURN_SECONDS)
    _stage(fair, "a-0", "a")
    assert fair.dispatch(QUEUE, 4) == 4
    entry = Entry(20, QUEUE, "b-0:0:20")
    fair.stage("b-0", "b", 2, "m", [entry], queue=QUEUE, refill=4, at_least=1)
    assert fair.pop(QUEUE) == "b-0:0:20"
    assert len(fair.queues[QUEUE]) == 4
