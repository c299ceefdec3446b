"""The endpoint lane's parts without Redis: a principal's share of the lane's threads, jobs run
as a pool runs them, and one gate per endpoint and principal shared by threads that each run
their own event loop."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from pydantic import ValidationError

from evalq.shared.lm.backoff import Gate
from evalq.shared.settings import Settings
from evalq.worker.lane import EndpointLane
from tests.helpers import wait_for


def test_a_principal_takes_a_second_place_only_in_the_first_half_of_the_lane() -> None:
    """The first review filled a 4-thread lane with two stalled principals (two places each),
    the second an 8-thread one with three (4, 3 and 1 places, each flooding in turn): a
    principal now takes a second place only while less than half the lane is taken, so
    ``threads - threads // 2 + 1`` principals are needed to fill it, more as it grows."""
    lane = EndpointLane(8, on_exit=lambda: None)
    for _ in range(4):
        assert lane.take("agent")  # the first half: agent floods first
    assert not lane.take("agent")  # never more than half
    for principal in ("carol", "dave", "erin"):
        assert lane.take(principal)
        assert not lane.take(principal)  # a second place only in the first half
    assert lane.take("bob")  # the last place: bob's, a fifth principal
    assert not lane.take("frank")  # full: frank's message goes back to its backlog
    lane.release("agent")
    assert lane.take("frank")
    small = EndpointLane(4, on_exit=lambda: None)
    assert small.take("agent")
    assert small.take("agent")
    assert not small.take("agent")  # its share
    assert small.take("carol")
    assert not small.take("carol")
    assert small.take("bob")
    assert not small.take("dave")


def test_a_lane_of_one_thread_is_refused() -> None:
    with pytest.raises(ValidationError, match="at least 2"):
        Settings(endpoint_threads=1)
    assert Settings(endpoint_threads=0).endpoint_threads == 0


def test_a_closing_lane_takes_nothing_and_waits_for_its_running_jobs() -> None:
    lane = EndpointLane(2, on_exit=lambda: None)
    release = threading.Event()
    ended = threading.Event()
    assert lane.take("bob")
    lane.apply_async(
        release.wait, (10,), principal="bob", accept_callback=lambda pid, at: None,
        callback=lambda result: ended.set(), error_callback=lambda failure: None,
    )  # fmt: skip
    assert lane.close(0.05) == 1  # still running when the wait ran out
    assert not lane.take("carol")
    release.set()
    assert lane.close(10) == 0
    assert ended.is_set()


def test_a_job_runs_on_a_lane_thread_with_a_pool_job_s_callbacks_then_frees_its_place() -> None:
    exited = threading.Event()
    lane = EndpointLane(2, on_exit=exited.set)
    seen: dict[str, Any] = {}
    returned = threading.Event()

    def target(value: int) -> int:
        seen["thread"] = threading.current_thread().name
        return value * 2

    def callback(result: Any) -> None:
        seen["result"] = result
        returned.set()

    assert lane.take("bob")
    lane.apply_async(
        target, (21,), principal="bob", accept_callback=lambda pid, at: seen.update(pid=pid),
        callback=callback, error_callback=lambda failure: seen.update(failure=failure),
    )  # fmt: skip
    assert returned.wait(10)
    assert seen["result"] == 42
    assert seen["thread"].startswith("evalq-endpoint-")
    assert "failure" not in seen
    assert lane.take("bob")  # the job's place (one of one) is free again
    assert not lane.take("bob")
    lane.release("bob")
    assert lane.close(10) == 0
    assert exited.wait(10)  # each thread frees its resources as it stops


def test_a_job_that_raises_reaches_the_error_callback() -> None:
    lane = EndpointLane(1, on_exit=lambda: None)
    failed = threading.Event()

    def target() -> None:
        raise RuntimeError("lost")

    assert lane.take("bob")
    lane.apply_async(
        target, (), principal="bob", accept_callback=lambda pid, at: None,
        callback=lambda result: None, error_callback=lambda failure: failed.set(),
    )  # fmt: skip
    assert failed.wait(10)
    assert lane.close(10) == 0


def test_one_gate_bounds_requests_across_threads_and_wakes_a_waiter_in_another_loop() -> None:
    """Two threads, each with its own event loop (two lane jobs), share the gate of one
    endpoint and principal: never more than the highest ``concurrency`` asking in flight
    between them (runs asking 2 and 1: 2), and a request waiting in one loop goes as soon as
    one ends in the other."""
    gate = Gate.of("http://server/v1", "alice-test")
    assert Gate.of("http://server/v1", "alice-test") is gate
    assert Gate.of("http://server/v1", "bob-test") is not gate
    inside = 0
    most = 0
    lock = threading.Lock()
    release = threading.Event()

    async def request(concurrency: int) -> None:
        nonlocal inside, most
        async with gate.entered(concurrency):
            with lock:
                inside += 1
                most = max(most, inside)
            await asyncio.to_thread(release.wait, 10)
            with lock:
                inside -= 1

    async def job(concurrency: int) -> None:
        await asyncio.gather(*(request(concurrency) for _ in range(3)))

    threads = [threading.Thread(target=asyncio.run, args=(job(c),)) for c in (2, 1)]
    for thread in threads:
        thread.start()
    wait_for(lambda: inside == 2, 10, "two requests in flight")
    release.set()
    for thread in threads:
        thread.join(20)
        assert not thread.is_alive()  # every waiter was woken, whichever loop it waited in
    assert most == 2


def test_a_gate_s_ceiling_is_the_highest_concurrency_asking_now_not_ever() -> None:
    """The lane's second review: a run asking 8 raised the gate for good, and two runs asking
    1 afterwards held 2 in flight. The ceiling is the highest ``concurrency`` among the
    requests waiting or in flight."""
    gate = Gate.of("http://server/v1", "carol-test")
    inside = 0
    most = 0

    async def request(concurrency: int, hold: asyncio.Event) -> None:
        nonlocal inside, most
        async with gate.entered(concurrency):
            inside += 1
            most = max(most, inside)
            await hold.wait()
            inside -= 1

    async def burst(concurrency: int, n: int) -> int:
        nonlocal most
        most = 0
        hold = asyncio.Event()
        tasks = [asyncio.create_task(request(concurrency, hold)) for _ in range(n)]
        await asyncio.sleep(0)  # each task runs to the gate (one loop: in creation order)
        hold.set()
        await asyncio.gather(*tasks)
        return most

    assert asyncio.run(burst(8, 10)) == 8
    assert asyncio.run(burst(1, 3)) == 1


def test_a_429_halves_the_limit_in_force_not_a_bound_a_higher_run_left() -> None:
    """After a run asking 16 has ended, a 429 to a run asking 4 halves 4 (was: 16, leaving 8,
    above the 4 in force: no backing off at all)."""
    gate = Gate.of("http://server/v1", "dave-test")

    async def answered(concurrency: int, throttled: bool) -> None:
        async with gate.entered(concurrency):
            if throttled:
                gate.throttled()
            else:
                gate.succeeded()

    asyncio.run(answered(16, throttled=False))
    asyncio.run(answered(4, throttled=True))
    assert gate.limit == 2.0
