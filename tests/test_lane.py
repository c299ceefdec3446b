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


def test_a_principal_takes_at_most_half_the_lane_and_others_still_get_places() -> None:
    lane = EndpointLane(4, on_exit=lambda: None)
    assert lane.share == 2
    assert lane.take("flood")
    assert lane.take("flood")
    assert not lane.take("flood")  # its third message goes back to its backlog
    assert lane.take("bob")
    assert lane.take("bob")
    lane.release("flood")
    assert lane.take("flood")
    assert EndpointLane(1, on_exit=lambda: None).share == 1


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
    lane.close()
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
    lane.close()


def test_one_gate_bounds_requests_across_threads_and_wakes_a_waiter_in_another_loop() -> None:
    """Two threads, each with its own event loop (two lane jobs), share the gate of one
    endpoint and principal: never more than its ceiling in flight between them, and a request
    waiting in one loop goes as soon as one ends in the other."""
    gate = Gate.of(2, "http://server/v1", "served", "alice-test")
    assert Gate.of(2, "http://server/v1", "served", "alice-test") is gate
    assert Gate.of(2, "http://server/v1", "served", "bob-test") is not gate
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
