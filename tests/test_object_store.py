"""Datasets on object storage, against a real S3-compatible server (moto's, in its own process on
loopback): splits registered from an ``s3://`` prefix and pinned by each object's ETag and
sha256; a changed or missing object fails the next submit; a URL carrying credentials is refused
without repeating them; a missing bucket is one line; objects are read once into a bounded
cache, the one the caller hands in (shown on a ``file://`` store, without Redis or the server:
the environment names another, which nothing reads). The integration test runs workers as
another user, in another directory, that can read none of the gateway's files, against the data
and the archive on the server."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import stat
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from evalq.producer.clients.remote import RemoteClient
from evalq.producer.operations.redis_server import RedisServer
from evalq.producer.operations.workers import LocalWorkers
from evalq.producer.service.client import Client
from evalq.producer.service.submit import SubmitRequest
from evalq.shared.access.policy import Tier
from evalq.shared.access.registry import DatasetRegistry
from evalq.shared.access.roles import Role
from evalq.shared.access.tiers import TierRegistry
from evalq.shared.connection import connect
from evalq.shared.data.loading import load_rows, spec_of
from evalq.shared.data.remote import DataCache, materialize, remote_splits
from evalq.shared.data.spec import DatasetSpec, RemoteSource
from evalq.shared.errors import SpecError
from evalq.shared.evaluation import load_plugins
from evalq.shared.keys import AUDIT, DATASET_FILES, DATASETS, RUNS, RunKeys
from evalq.shared.models import RunStatus
from evalq.shared.settings import Settings, get_settings
from tests.conftest import Stack
from tests.helpers import (
    cli_env,
    evalq_in_process,
    expected_accuracy,
    gateway,
    labelled_rows,
    wait_for,
)
from tests.plugins import predict
from tests.s3_server import KEY, SECRET, S3Server


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """The server, and this process's environment pointed at it (as a deployment's would be)."""
    server = S3Server(tmp_path_factory.mktemp("s3") / "moto.log")
    with pytest.MonkeyPatch.context() as patch:
        for name, value in server.env.items():
            patch.setenv(name, value)
        yield server
    server.stop()


@pytest.fixture
def data_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[DataCache]:
    """A data cache in a folder of the test's own: handed to what the test calls, and named
    by this process's ``EVALQ_DATA_CACHE`` for the entry points it runs (a command, a client
    made from settings), as a deployment's would be."""
    monkeypatch.setenv("EVALQ_DATA_CACHE", str(tmp_path / "data-cache"))
    get_settings.cache_clear()
    yield DataCache.of(get_settings())
    get_settings.cache_clear()


def _bucket(fs: Any) -> str:
    name = f"evalq-{uuid.uuid4().hex[:12]}"
    fs.mkdir(name)
    return name


def _put(fs: Any, path: str, rows: list[dict[str, object]]) -> bytes:
    body = "".join(json.dumps(row) + "\n" for row in rows).encode()
    fs.pipe(path, body)
    return body


def _etag(fs: Any, path: str) -> str:
    return str(fs.info(path)["ETag"]).strip('"')


