"""The endpoint lane's parts without Redis: a principal's share of the lane's threads, jobs run
as a pool runs them, and one gate per endpoint and principal shared by threads that each run
their own event loop."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from evalq.shared.lm.backoff import Gate
from evalq.worker.lane import EndpointLane
from tests.helpers import wait_for


def test_a_principal_takes_at_most_half_the_lane_and_leaves_a_place_for_one_that_holds_none() -> (
    None
):
    """The attack review filled a 4-thread lane with two stalled principals (two places each)
    and a third principal's message waited behind them: a principal now takes a second place
    only while another stays free."""
    lane = EndpointLane(4, on_exit=lambda: None)
    assert lane.share == 2
    assert lane.take("flood")
    assert lane.take("flood")
    assert not lane.take("flood")  # its third message goes back to its backlog
    assert lane.take("carol")
    assert not lane.take("carol")  # a second place would leave none free
    assert lane.take("bob")  # the last free place: bob's, who held none
    assert not lane.take("dave")  # full: dave's message goes back to its backlog
    lane.release("flood")
    assert lane.take("dave")
    assert EndpointLane(3, on_exit=lambda: None).share == 1  # half, rounded down
    one = EndpointLane(1, on_exit=lambda: None)
    assert one.take("flood")
    assert not one.take("bob")


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
    endpoint and principal: never more than its ceiling in flight between them, and a request
    waiting in one loop goes as soon as one ends in the other."""
    gate = Gate.of(2, "http://server/v1", "alice-test")
    assert Gate.of(1, "http://server/v1", "alice-test") is gate  # another run, asking less
    assert gate.ceiling == 2
    assert Gate.of(2, "http://server/v1", "bob-test") is not gate
    inside = 0
    most = 0
    lock = threading.Lock()
    release = threading.Event()

    async def request() -> None:
        nonlocal inside, most
        async with gate:
            with lock:
                inside += 1
                most = max(most, inside)
            await asyncio.to_thread(release.wait, 10)
            with lock:
                inside -= 1

    async def job() -> None:
        await asyncio.gather(*(request() for _ in range(3)))

    threads = [threading.Thread(target=asyncio.run, args=(job(),)) for _ in range(2)]
    for thread in threads:
        thread.start()
    wait_for(lambda: inside == 2, 10, "two requests in flight")
    release.set()
    for thread in threads:
        thread.join(20)
        assert not thread.is_alive()  # every waiter was woken, whichever loop it waited in
    assert most == 2
