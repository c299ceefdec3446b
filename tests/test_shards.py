"""Shards from specs: routing, deterministic re-materialization, the LRU cap, verification."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
import tracemalloc
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from evalq.producer.operations.demo_data import write_demo_dataset
from evalq.producer.operations.redis_server import RedisServer
from evalq.producer.service.submit import SubmitRequest, submit
from evalq.shared.connection import connect
from evalq.shared.data.loading import Sharding, build_spec, shard_of_rows, stream_texts
from evalq.shared.data.routing import (
    Contiguous,
    Featurizer,
    KMeans,
    KMeansFit,
    RoundRobin,
    RoutingKind,
    assign,
    fit_kmeans,
)
from evalq.shared.data.spec import DatasetSpec, LocalSource, publish_spec
from evalq.shared.errors import InputError
from evalq.shared.models import RunMeta, RunStatus, SampleTask
from evalq.shared.queue.celery_app import INFER_QUEUE, INFER_TASK
from evalq.shared.queue.sizing import publish, split
from evalq.shared.store.reader import ResultReader
from evalq.worker.shard_cache import ShardCache, rows_digest
from tests.conftest import Stack
from tests.helpers import REPO, list_splits, record_run, wait_ended

ROUTINGS = (
    Sharding(shards=3),
    Sharding(shards=3, routing=RoutingKind.ROUND_ROBIN),
    Sharding(shards=3, routing=RoutingKind.KMEANS, sample_size=200),
)


@pytest.fixture(scope="module")
def demo_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo_dataset(tmp_path_factory.mktemp("demo"), validation_size=300)


def _spec(folder: Path, sharding: Sharding) -> DatasetSpec:
    spec, _ = build_spec(str(folder), "validation", sharding=sharding)
    return spec


def test_contiguous_and_round_robin_cover_every_row_once() -> None:
    assert assign(Contiguous(), 3, 10).tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 2]
    assert assign(Contiguous(), 4, 2).tolist() == [1, 3]  # more shards than rows: some empty
    assert assign(RoundRobin(), 3, 7).tolist() == [0, 1, 2, 0, 1, 2, 0]


def test_kmeans_fit_is_deterministic_and_reads_only_its_sample() -> None:
    texts = [f"{topic} story number {i}" for i in range(50) for topic in ("rain", "goal", "chip")]
    read = 0

    def stream() -> Iterator[str]:
        nonlocal read
        for text in texts:
            read += 1
            yield text

    fit = KMeansFit(sample_size=60, seed=1, iterations=20)
    first = fit_kmeans(stream(), 3, Featurizer(seed=7), fit)
    assert read == 60  # the stream is not read past the sample
    assert first == fit_kmeans(iter(texts), 3, Featurizer(seed=7), fit)
    assert first != fit_kmeans(iter(texts), 3, Featurizer(seed=8), fit)
    assert isinstance(first, KMeans)
    assert len(first.centroids) == 3
    # fewer documents than shards: round robin instead of a crash
    assert fit_kmeans(iter(texts[:2]), 3, Featurizer(seed=7), fit) == RoundRobin()


def test_kmeans_groups_texts_by_content() -> None:
    texts = [f"{word} {word} {word} item {i}" for word in ("alpha", "beta") for i in range(20)]
    fit = KMeansFit(sample_size=40, seed=0, iterations=20)
    routing = fit_kmeans(iter(texts), 2, Featurizer(seed=0), fit)
    shards = assign(routing, 2, len(texts), iter([texts])).tolist()
    assert len(set(shards[:20])) == 1
    assert len(set(shards[20:])) == 1
    assert shards[0] != shards[20]


def test_a_spec_rejects_centroids_that_do_not_fit_its_shards(demo_folder: Path) -> None:
    spec = _spec(demo_folder, ROUTINGS[2])
    raw = spec.model_dump(mode="json")
    raw["shards"] = 4
    with pytest.raises(ValueError, match="3 centroids for 4 shards"):
        DatasetSpec.model_validate(raw)
    assert "max_shards" not in spec.canonical_json()
    assert "verify" not in spec.canonical_json()


def test_routing_by_a_label_field_is_refused(redis_only: RedisServer, demo_folder: Path) -> None:
    from evalq.shared.queue.celery_app import create_app
    from evalq.shared.settings import Settings

    client = connect(redis_only.url)
    app = create_app(Settings(redis_url=redis_only.url))
    request = SubmitRequest(
        eval="null",
        data=str(demo_folder),
        split="validation",
        sharding=Sharding(shards=2, routing=RoutingKind.KMEANS, route_field="label"),
    )
    with pytest.raises(InputError, match="label field"):
        submit(
            client,
            app,
            request,
            principal="tests",
            admin=True,
            archive=str(demo_folder / "archive"),
        )
    assert client.llen(INFER_QUEUE) == 0


def _big_split(path: Path, rows: int) -> LocalSource:
    line = "lorem ipsum dolor sit amet " * 20
    path.write_text("".join(json.dumps({"text": f"{i} {line}"}) + "\n" for i in range(rows)))
    return LocalSource.model_validate(
        {"format": "json", "files": [{"path": str(path), "sha256": "0" * 64}]}
    )


def _peak(work: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        work()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_kmeans_fit_streams_only_its_sample(tmp_path: Path) -> None:
    """Peak Python memory of a fit stays put when the split grows fourfold (2.8 -> 11 MB),
    below the big split's size, while holding a split's texts whole takes more than its size
    (shown on a 0.6 MB split): the fit never holds the split. (With ``datasets``' 10 MiB JSON
    batches a stream held 37.5 MB at once, and this test needed a 56 MB split.)"""
    small = _big_split(tmp_path / "small.jsonl", 5_000)
    big = _big_split(tmp_path / "big.jsonl", 20_000)
    whole = _big_split(tmp_path / "whole.jsonl", 1_000)
    fit = KMeansFit(sample_size=500, seed=0, iterations=10)

    def fitted(source: LocalSource) -> Callable[[], object]:
        return lambda: fit_kmeans(stream_texts(source, "x", "text"), 4, Featurizer(seed=0), fit)

    def size(source: LocalSource) -> int:
        return Path(source.files[0].path).stat().st_size

    fitted(whole)()  # first use imports the streaming readers; measure after
    small_peak, big_peak = _peak(fitted(small)), _peak(fitted(big))
    whole_peak = _peak(lambda: list(stream_texts(whole, "x", "text")))
    assert big_peak < small_peak * 1.1, (small_peak, big_peak)
    assert big_peak < size(big), (big_peak, size(big))
    assert whole_peak > size(whole), (whole_peak, size(whole))


_MATERIALIZE = """
import json, sys
from evalq.shared.connection import connect
from evalq.worker.shard_cache import ShardCache, rows_digest
cache = ShardCache(connect(sys.argv[1]), capacity=1)
specs = json.loads(sys.argv[2])
print(json.dumps({fp: [rows_digest(cache.shard(fp, k)) for k in range(shards)]
                  for fp, shards in specs.items()}))