def _sha256(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def test_a_prefix_is_registered_split_by_split_each_object_pinned_by_etag_and_sha256(
    s3: S3Server, redis_only: RedisServer, data_cache: DataCache
) -> None:
    fs, client = s3.fs(), connect(redis_only.url)
    bucket = _bucket(fs)
    test = _put(fs, f"{bucket}/ds/test.jsonl", labelled_rows(3))
    parts = [
        _put(fs, f"{bucket}/ds/validation-0000{k}-of-00002.jsonl", labelled_rows(2)) for k in (1, 2)
    ]
    fs.pipe(f"{bucket}/ds/README.md", b"not data")
    record, _ = DatasetRegistry(client).add(
        "objds", f"s3://{bucket}/ds/", who="op", data_cache=data_cache
    )
    assert record.data == f"s3://{bucket}/ds/"
    assert sorted(record.splits) == ["test", "validation"]
    source = record.source("validation")
    assert isinstance(source, RemoteSource)
    assert source.format == "json"
    assert [(f.url, f.etag, f.sha256) for f in source.files] == [
        (f"s3://{bucket}/ds/{name}", _etag(fs, f"{bucket}/ds/{name}"), _sha256(body))
        for name, body in zip(
            ("validation-00001-of-00002.jsonl", "validation-00002-of-00002.jsonl"), parts,
            strict=True,
        )
    ]  # fmt: skip
    assert client.hget(DATASET_FILES, _sha256(test)) == "objds/test"
    spec, rows = spec_of(source, "validation", cache=data_cache)
    assert spec.n_rows == len(rows) == 4
    stored = json.dumps([client.hgetall(DATASETS), spec.canonical_json()])
    assert KEY not in stored
    assert SECRET not in stored
    # the copies this process read are named by content, in a folder only its user can read
    assert sorted(p.name for p in data_cache.folder.iterdir()) == sorted(
        f"{_sha256(body)}.jsonl" for body in (test, *parts)
    )
    assert stat.S_IMODE(data_cache.folder.stat().st_mode) == 0o700


def _submitter(redis_url: str, tmp_path: Path) -> Client:
    settings = Settings(
        redis_url=redis_url, plugins=("tests.plugins",), archive_url=str(tmp_path / "archive")
    )
    load_plugins(settings.plugins)
    return Client(settings)


def test_a_changed_or_missing_object_fails_the_next_submit(
    s3: S3Server, redis_only: RedisServer, data_cache: DataCache, tmp_path: Path
) -> None:
    fs, client = s3.fs(), connect(redis_only.url)
    bucket = _bucket(fs)
    _put(fs, f"{bucket}/ds/test.jsonl", labelled_rows(5))
    DatasetRegistry(client).add("objds", f"s3://{bucket}/ds/", who="op", data_cache=data_cache)
    TierRegistry(client).set("objds", "test", Tier.VIEWABLE, who="op")
    submitter = _submitter(redis_only.url, tmp_path)
    request = SubmitRequest(eval="spy", dataset="objds", split="test")
    assert submitter.submit(request).n == 5
    _put(fs, f"{bucket}/ds/test.jsonl", labelled_rows(5))
    with pytest.raises(SpecError) as refused:
        submitter.submit(request)
    assert str(refused.value) == (
        f"object s3://{bucket}/ds/test.jsonl differs from the one pinned for it (its ETag or "
        "version changed)"
    )
    fs.rm(f"{bucket}/ds/test.jsonl")
    with pytest.raises(SpecError, match=rf"^object s3://{bucket}/ds/test.jsonl is missing$"):
        submitter.submit(request)
    assert client.zcard(RUNS) == 1


@pytest.mark.integration
def test_bytes_that_do_not_hash_to_the_pinned_sha256_are_refused_and_not_kept(
    s3: S3Server, data_cache: DataCache
) -> None:
    """An ETag a store kept while the bytes changed (or a copy altered on the way): the digest
    of what was read decides."""
    fs = s3.fs()
    bucket = _bucket(fs)
    body = _put(fs, f"{bucket}/ds/test.jsonl", labelled_rows(4))
    url = f"s3://{bucket}/ds/test.jsonl"
    forged = RemoteSource.model_validate(
        {"format": "json",
         "files": [{"url": url, "etag": _etag(fs, url), "sha256": _sha256(b"other bytes")}]}
    )  # fmt: skip
    spec = DatasetSpec(source=forged, split="test", n_rows=4)
    with pytest.raises(SpecError, match=rf"^object {url} differs from the one pinned for it"):
        load_rows(spec, data_cache)
    assert not [p for p in data_cache.folder.iterdir() if not p.name.startswith(".")]
    assert _sha256(body) not in {p.name.split(".")[0] for p in data_cache.folder.iterdir()}


@pytest.mark.parametrize(
    "url",
    [
        "s3://AKIAEXAMPLE7Q:wJalrXUtnFEMIK7MDENG@bucket/ds/",
        "s3://bucket/ds/?X-Amz-Credential=AKIAEXAMPLE7Q",
    ],
)
def test_a_url_carrying_credentials_is_refused_without_repeating_them(
    redis_only: RedisServer, url: str
) -> None:
    for command in (
        ("datasets", "add", "objds", "--data", url),
        ("submit", "spy", "--data", url, "--split", "test", "--admin"),
    ):
        result = evalq_in_process(redis_only.url, *command)
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith("error: a data URL may carry no credentials")
        assert result.stderr.count("\n") == 1
        assert "AKIAEXAMPLE7Q" not in result.stdout + result.stderr
    client = connect(redis_only.url)
    assert not client.exists(DATASETS)
    assert "AKIAEXAMPLE7Q" not in json.dumps(client.xrange(AUDIT))


def test_a_missing_bucket_or_prefix_is_one_line(
    s3: S3Server, redis_only: RedisServer, data_cache: DataCache
) -> None:
    fs = s3.fs()
    bucket = _bucket(fs)
    fs.pipe(f"{bucket}/notes/README.md", b"not data")
    missing = "no such object, folder or bucket: {}"
    for url, said in (
        ("s3://no-such-bucket-evalq/ds/", missing),
        (f"s3://{bucket}/nothing-here/", missing),
        (f"s3://{bucket}/notes/", "{} holds no parquet, jsonl, json, csv or arrow file"),
    ):
        result = evalq_in_process(redis_only.url, "datasets", "add", "objds", "--data", url)
        assert (result.returncode, result.stderr) == (2, f"error: {said.format(url)}\n")


@pytest.mark.integration
def test_objects_are_read_once_into_a_cache_that_keeps_to_its_bound(
    s3: S3Server, data_cache: DataCache
) -> None:
    fs = s3.fs()
    bucket = _bucket(fs)
    bodies = {s: _put(fs, f"{bucket}/ds/{s}.jsonl", labelled_rows(50)) for s in ("a", "b")}
    cache = dataclasses.replace(data_cache, max_bytes=max(map(len, bodies.values())))
    splits = remote_splits(f"s3://{bucket}/ds/", cache)  # pins a, then b: b's copy is kept
    fs.rm(f"{bucket}/ds/b.jsonl")
    (copy,) = materialize(splits["b"], cache)  # from the cache: the object is gone from the store
    assert copy.read_bytes() == bodies["b"]
    assert [p.name for p in cache.folder.iterdir()] == [copy.name]  # a's copy went: the bound
    (other,) = materialize(splits["a"], cache)  # read from the store again
    assert other.read_bytes() == bodies["a"]
    assert [p.name for p in cache.folder.iterdir()] == [other.name]
    with pytest.raises(SpecError, match=r"^object s3://\S+/b.jsonl is missing$"):
        materialize(splits["b"], cache)


def test_the_cache_objects_are_read_through_is_the_one_handed_in_not_the_environments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = tmp_path / "store"
    store.mkdir()
    bodies = {s: json.dumps({"text": s * 40}).encode() + b"\n" for s in ("a", "b")}
    for split, body in bodies.items():
        (store / f"{split}.jsonl").write_bytes(body)
    elsewhere = tmp_path / "named-by-the-environment"
    monkeypatch.setenv("EVALQ_DATA_CACHE", str(elsewhere))
    monkeypatch.setenv("EVALQ_DATA_CACHE_BYTES", str(2**30))  # would keep both copies
    get_settings.cache_clear()
    try:
        cache = DataCache(tmp_path / "handed-in", max_bytes=max(map(len, bodies.values())))
        splits = remote_splits(f"{store.as_uri()}/", cache)  # pins a, then b: b's copy is kept
        kept = [f"{_sha256(bodies['b'])}.jsonl"]
        assert [p.name for p in cache.folder.iterdir()] == kept  # the bound handed in
        spec = DatasetSpec(source=splits["b"], split="b", n_rows=1)
        with pytest.raises(ValueError, match=r"^an object-store source is read through a data"):
            load_rows(spec)
        assert load_rows(spec, cache)["text"] == ["b" * 40]
        (copy,) = materialize(splits["a"], cache)  # read again, and b's copy goes
        assert copy.read_bytes() == bodies["a"]
        assert [p.name for p in cache.folder.iterdir()] == [copy.name]
        assert not elsewhere.exists()
    finally:
        get_settings.cache_clear()


def _as_nobody(stash: Path) -> list[str]:
    """A launcher running its command line as ``nobody``. Where this interpreter lives under a
    folder other users cannot search (pyenv under ``/root``), the command runs in a mount
    namespace of its own in which that folder is an empty tmpfs holding only the interpreter's
    tree (bound back from ``stash``): nothing else of it is there to read."""
    drop = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"]
    base = Path(sys.base_prefix).resolve()
    locked = next((p for p in reversed(base.parents) if not p.stat().st_mode & stat.S_IXOTH), None)
    if locked is None:
        return drop
    keep = locked / base.relative_to(locked).parts[0]
    script = (
        'mount --bind "$1" "$2" && mount -t tmpfs -o mode=755 evalq "$3" && mkdir -p "$1" '
        '&& mount --move "$2" "$1" && shift 3 && exec "$@"'
    )
    return ["unshare", "--mount", "--propagation", "private",
            "sh", "-c", script, "sh", str(keep), str(stash), str(locked), *drop]  # fmt: skip


@pytest.mark.integration
def test_workers_sharing_no_disk_with_the_gateway_evaluate_and_archive_on_object_storage(
    fresh_stack: Stack, s3: S3Server, tmp_path: Path
) -> None:
    stack, fs = fresh_stack, s3.fs()
    data, archive = _bucket(fs), _bucket(fs)
    rows = labelled_rows(40)
    body = _put(fs, f"{data}/ds/test.jsonl", rows)  # the rows are on the server only
    gateway_home = tmp_path / "gateway"
    gateway_home.mkdir(mode=0o700)
    archive_url = f"s3://{archive}/runs"
    roles = {"ops": Role.ADMIN, "alice": Role.USER}
    tokens = {who: Client(stack.settings).create_token(who, role) for who, role in roles.items()}
    settings = {"EVALQ_DATA_CACHE": str(gateway_home / "data"), "EVALQ_ARCHIVE_URL": archive_url}
    with (
        gateway(stack.server.url, gateway_home / "gateway.log", **settings) as (api, _),
        closing(RemoteClient(api, tokens["ops"])) as admin,
        closing(RemoteClient(api, tokens["alice"])) as user,
        tempfile.TemporaryDirectory(prefix="evalq-worker-") as elsewhere,
    ):
        added = admin.add_dataset("objds", f"s3://{data}/ds/")
        source = added.source("test")
        assert isinstance(source, RemoteSource)
        assert source.files[0].sha256 == _sha256(body)
        admin.set_tier("objds", "test", Tier.VIEWABLE)
        os.chmod(elsewhere, 0o755)
        home = Path(elsewhere) / "home"
        home.mkdir()
        os.chown(home, 65534, 65534)
        (Path(elsewhere) / "stash").mkdir()
        workers = LocalWorkers(
            stack.server.url,
            env={
                **cli_env(stack.server.url),
                "EVALQ_MAX_BATCH": "16",
                "EVALQ_ARCHIVE_URL": archive_url,
                "EVALQ_DATA_CACHE": str(home / "data"),
                "HOME": str(home),
                "HF_HOME": str(home / "hf"),
                "HF_DATASETS_CACHE": str(home / "hf" / "datasets"),
                "XDG_CACHE_HOME": str(home / "cache"),
            },
            log_dir=stack.log_dir / "w0",
            launcher=_as_nobody(Path(elsewhere) / "stash"),
            cwd=home,
        )
        workers.log_dir.mkdir()  # type: ignore[union-attr]
        stack.workers.append(workers.start(stack.app))
        (worker,) = workers.processes
        uid = Path(f"/proc/{worker.pid}/status").read_text().split("Uid:")[1].split()[0]
        assert uid == "65534"
        run_id = user.submit(SubmitRequest(eval="spy", dataset="objds", split="test")).run_id
        wait_for(lambda: user.status(run_id).meta.archived, 120, "the run to be archived")
        view = user.status(run_id)
        assert view.meta.status is RunStatus.COMPLETED
        assert view.stats is not None
        assert view.stats["correct"].mean == pytest.approx(expected_accuracy(rows))
        # the archive is on the server, and the gateway reads the results back from it
        assert str(stack.client.hget(RunKeys(run_id).meta, "archive_url")).startswith(
            f"{archive_url}/{run_id}/"
        )
        assert fs.exists(f"{archive}/runs/{run_id}")
        read = list(user.results(run_id))
        assert sorted(r.sample_id for r in read) == list(range(40))
        assert [r.scores for r in sorted(read, key=lambda r: r.sample_id)] == [
            {"correct": float(predict(str(row["text"])) == row["label"]), "saw_label": 1.0}
            for row in rows
        ]
        # the worker read the object itself, into its own cache; the gateway's is not its to read
        assert [p.name for p in (home / "data").iterdir()] == [f"{_sha256(body)}.jsonl"]
        assert stat.S_IMODE((gateway_home / "data").stat().st_mode) == 0o700
        stack.stop_workers()
    logged = stack.worker_log() + (gateway_home / "gateway.log").read_text()
    assert SECRET not in logged
