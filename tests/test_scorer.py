"""Warm runtimes: script scorers in warm sandboxed subprocesses, and the bounded model pool."""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest

from evalq.producer.service.submit import SubmitRequest, submit
from evalq.shared.errors import ScriptError
from evalq.shared.evals.arithmetic import Arithmetic, arithmetic_rows
from evalq.shared.scorer import ScriptCall, ScriptScorer, run_cold
from evalq.shared.store.reader import ResultReader
from evalq.worker.script_pool import ScriptPool
from tests.conftest import Stack
from tests.helpers import list_splits, wait_completed, write_rows

# The arithmetic scorer with a deadline per call that a busy machine does not reach: these
# tests check what it answers, not how fast.
PATIENT = replace(Arithmetic.scorer, timeout=300)
PROBE = ScriptScorer(
    path=str(Path(__file__).with_name("scripts") / "probe.py"),
    timeout=3.0,
    cpu_seconds=1,
    memory_mb=512,
)


@pytest.fixture
def pool() -> Iterator[ScriptPool]:
    warm = ScriptPool(PROBE, size=1)
    yield warm
    warm.close()


def _call(*argv: str, **env: str) -> ScriptCall:
    return ScriptCall(argv=list(argv), env=env)


def test_the_callers_env_is_seen_and_does_not_leak_into_the_next_call(pool: ScriptPool) -> None:
    assert pool.call(_call("env", "GREETING", GREETING="hello")) == "hello"
    assert pool.call(_call("env", "GREETING")) == "<unset>"
    assert pool.started == 1  # one warm subprocess answered both


@pytest.mark.parametrize(
    ("argv", "message", "timeout"),
    [
        (("sleep", "30"), "timed out after 1s and was killed", 1.0),
        (("crash",), "died (SIGSEGV)", 3.0),
        (("exit",), "called sys.exit(3)", 3.0),
        # RLIMIT_CPU counts whole seconds, so a 1 s budget may run up to 2 CPU seconds: the
        # wall-clock timeout must not win that race on a busy machine
        (("spin",), "went over its CPU limit (1s)", 20.0),
    ],
    ids=["timeout", "crash", "sys.exit", "cpu"],
)
@pytest.mark.integration
def test_a_failure_is_one_clear_error_and_the_next_call_gets_a_fresh_subprocess(
    argv: tuple[str, ...], message: str, timeout: float
) -> None:
    pool = ScriptPool(replace(PROBE, timeout=timeout), size=1)
    try:
        first = pool.call(_call("pid"))
        with pytest.raises(ScriptError, match=message.replace("(", r"\(").replace(")", r"\)")):
            pool.call(_call(*argv))
        second = pool.call(_call("pid"))
        assert second != first
        assert pool.started == 2
        with pytest.raises(ProcessLookupError):
            os.kill(int(first), 0)  # the old one is gone, not left running
    finally:
        pool.close()


@pytest.mark.integration
def test_the_cpu_limit_is_per_call_not_per_subprocess(pool: ScriptPool) -> None:
    first = pool.call(_call("pid"))
    for _ in range(4):  # 4 x 0.6 CPU seconds in one subprocess (a 1 s budget runs at most 2);
        assert pool.call(_call("burn", "0.6")) == "burnt"  # each call is under its 1 s
    assert pool.call(_call("pid")) == first


def test_an_exception_is_an_error_and_the_subprocess_is_kept(pool: ScriptPool) -> None:
    first = pool.call(_call("pid"))
    with pytest.raises(ScriptError, match="ValueError: bad output"):
        pool.call(_call("raise"))
    assert pool.call(_call("print")) == "answered"  # prints never corrupt the answers
    assert pool.call(_call("pid")) == first


def test_a_call_cannot_see_the_previous_calls_files(pool: ScriptPool) -> None:
    assert pool.call(_call("write", "secret.txt")) == ""
    assert pool.call(_call("ls")) == ""
    assert pool.call(_call("write", "other.txt")) == ""