"""


@pytest.fixture(scope="module")
def built_twice(
    demo_folder: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[redis.Redis, dict[str, DatasetSpec], list[dict[str, list[str]]]]]:
    """A spec of each routing published, and the digests of their shards as two worker
    processes built them, each with a datasets cache of its own: nothing shared but Redis."""
    root = tmp_path_factory.mktemp("built")
    with RedisServer(root / "redis") as server:
        client = connect(server.url)
        specs = {sharding.routing.value: _spec(demo_folder, sharding) for sharding in ROUTINGS}
        shards = {publish_spec(client, spec): spec.shards for spec in specs.values()}
        workers = [
            subprocess.Popen(
                [sys.executable, "-c", _MATERIALIZE, server.url, json.dumps(shards)],
                env={"HF_DATASETS_CACHE": str(root / name), "PYTHONPATH": str(REPO), "PATH": ""},
                stdout=subprocess.PIPE,
                text=True,
            )
            for name in ("a", "b")
        ]
        digests = [json.loads(worker.communicate(timeout=120)[0]) for worker in workers]
        assert [worker.returncode for worker in workers] == [0, 0]
        yield client, specs, digests


@pytest.mark.parametrize("sharding", ROUTINGS, ids=lambda s: s.routing.value)
@pytest.mark.integration
def test_two_worker_processes_build_identical_shards(
    built_twice: tuple[redis.Redis, dict[str, DatasetSpec], list[dict[str, list[str]]]],
    sharding: Sharding,
) -> None:
    client, specs, (a, b) = built_twice
    spec = specs[sharding.routing.value]
    fingerprint = spec.fingerprint
    assert a[fingerprint] == b[fingerprint]
    assert len(set(a[fingerprint])) == spec.shards  # three different shards
    assert client.hgetall(f"evalq:spec:{fingerprint}:shards") == {
        str(k): d for k, d in enumerate(a[fingerprint])
    }


def test_the_shard_cap_holds_and_a_rebuilt_shard_has_the_same_rows(
    redis_only: RedisServer, demo_folder: Path
) -> None:
    client = connect(redis_only.url)
    spec, rows = build_spec(str(demo_folder), "validation", sharding=Sharding(shards=6))
    fingerprint = publish_spec(client, spec)
    shard_of = shard_of_rows(spec, rows)
    members = [[i for i in range(spec.n_rows) if shard_of[i] == k] for k in range(6)]
    cache = ShardCache(client, capacity=2)

    first = []
    for k in range(6):
        fetched = cache.rows(fingerprint, members[k][:5])
        assert fetched == [rows[i] for i in members[k][:5]]
        first.append(rows_digest(cache.shard(fingerprint, k)))
    assert cache.builds == 6
    cache.rows(fingerprint, members[5][:3])
    cache.rows(fingerprint, members[4][:3])
    assert cache.builds == 6  # the two most recent shards are held

    again = cache.rows(fingerprint, members[0])  # evicted: rebuilt
    assert cache.builds == 7
    assert again == [rows[i] for i in members[0]]
    assert rows_digest(cache.shard(fingerprint, 0)) == first[0]


def test_a_message_body_holds_ids_only_grouped_by_shard(
    redis_only: RedisServer, demo_folder: Path
) -> None:
    from evalq.shared.queue.backlog import Backlog
    from evalq.shared.queue.celery_app import create_app
    from evalq.shared.settings import Settings

    client = connect(redis_only.url)
    app = create_app(Settings(redis_url=redis_only.url))
    sharding = Sharding(shards=3, routing=RoutingKind.KMEANS, sample_size=200)
    request = SubmitRequest(
        eval="null", data=str(demo_folder), split="validation", sharding=sharding
    )
    meta = submit(
        client, app, request, principal="tests", admin=True, archive=str(demo_folder / "archive")
    )
    spec, rows = build_spec(str(demo_folder), "validation", sharding=sharding)
    texts = {str(r["text"]) for r in rows}

    ids: list[int] = []
    queued = reversed(client.lrange(INFER_QUEUE, 0, -1))  # dispatched first, oldest last
    backlogged = reversed(list(Backlog(client).messages(meta.run_id)))
    for raw in [*queued, *backlogged]:
        message = json.loads(raw)
        body = base64.b64decode(message["body"]).decode()
        assert not any(text in body for text in texts)
        assert "label" not in body
        _, kwargs, _ = json.loads(body)
        assert set(kwargs) == set(SampleTask.model_fields)
        task = SampleTask.model_validate(kwargs)
        assert (task.run_id, task.spec) == (meta.run_id, spec.fingerprint)
        ids.extend(task.sample_ids)
    assert sorted(ids) == list(range(spec.n_rows))
    shard_of = shard_of_rows(spec, rows)
    in_order = [int(shard_of[i]) for i in ids]
    assert in_order == sorted(in_order)  # enqueued shard by shard


def _enqueue(stack: Stack, spec: DatasetSpec) -> str:
    """Publish ``spec`` and a run over all its rows the way a producer does, without its gates
    (what someone who can write to Redis could do with an altered spec)."""
    publish_spec(stack.client, spec)
    meta = RunMeta(
        run_id=uuid.uuid4().hex[:16],
        eval="null",
        spec=spec.fingerprint,
        dataset_id="altered",
        split=spec.split,
        n=spec.n_rows,
        status=RunStatus.QUEUED,
        created=time.time(),
    )
    ids = list(range(spec.n_rows))
    record_run(stack.client, meta, ids, stack.settings.archive_url)
    publish(stack.app, INFER_TASK, split(meta, ids))
    return meta.run_id


def _ended(stack: Stack, run_id: str) -> RunStatus:
    return wait_ended(stack.client, run_id, 90)


def test_verification_refuses_altered_routing_and_passes_honest_specs(
    fresh_stack: Stack, demo_folder: Path
) -> None:
    fresh_stack.start_workers(EVALQ_VERIFY_ROUTING="1")
    list_splits(fresh_stack.client, str(demo_folder), "validation")
    honest = _spec(demo_folder, Sharding(shards=3, routing=RoutingKind.KMEANS, sample_size=200))
    assert isinstance(honest.routing, KMeans)
    routing = honest.routing
    moved = routing.model_copy(
        update={"centroids": (tuple(v + 0.5 for v in routing.centroids[0]), *routing.centroids[1:])}
    )
    reseeded = routing.model_copy(
        update={"featurizer": Featurizer(seed=routing.featurizer.seed + 1)}
    )
    unverifiable = routing.model_copy(update={"fit": None})
    runs = {
        name: _enqueue(fresh_stack, honest.model_copy(update={"routing": r}))
        for name, r in [
            ("honest", routing),
            ("moved", moved),
            ("reseeded", reseeded),
            ("unverifiable", unverifiable),
        ]
    }
    results = ResultReader(fresh_stack.client)
    n = honest.n_rows
    for name in ("honest", "unverifiable"):
        assert _ended(fresh_stack, runs[name]) is RunStatus.COMPLETED
        progress = results.progress(runs[name])
        assert (progress.scored, progress.failed) == (n, 0)
    for name in ("moved", "reseeded"):
        assert _ended(fresh_stack, runs[name]) is RunStatus.FAILED
        progress = results.progress(runs[name])
        assert (progress.inferred, progress.failed) == (0, n)
        errors = [r.error for r in results.fetch(runs[name], list(range(n)))]
        assert {e.kind for e in errors if e is not None} == {"RoutingError"}
        assert all(e is not None and "routing does not verify" in e.message for e in errors)
        # refused at the first attempt, never retried
        assert not any("(attempt 2" in e.message or "(attempt 3" in e.message for e in errors if e)
    fresh_stack.wait_logged("cannot verify the kmeans routing")


def test_rows_come_back_as_datasets_reads_them_in_any_order(
    redis_only: RedisServer, tmp_path: Path
) -> None:
    """Rows taken from a shard's Arrow table equal those ``datasets`` gives, nested values,
    nulls and floats included, for ids in any order and across shards."""
    records = [
        {
            "text": f"t{i}",
            "tags": [f"a{i}", None][: 1 + i % 2],
            "meta": {"x": i / 3, "y": None if i % 3 else [i, i + 1]},
            "label": i % 4,
        }
        for i in range(120)
    ]
    (tmp_path / "validation.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    client = connect(redis_only.url)
    spec, rows = build_spec(str(tmp_path), "validation", sharding=Sharding(shards=3))
    fingerprint = publish_spec(client, spec)
    ids = [117, 3, 60, 4, 59, 0, 118, 61, 2]
    assert ShardCache(client, capacity=3).rows(fingerprint, ids) == [rows[i] for i in ids]