def test_the_memory_limit_stops_a_script_that_allocates_too_much(pool: ScriptPool) -> None:
    assert pool.call(_call("alloc", "16")) == str(16 * 1024 * 1024)
    with pytest.raises(ScriptError, match="MemoryError"):
        pool.call(_call("alloc", "1024"))
    assert pool.call(_call("alloc", "16")) == str(16 * 1024 * 1024)


def test_the_pool_is_bounded_and_closing_it_stops_every_subprocess() -> None:
    warm = ScriptPool(PROBE, size=2)
    pids = set(warm.map([_call("pid") for _ in range(12)]))
    assert warm.started == 2
    assert len(pids) == 2
    warm.close()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(int(str(pid)), 0)


@pytest.mark.integration
def test_warm_and_cold_answers_are_identical() -> None:
    evaluation = Arithmetic(tolerance="1e-3")
    rows = arithmetic_rows(4, seed=3)  # -, / of a fraction, +, / of a whole number
    outputs = evaluation.infer(None, rows)
    calls = [evaluation.script_call(row, out) for row, out in zip(rows, outputs, strict=True)]
    calls += [ScriptCall(argv=["2.5", "5/2"]), ScriptCall(argv=["not a number", "1"])]
    calls += [ScriptCall(argv=["0.3333", "1/3"], env={"CHECK_TOLERANCE": "1e-3"})]
    with ThreadPoolExecutor(2) as side_by_side:  # each a fresh subprocess
        cold = list(side_by_side.map(partial(run_cold, PATIENT), calls))
    warm = ScriptPool(PATIENT, size=2)
    try:
        assert warm.map(calls) == cold
    finally:
        warm.close()
    assert set(cold) == {"0", "1"}
    assert cold[-3:] == ["1", "0", "1"]


def test_a_script_scored_run_end_to_end(stack: Stack, tmp_path: Path) -> None:
    rows = arithmetic_rows(20, seed=1)  # more than one batch of 16; the toy model gets 2 wrong
    write_rows(tmp_path, "validation", rows)  # type: ignore[arg-type]
    name = list_splits(stack.client, str(tmp_path), "validation")
    request = SubmitRequest(eval="arithmetic", dataset=name, split="validation")
    meta = submit(
        stack.client, stack.app, request, principal="tests", archive=stack.settings.archive_url
    )
    wait_completed(stack.client, meta.run_id)

    evaluation = Arithmetic()
    expected = [
        float(run_cold(PATIENT, evaluation.script_call(row, out)))
        for row, out in zip(rows, evaluation.infer(None, rows), strict=True)
    ]
    results = ResultReader(stack.client).fetch(meta.run_id, list(range(len(rows))))
    assert [r.scores for r in results] == [{"correct": e} for e in expected]
    assert 0 < sum(expected) < len(rows)  # the toy model gets some wrong


def test_the_model_pool_cap_holds_across_more_evals_than_the_cap(
    fresh_stack: Stack, tmp_path: Path
) -> None:
    fresh_stack.start_workers(EVALQ_MAX_MODELS="2")
    write_rows(tmp_path / "data", "validation", [{"text": f"t{i}", "label": 0} for i in range(5)])
    data = str(tmp_path / "data")
    dataset = list_splits(fresh_stack.client, data, "validation")
    log = tmp_path / "models.log"
    for name in ("a", "b", "c", "d", "a"):
        params = {"name": name, "log": str(log)}
        request = SubmitRequest(eval="sized", dataset=dataset, split="validation", params=params)
        meta = submit(
            fresh_stack.client, fresh_stack.app, request, principal="tests",
            archive=fresh_stack.settings.archive_url,
        )  # fmt: skip
        wait_completed(fresh_stack.client, meta.run_id, 60)

    events = [line.split() for line in log.read_text().splitlines()]
    live: dict[str, set[str]] = {}
    most = 0
    for kind, pid, name in events:
        held = live.setdefault(pid, set())
        if kind == "load":
            held.add(name)
        else:
            held.discard(name)
        most = max(most, len(held))
    assert most == 2  # never more than EVALQ_MAX_MODELS loaded in one process
    assert [n for kind, _, n in events if kind == "load"] == ["a", "b", "c", "d", "a"]
    assert [n for kind, _, n in events if kind == "free"][:3] == [
        "a",
        "b",
        "c",
    ]  # freed on eviction
