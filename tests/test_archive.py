"""The archive: a run read after it moved to Parquet reads exactly as it did live (every
format, every tier, the Python API and ``datasets``), Redis keeps only its record; an archiver
killed at the worst moment leaves nothing lost and nothing twice; purge removes what it names
and nothing else."""

from __future__ import annotations

import json
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis

from evalq.producer.operations.redis_server import RedisServer
from evalq.producer.reports.export import ExportFormat, write_tables
from evalq.producer.service.client import Client
from evalq.producer.service.submit import SubmitRequest
from evalq.shared.connection import connect
from evalq.shared.errors import ArchiveUnreadableError, InputError
from evalq.shared.evaluation import create
from evalq.shared.keys import AUDIT, RUNS, RunKeys
from evalq.shared.models import (
    ErrorRecord,
    Grade,
    RunMeta,
    RunStatus,
    SampleResult,
    Stage,
    Usage,
    to_json,
)
from evalq.shared.settings import Settings
from evalq.shared.store.archive import (
    MANIFEST,
    OUTPUT_ENCODING,
    RAW_COLUMNS,
    ArchiveReader,
    ArchiveWriter,
    Chunk,
    read_part,
    run_folder,
    table_of,
    typed_output,
    write_part,
)
from evalq.shared.store.pages import PageQuery, PageReader
from evalq.shared.store.reader import ResultReader
from evalq.shared.store.retention import archive_due, parse_age, purge
from evalq.shared.store.runs import RunStore
from evalq.shared.store.seal import Sealer, SealOutcome
from evalq.shared.store.spill import Spill, Spiller, SpillOutcome
from evalq.shared.store.wire import chunk_lines, result_line, results_of
from evalq.shared.store.writer import Delivery, ResultWriter
from evalq.worker.archiver import _abandon, archive_run, spill_run
from tests.conftest import Stack
from tests.helpers import (
    evalq_in_process,
    labelled_rows,
    list_splits,
    record_run,
    wait_completed,
    wait_ended,
    wait_for,
    write_rows,
)

FAST = {"EVALQ_STALL_AFTER": "3", "EVALQ_HEARTBEAT_INTERVAL": "0.5"}


def _chunk(ids: range, metric: str) -> Chunk:
    return Chunk(
        list(ids),
        [json.dumps({"pred": i % 2}) for i in ids],
        [None if i % 5 == 0 else json.dumps({metric: float(i % 2)}) for i in ids],
        [
            json.dumps({"stage": "score", "kind": "ValueError", "message": "x"})
            if i % 5 == 0
            else None
            for i in ids
        ],
    )


def test_an_archive_reads_back_its_parts_in_order_with_every_metric(tmp_path: Path) -> None:
    """Two parts whose metrics differ: read back in order, each part's missing metric as
    nulls, the table equal to the same chunks taken live."""
    chunks = [_chunk(range(0, 40), "a"), _chunk(range(40, 70), "b")]
    writer = ArchiveWriter(f"file://{tmp_path}/run/attempt")
    for chunk in chunks:
        writer.write(chunk)
    writer.finish({"timeline": [], "errors": {}})
    reader = ArchiveReader(f"file://{tmp_path}/run/attempt")
    assert reader.manifest["metrics"] == ["a", "b"]
    assert [p["rows"] for p in reader.manifest["parts"]] == [40, 30]
    ids = [i for batch in reader.batches() for i in batch.column("sample_id").to_pylist()]
    assert ids == list(range(70))
    table = reader.table()
    assert table.column_names == [
        "sample_id",
        "output",
        "scores",
        "error",
        "usage",
        "grade",
        "score.a",
        "score.b",
    ]
    assert table.column("score.a").to_pylist()[40:] == [None] * 30
    assert table.equals(table_of(iter(chunks)))
    assert pq.read_table(reader.files[0]).num_rows == 40


def test_an_age_is_a_number_and_a_unit() -> None:
    assert parse_age("30d") == 30 * 86400
    assert parse_age("1.5h") == 5400
    for bad in ("30", "d", "-1d", "0s", "3y"):
        with pytest.raises(InputError, match="is not an age"):
            parse_age(bad)


def _board(stack: Stack, folder: Path, tier: str) -> str:
    rows = labelled_rows(120)
    rows[7]["text"] = f"{rows[7]['text']} boom"  # fails inference (its batch retried alone)
    rows[50]["text"] = f"{rows[50]['text']} bust"  # fails scoring
    write_rows(folder, "validation", rows)
    return list_splits(stack.client, folder, "validation", tier=tier)


def _reads(stack: Stack, run_id: str, folder: Path, *flags: str) -> dict[str, object]:
    """Everything a reader gets of a run through the CLI, in every format."""
    url = stack.server.url
    found: dict[str, object] = {}
    for fmt in ("jsonl", "csv"):
        shown = evalq_in_process(url, "results", run_id, "--format", fmt, *flags)
        found[fmt] = (shown.returncode, shown.stdout, shown.stderr.strip()[-200:])
    out = folder / f"{run_id}-{len(list(folder.glob('*.parquet')))}.parquet"
    shown = evalq_in_process(
        url, "results", run_id, "--format", "parquet", "--out", str(out), *flags
    )
    found["parquet"] = (shown.returncode, pq.read_table(out).to_pylist() if out.exists() else None)
    status = evalq_in_process(url, "status", run_id, "--json", *flags)
    view = json.loads(status.stdout) if status.returncode == 0 else None
    if view is not None:
        view.pop("archived", None)
    found["status"] = (status.returncode, view)
    followed = evalq_in_process(url, "results", run_id, "--follow", *flags)
    lines = sorted(followed.stdout.splitlines())
    found["follow"] = (followed.returncode, lines)
    return found


def _live_keys(stack: Stack, run_id: str) -> list[str]:
    return _live_keys_of(stack.client, run_id)


@pytest.mark.integration
def test_an_archived_run_reads_exactly_as_it_did_live(fresh_stack: Stack, tmp_path: Path) -> None:
    """Runs kept live (``EVALQ_ARCHIVE_AFTER``), read every way, archived, read again: the
    same bytes and rows for a viewable run (jsonl, csv, parquet, follow, status, compare,
    ``results_dataset``, ``--with-input``), the same refusals and releases on a non_viewable
    split for a user and the same rows for an admin."""
    stack = fresh_stack
    stack.start_workers(EVALQ_ARCHIVE_AFTER="3600", **FAST)
    viewable = _board(stack, tmp_path / "open", "viewable")
    hidden = _board(stack, tmp_path / "held", "non_viewable")
    client = Client(
        Settings(
            redis_url=stack.server.url, archive_url=stack.settings.archive_url, principal="dev"
        )
    )
    runs = {
        "a": client.submit(SubmitRequest(eval="flaky", dataset=viewable, split="validation")),
        "b": client.submit(SubmitRequest(eval="spy", dataset=viewable, split="validation")),
        "hidden": client.submit(SubmitRequest(eval="flaky", dataset=hidden, split="validation")),
    }
    for meta in runs.values():
        wait_completed(stack.client, meta.run_id)
    a, b, held = (runs[k].run_id for k in ("a", "b", "hidden"))
    # A reader who does not see the held-out run's timing sees its end from the next second
    # on (the CLI's start-up in a subprocess used to wait that out): read live once it shows.
    wait_for(lambda: not client.progress(held)[0].status.active, 10, "the held run's end to show")
    exports = tmp_path / "exports"
    exports.mkdir()

    def everything() -> dict[str, object]:
        compared = evalq_in_process(stack.server.url, "compare", a, b, "--json")
        return {
            "a": _reads(stack, a, exports),
            "a_input": evalq_in_process(stack.server.url, "results", a, "--with-input").stdout,
            "held_user": _reads(stack, held, exports),
            "held_admin": _reads(stack, held, exports, "--admin"),
            "compare": (compared.returncode, compared.stdout),
            "dataset": client.results_dataset(a).to_list(),
            "api": [r.model_dump() for r in client.results(a)],
        }

    live = everything()
    assert live["held_user"]["jsonl"][0] == 3  # type: ignore[index]
    assert live["held_admin"]["jsonl"][0] == 0  # type: ignore[index]
    assert live["a"]["status"][1]["errors"] == {"infer/RuntimeError": 1, "score/ValueError": 1}  # type: ignore[index]

    for run_id in (a, b, held):
        done = archive_run(stack.client, run_id)
        assert (done.sealed, done.rows) == (SealOutcome.SEALED, 120)
        assert _live_keys(stack, run_id) == []
        record = stack.client.hgetall(RunKeys(run_id).meta)
        assert record["archive_url"] == done.url
        assert record["status"] == "completed"
    assert archive_run(stack.client, a).sealed is SealOutcome.SEALED_ELSEWHERE  # once

    archived = everything()
    for name, value in live.items():
        assert archived[name] == value, name
    reported = evalq_in_process(stack.server.url, "report", a, "--out", str(tmp_path / "a.html"))
    assert reported.returncode == 0, reported.stderr  # its timeline from the archive
    page = (tmp_path / "a.html").read_text()
    assert "nothing settled yet" not in page  # the throughput chart, from the archive
    assert "no scored or failed sample yet" not in page
    dataset = client.results_dataset(a)
    assert dataset.num_rows == 120
    assert dataset.column_names == [
        "sample_id",
        "output",
        "scores",
        "error",
        "usage",
        "grade",
        "score.correct",
    ]
    refused = evalq_in_process(stack.server.url, "results", held)
    assert refused.returncode == 3
    assert "tier" in refused.stderr
    with pytest.raises(InputError, match="archived"):
        client.resume(a)


@pytest.mark.integration
def test_an_archiver_killed_before_its_seal_is_finished_by_another_worker(
    fresh_stack: Stack, tmp_path: Path
) -> None:
    """The worker archiving a completed run is killed (main process first) once every part
    and the manifest are being written, before the seal: Redis still holds the run; the next
    worker's janitor puts the archive message back, its attempt seals, and the dead attempt's
    folder goes. Every sample is archived once, as it was settled."""
    stack = fresh_stack
    stack.crashes_expected = True
    base = tmp_path / "store"
    url = f"dying://{base}/archive"
    stack.start_workers(**FAST)
    dataset = _board(stack, tmp_path / "data", "viewable")
    client = Client(
        Settings(
            redis_url=stack.server.url,
            principal="dev",
            archive_url=url,
        )
    )
    meta = client.submit(SubmitRequest(eval="flaky", dataset=dataset, split="validation"))
    wait_for((base / "die-once").exists, 60, "the archiver to die")
    assert stack.client.hget(RunKeys(meta.run_id).meta, "archive_url") is None
    assert _held(stack.client, RunKeys(meta.run_id).score) == 118  # nothing freed yet
    live = [r.model_dump() for r in client.results(meta.run_id)]

    stack.start_workers(**FAST)
    wait_for(lambda: stack.client.hget(RunKeys(meta.run_id).meta, "archive_url"), 60, "the archive")
    assert [r.model_dump() for r in client.results(meta.run_id)] == live
    assert _live_keys(stack, meta.run_id) == []
    folder = Path(run_folder(str(base / "archive"), meta.run_id))
    wait_for(lambda: len(list(folder.iterdir())) == 1, 30, "the dead attempt's folder to go")
    (attempt,) = folder.iterdir()
    manifest = json.loads((attempt / MANIFEST).read_text())
    assert sum(p["rows"] for p in manifest["parts"]) == 120
    assert sum(count for _, count in manifest["timeline"]) == 120  # each settled once
    assert manifest["progress"]["scored"] == 118
    assert manifest["progress"]["failed"] == 2
    stack.wait_logged("put back")
    runs = RunStore(stack.client)
    wait_for(lambda: meta.run_id not in runs.active(), 30, "the run to be retired")


@pytest.mark.integration
def test_purge_removes_what_it_names_and_nothing_else(fresh_stack: Stack, tmp_path: Path) -> None:
    stack = fresh_stack
    stack.start_workers(**FAST)
    dataset = _board(stack, tmp_path / "data", "viewable")
    client = Client(
        Settings(
            redis_url=stack.server.url, archive_url=stack.settings.archive_url, principal="ops"
        )
    )
    gone, kept, old = (
        client.submit(SubmitRequest(eval="spy", dataset=dataset, split="validation")).run_id
        for _ in range(3)
    )
    for run_id in (gone, kept, old):
        wait_for(lambda r=run_id: client.status(r).meta.archived, 60, "the archive")  # type: ignore[misc]
    folders = {r: Path(run_folder(stack.settings.archive_url, r)) for r in (gone, kept, old)}
    assert all(folder.is_dir() for folder in folders.values())
    going = client.submit(
        SubmitRequest(
            eval="slow", dataset=dataset, split="validation",
            params={"gate": str(tmp_path / "gate"), "open_until": "0"},
        )
    ).run_id  # fmt: skip

    url = stack.server.url
    for refused in (("purge",), ("purge", "--run", going), ("purge", "--older-than", "soon")):
        shown = evalq_in_process(url, *refused)
        assert shown.returncode == 2, refused
        assert len(shown.stderr.strip().splitlines()) == 1
    shown = evalq_in_process(url, "purge", "--run", gone, "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == {"purged": [gone]}
    assert stack.client.keys(f"evalq:{{{gone}}}:*") == []
    assert not folders[gone].exists()
    assert stack.client.zscore(RUNS, gone) is None
    assert evalq_in_process(url, "status", gone).returncode == 2

    stack.client.zadd(RUNS, {old: 1.0})  # submitted long ago, as far as the index says
    shown = evalq_in_process(url, "purge", "--older-than", "30d", "--json")
    assert json.loads(shown.stdout)["purged"] == [old]
    assert not folders[old].exists()

    assert folders[kept].is_dir()
    assert len(list(client.results(kept))) == 120
    assert client.status(going).meta.status in (RunStatus.QUEUED, RunStatus.RUNNING)
    entries: Any = stack.client.xrange(AUDIT)
    purges = [e for _, e in entries if e.get("action") == "purge"]
    assert [e["run"] for e in purges] == [gone, old]
    client.cancel(going)
    (tmp_path / "gate").touch()
    assert wait_ended(stack.client, going) is RunStatus.CANCELLED
    wait_for(lambda: client.status(going).meta.archived, 60, "the cancelled run's archive")


def _new_run(client: redis.Redis, ids: list[int], archive: Path) -> RunMeta:
    """A queued run of ``ids``, recorded through the store itself (no worker), archived under
    ``archive``."""
    meta = RunMeta(
        run_id=uuid.uuid4().hex[:16], eval="spy", spec="0" * 64, dataset_id="ds",
        split="validation", n=len(ids), status=RunStatus.QUEUED, created=time.time(),
    )  # fmt: skip
    record_run(client, meta, ids, str(archive))
    return meta


def _ended_run(client: redis.Redis, archive: Path, n: int = 30) -> str:
    """A completed run made through the store itself (no worker): every seventh sample failed
    at inference, the rest scored."""
    writer, meta = ResultWriter(client), _new_run(client, list(range(n)), archive)
    kept = [i for i in range(n) if i % 7]
    writer.record_outputs(meta.run_id, {i: json.dumps({"pred": i}) for i in kept})
    writer.record_scores(meta.run_id, {i: {"acc": float(i % 2)} for i in kept})
    failed = ErrorRecord(stage=Stage.INFER, kind="RuntimeError", message="boom")
    assert writer.record_errors(meta.run_id, {i: failed for i in range(n) if i % 7 == 0}).finalize
    assert writer.finalize(meta.run_id, create("spy", {})) is not None
    return meta.run_id


def test_a_seal_whose_reply_was_lost_keeps_the_archive_it_sealed(
    redis_only: RedisServer, tmp_path: Path
) -> None:
    """redis-py retries a call whose connection dropped: a seal that ran, sent again, answers
    that this very folder is sealed (2), and an attempt never removes the folder its run's
    record names (it did, and every result was gone: the attack review's finding)."""
    client = connect(redis_only.url)
    results, run_id = ResultReader(client), _ended_run(client, tmp_path / "archive")
    done = archive_run(client, run_id)
    assert done.sealed is SealOutcome.SEALED
    counts, sealer = (30, 25, 5, 25), Sealer(client)
    assert sealer.seal(run_id, done.url, counts) is SealOutcome.SEALED_ON_RETRY
    assert sealer.seal(run_id, done.url + "x", counts) is SealOutcome.SEALED_ELSEWHERE
    writer = ArchiveWriter(done.url)  # the same folder, as the attempt that sealed it holds it
    _abandon(results, run_id, writer)
    assert len(list(results.results(run_id))) == 30  # the archive is still there


def test_nothing_is_written_for_a_run_once_it_is_sealed_or_purged(
    redis_only: RedisServer, tmp_path: Path
) -> None:
    """A batch that passed its run's status check before the run ended writes nothing after:
    no output, no attempt, so no per-sample key comes back once the run is archived, and a
    purged run's record is not recreated by a late claim to archive it."""
    client = connect(redis_only.url)
    results, writer, runs = ResultReader(client), ResultWriter(client), RunStore(client)
    run_id = _ended_run(client, tmp_path / "archive")
    assert archive_run(client, run_id).sealed is SealOutcome.SEALED
    assert writer.record_outputs(run_id, {0: "1", 7: "2"}) == 0
    tried = [Delivery("m", False, [0]), Delivery("s", True, [7])]
    assert writer.attempt(run_id, tried) == {0: 0, 7: 0}
    assert _live_keys_of(client, run_id) == []
    assert results.progress(run_id).inferred == 25
    purge(client, run_id, str(tmp_path / "archive"))
    assert not runs.claim_archive(run_id)
    assert client.exists(RunKeys(run_id).meta) == 0


def _live_keys_of(client: redis.Redis, run_id: str) -> list[str]:
    return [k for k in RunKeys(run_id).per_sample if client.exists(k)]


def test_an_archive_that_cannot_be_read_is_a_one_line_error(
    redis_only: RedisServer, tmp_path: Path
) -> None:
    client = connect(redis_only.url)
    run_id = _ended_run(client, tmp_path / "archive")
    done = archive_run(client, run_id)
    shutil.rmtree(tmp_path / "archive")  # the store not mounted on this machine
    shown = evalq_in_process(redis_only.url, "results", run_id, "--admin")
    assert shown.returncode == 1
    (line,) = shown.stderr.strip().splitlines()
    assert "cannot be read here" in line
    assert done.url in line
    for args in (("status", run_id, "--json"), ("runs", "--json")):  # from Redis alone
        shown = evalq_in_process(redis_only.url, *args)
        assert shown.returncode == 0, shown.stderr
    shown = evalq_in_process(redis_only.url, "status", run_id, "--json", "--admin")
    assert json.loads(shown.stdout)["errors"] == {"infer/RuntimeError": 5}


def test_an_archive_message_for_a_run_not_due_archives_nothing() -> None:
    """A failed run waits EVALQ_ARCHIVE_FAILED_AFTER before it is archived (until then it can
    be resumed), whoever sends the message."""
    settings = Settings(archive_after=0, archive_failed_after=3600)
    base = {
        "run_id": "r", "eval": "spy", "spec": "0" * 64, "dataset_id": "ds",
        "split": "validation", "n": 1, "created": 0.0, "finished": 100.0,
    }  # fmt: skip
    failed = RunMeta.model_validate({**base, "status": RunStatus.FAILED})
    done = RunMeta.model_validate({**base, "status": RunStatus.COMPLETED})
    going = RunMeta.model_validate({**base, "status": RunStatus.RUNNING})
    assert not archive_due(failed, 200.0, settings)
    assert archive_due(failed, 3700.0, settings)
    assert archive_due(done, 100.0, settings)
    assert not archive_due(going, 1e9, settings)


def _going_run(
    client: redis.Redis,
    archive: Path,
    n: int = 50,
    unsettled: range = range(45, 50),
    batch: int = 16,
) -> str:
    """A going run made through the store: every sample inferred (``batch`` at a time), every
    seventh failed at scoring, those in ``unsettled`` not settled yet."""
    writer, meta = ResultWriter(client), _new_run(client, list(range(n)), archive)
    for start in range(0, n, batch):  # spans of ``batch`` samples
        outputs = {i: json.dumps({"pred": i}) for i in range(start, min(n, start + batch))}
        writer.record_outputs(meta.run_id, outputs)
    done = [i for i in range(n) if i not in unsettled]
    writer.record_scores(meta.run_id, {i: {"acc": float(i % 2)} for i in done if i % 7})
    failed = ErrorRecord(stage=Stage.SCORE, kind="ValueError", message="bad")
    writer.record_errors(meta.run_id, {i: failed for i in done if i % 7 == 0})
    return meta.run_id


def _held(client: redis.Redis, key: str) -> int:
    """The samples whose texts the hash ``key`` holds, one by one or in spans (``lo-hi``)."""
    held = 0
    for field in client.hkeys(key):
        lo, _, hi = str(field).partition("-")
        held += int(hi) - int(lo) + 1 if hi else 1
    return held


def _store_reads(results: ResultReader, run_id: str) -> dict[str, object]:
    ids = list(range(50))
    inferred, failed = results.produced(run_id, ids)
    return {
        "results": [r.model_dump() for r in results.results(run_id)],
        "chunks": [c.table().to_pylist() for c in results.chunks(run_id, 7)],
        "fetch": [r.model_dump() for r in results.fetch(run_id, [40, 3, 20, 47])],
        "scores": results.scores(run_id),
        "errors": results.errors_by_kind(run_id),
        "settled": results.settled(run_id, ids),
        "to_infer": set(ids) - inferred - failed,
        "outputs": results.output_texts(run_id, [1, 17, 46]),
    }


def test_a_going_run_spills_its_complete_segments_and_reads_the_same(
    redis_only: RedisServer, tmp_path: Path
) -> None:
    """Segments of 16 ids: the two whose samples are all settled move to parts and leave
    Redis, the one with an unsettled sample and the short last one stay; every read gives what
    it gave before; nothing is written for a spilled sample again (no key comes back, no
    counter moves); the run finalizes over both and archives the same rows."""
    client = connect(redis_only.url)
    results, writer = ResultReader(client), ResultWriter(client)
    archive = str(tmp_path / "archive")
    run_id = _going_run(client, tmp_path / "archive")
    keys = RunKeys(run_id)
    before = _store_reads(results, run_id)
    writer.live_bytes(run_id, 10**6)  # what workers counted as they stored the outputs
    first = results.live_chunk(run_id, list(range(32)))
    assert first is not None
    freed = sum(len(text) for text in first.outputs if text is not None)
    progress = results.progress(run_id)
    assert spill_run(client, run_id, 16) == 2
    assert sorted(Spill.read(client, run_id).parts) == [0, 1]
    assert spill_run(client, run_id, 16) == 0  # once
    assert writer.live_bytes(run_id, 0) == 10**6 - freed > 0  # the spilled outputs left
    assert _held(client, keys.out) == 18
    assert _held(client, keys.score) + _held(client, keys.err) == 13
    assert client.bitcount(keys.spilled) == 32
    assert len(list(Path(archive, run_id, "spill").iterdir())) == 2
    assert _store_reads(results, run_id) == before

    assert writer.record_outputs(run_id, {3: '"again"', 20: '"again"'}) == 0
    tried = [Delivery("s", True, [3]), Delivery("m", False, [20])]
    assert writer.attempt(run_id, tried) == {3: 0, 20: 0}
    across = [Delivery("n", False, [30, 31, 32, 33])]  # a span half spilled
    assert writer.attempt(run_id, across) == {30: 0, 31: 0, 32: 1, 33: 1}
    assert writer.record_scores(run_id, {3: {"acc": 9.0}}).written == 0
    failed = ErrorRecord(stage=Stage.INFER, kind="RuntimeError", message="late")
    assert writer.record_errors(run_id, {20: failed}).written == 0
    assert results.progress(run_id) == progress
    assert _held(client, keys.out) == 18
    assert not client.exists(keys.attempts_of(Stage.INFER))
    assert _store_reads(results, run_id) == before

    done = writer.record_scores(run_id, {i: {"acc": 1.0} for i in range(45, 50)})
    assert done.finalize
    finished = writer.finalize(run_id, create("spy", {}))
    assert finished is not None
    scored = [s["acc"] for s in before["scores"].values()] + [1.0] * 5  # type: ignore[attr-defined]
    failures = sum(before["errors"].values())  # type: ignore[attr-defined]
    assert failures == 7  # each scores 0 (a 0/1 metric's worst value), spilled ones too
    assert finished.aggregate == {"acc": sum(scored) / (len(scored) + failures)}
    ended = _store_reads(results, run_id)
    assert archive_run(client, run_id).sealed is SealOutcome.SEALED
    assert _store_reads(results, run_id) == ended
    assert not Path(archive, run_id, "spill").exists()
    assert _live_keys_of(client, run_id) == []


def test_a_span_leaves_redis_once_every_sample_of_it_is_spilled(
    redis_only: RedisServer, tmp_path: Path
) -> None:
    """Outputs written 24 at a time are spans across segments of 16: a span stays while one
    of its samples is not spilled (reads give the same meanwhile), and goes with the segment
    that spills its last one."""
    client = connect(redis_only.url)
    results, writer = ResultReader(client), ResultWriter(client)
    run_id = _going_run(client, tmp_path / "archive", unsettled=range(40, 50), batch=24)
    keys = RunKeys(run_id)
    assert set(client.hkeys(keys.out)) == {"0-23", "24-47", "48-49"}
    before = _store_reads(results, run_id)
    assert spill_run(client, run_id, 16) == 2  # 0..15 and 16..31; 32..47 waits for 40..47
    assert set(client.hkeys(keys.out)) == {"24-47", "48-49"}
    assert _store_reads(results, run_id) == before
    assert writer.record_scores(run_id, {i: {"acc": 1.0} for i in range(40, 48)}).written == 8
    before = _store_reads(results, run_id)
    assert spill_run(client, run_id, 16) == 1
    assert client.hkeys(keys.out) == ["48-49"]
    assert client.zrange(keys.ranges_of("outputs"), 0, -1) == ["48-49"]
    assert _store_reads(results, run_id) == before


def test_a_segment_with_a_gap_in_its_ids_frees_the_spans_and_samples_it_holds(
    redis_only: RedisServer, tmp_path: Path
) -> None:
    """A run of ids 0..19 and 30..45 (a gap): its second segment of 16 (16..19, 30..41) is
    not one span of ids; spilled, it frees the spans it completes and its samples held one by
    one (those of the first segment too), and every read gives the same."""
    client = connect(redis_only.url)
    results, writer = ResultReader(client), ResultWriter(client)
    ids = [*range(20), *range(30, 46)]
    run_id = _new_run(client, ids, tmp_path / "archive").run_id
    keys = RunKeys(run_id)
    writer.record_outputs(run_id, {i: json.dumps({"pred": i}) for i in range(20)})
    writer.record_outputs(run_id, {i: json.dumps({"pred": i}) for i in range(30, 42)})
    for i in range(42, 46):
        writer.record_outputs(run_id, {i: json.dumps({"pred": i})})
    writer.record_scores(run_id, {i: {"acc": 1.0} for i in [3, 1, 35, 33]})  # one by one
    writer.record_scores(run_id, {i: {"acc": 0.0} for i in ids[:-1] if i not in (1, 3, 33, 35)})
    before = [r.model_dump() for r in results.fetch(run_id, ids)]
    assert spill_run(client, run_id, 16) == 2  # 0..15, 16..19 + 30..41; 42..45 waits for 45
    assert not client.exists(keys.ranges_of("outputs"), keys.ranges_of("scores"))
    assert _held(client, keys.out) == 4
    assert _held(client, keys.score) == 3
    assert client.bitcount(keys.spilled) == 32
    assert [r.model_dump() for r in results.fetch(run_id, ids)] == before


def test_a_spill_waits_for_its_segment_and_stops_with_its_run(
    redis_only: RedisServer, tmp_path: Path
) -> None:
    """A segment with an unsettled sample is refused, whoever asks; a run being finalized or
    ended spills nothing; a cancelled run's refund counts spilled samples as produced."""
    client = connect(redis_only.url)
    results, runs, archive = ResultReader(client), RunStore(client), str(tmp_path / "archive")
    run_id = _going_run(client, tmp_path / "archive", unsettled=range(5, 6))
    chunk = results.live_chunk(run_id, list(range(16)))
    assert chunk is not None
    refused = Spiller(client).spill(run_id, 0, 16, "file:///nowhere", chunk)
    assert refused is SpillOutcome.NOT_THE_STORE_S
    assert spill_run(client, run_id, 16) == 3  # 16..49: the last one is short
    client.setbit(RunKeys(run_id).inferred, 5, 0)  # the unsettled one: not inferred yet
    assert runs.cancel(run_id) == (1, 1)  # its 34 spilled samples are not refunded
    assert spill_run(client, run_id, 16) == 0
    assert sorted(Spill.read(client, run_id).parts) == [1, 2, 3]

    other = _going_run(client, tmp_path / "archive", unsettled=range(0))
    client.hset(RunKeys(other).meta, "finalizing", "1")
    assert spill_run(client, other, 16) == 0
    assert list(Path(archive, other, "spill").iterdir()) == []  # the refused part went


@pytest.mark.integration
def test_workers_spill_a_going_run_and_it_reads_the_same_throughout(
    fresh_stack: Stack, tmp_path: Path
) -> None:
    """One worker infers (its second message held at a gate), one scores: the first 64
    samples settle, their four segments of 16 are spilled while the run goes and Redis keeps
    no result of theirs; the results read mid-run, once complete and once archived agree."""
    stack = fresh_stack
    spilling = {"EVALQ_SPILL_ROWS": "16", "EVALQ_ARCHIVE_AFTER": "3600", **FAST}
    stack.start_workers(queues="infer", **spilling)
    stack.start_workers(queues="score", **spilling)
    dataset = _board(stack, tmp_path / "data", "viewable")
    gate = tmp_path / "gate"
    client = Client(
        Settings(
            redis_url=stack.server.url, archive_url=stack.settings.archive_url, principal="dev"
        )
    )
    run_id = client.submit(
        SubmitRequest(
            eval="slow", dataset=dataset, split="validation",
            params={"gate": str(gate), "open_until": "64"},
        )
    ).run_id  # fmt: skip
    keys = RunKeys(run_id)
    wait_for(lambda: len(Spill.read(stack.client, run_id).parts) == 4, 60, "four spilled segments")
    assert _held(stack.client, keys.score) + _held(stack.client, keys.err) == 0
    assert stack.client.bitcount(keys.spilled) == 64
    going = evalq_in_process(stack.server.url, "results", run_id).stdout.splitlines()
    assert [json.loads(line)["sample_id"] for line in going] == list(range(120))
    assert all("scores" in line or "error" in line for line in going[:64])
    gate.touch()
    wait_completed(stack.client, run_id)
    done = evalq_in_process(stack.server.url, "results", run_id).stdout.splitlines()
    assert done[:64] == going[:64]
    assert all("scores" in line or "error" in line for line in done)
    assert archive_run(stack.client, run_id).rows == 120
    assert evalq_in_process(stack.server.url, "results", run_id).stdout.splitlines() == done


def test_a_spill_refuses_a_segment_whose_output_came_after_it_was_read(
    redis_only: RedisServer, tmp_path: Path
) -> None:
    """A sample failed for good, then a slower attempt's output landed between a spill's read
    and its commit: the spill is refused (the attack review: it deleted that output, and the
    run's counts never sealed), the next one takes it, and the run archives."""
    client = connect(redis_only.url)
    results, writer = ResultReader(client), ResultWriter(client)
    run_id = _new_run(client, list(range(20)), tmp_path / "archive").run_id
    failed = ErrorRecord(stage=Stage.INFER, kind="RuntimeError", message="boom")
    others = [i for i in range(20) if i != 3]
    writer.record_outputs(run_id, {i: json.dumps({"pred": i}) for i in others})
    writer.record_scores(run_id, {i: {"acc": 0.0} for i in others if i < 16})
    writer.record_errors(run_id, {3: failed})  # sample 3: failed, no output
    read = results.live_chunk(run_id, list(range(16)))
    assert read is not None
    assert writer.record_outputs(run_id, {3: '"late"'}) == 1  # after the spill read
    stale = Spiller(client).spill(run_id, 0, 16, "file:///stale", read)
    assert stale is SpillOutcome.NOT_THE_STORE_S
    assert spill_run(client, run_id, 16) == 1
    (three,) = results.fetch(run_id, [3])
    assert (three.output, three.error) == ("late", failed)
    writer.record_scores(run_id, {i: {"acc": 1.0} for i in range(16, 20)})
    assert writer.finalize(run_id, create("spy", {})) is not None
    assert archive_run(client, run_id).sealed is SealOutcome.SEALED


def test_spilled_parts_go_under_the_run_s_own_folder_and_leave_with_it(
    redis_only: RedisServer, tmp_path: Path
) -> None:
    """A part is spilled under the archive location the run's facts name (the gateway's
    choice, whatever a worker's own EVALQ_ARCHIVE_URL), and an archive or a purge removes it
    with the run's folder."""
    client = connect(redis_only.url)
    writer = ResultWriter(client)
    for ending in ("archive", "purge"):
        run_id = _going_run(client, tmp_path / "archive", n=20, unsettled=range(16, 20))
        assert spill_run(client, run_id, 16) == 1
        (part,) = (tmp_path / "archive" / run_id / "spill").iterdir()
        writer.record_scores(run_id, {i: {"acc": 1.0} for i in range(16, 20)})
        assert writer.finalize(run_id, create("spy", {})) is not None
        if ending == "archive":
            assert archive_run(client, run_id).sealed is SealOutcome.SEALED
        else:
            assert purge(client, run_id, str(tmp_path / "elsewhere"))
        assert not part.exists(), ending


def test_a_record_naming_files_outside_its_run_s_folder_is_neither_read_nor_deleted(
    redis_only: RedisServer, tmp_path: Path
) -> None:
    """Workers write a run's archive and spill records; one that names a file outside the
    run's own folder (another run's archive, anything) is refused as unreadable and never
    deleted (the attack review: a purge deleted the directory a rewritten record named)."""
    client = connect(redis_only.url)
    victim = tmp_path / "important"
    (victim / "attempt").mkdir(parents=True)
    (victim / "attempt" / "keep.txt").write_text("keep")
    run_id = _going_run(client, tmp_path / "archive", n=20, unsettled=range(16, 20))
    client.hset(RunKeys(run_id).spill, mapping={"rows": 16, "0": f"file://{victim}/p.parquet"})
    with pytest.raises(ArchiveUnreadableError, match="outside the run's own folder"):
        ResultReader(client).scores(run_id)
    RunStore(client).cancel(run_id)
    client.hset(RunKeys(run_id).meta, "archive_url", f"file://{victim}/attempt")
    with pytest.raises(ArchiveUnreadableError, match="outside the run's own folder"):
        list(ResultReader(client).results(run_id))
    assert purge(client, run_id, str(tmp_path / "archive"))
    assert (victim / "attempt" / "keep.txt").read_text() == "keep"


def test_a_read_whose_spilled_part_goes_with_a_seal_goes_on_from_the_archive(
    redis_only: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The archive seals (and removes the spill folder) between the scores' scan and the read
    of a spilled part: the read answers from the archive, the same (the attack review: it was
    an error blaming the mount)."""
    client = connect(redis_only.url)
    results, writer = ResultReader(client), ResultWriter(client)
    run_id = _going_run(client, tmp_path / "archive", n=20, unsettled=range(16, 20))
    assert spill_run(client, run_id, 16) == 1
    writer.record_scores(run_id, {i: {"acc": 1.0} for i in range(16, 20)})
    assert writer.finalize(run_id, create("spy", {})) is not None
    expected = results.scores(run_id)
    sealed: list[int] = []

    def sealing_first(*args: Any, **kwargs: Any) -> Chunk:
        if not sealed:
            sealed.append(0)
            sealed[0] = archive_run(client, run_id).sealed
        return read_part(*args, **kwargs)

    monkeypatch.setattr("evalq.shared.store.spill.read_part", sealing_first)
    assert results.scores(run_id) == expected
    assert sealed == [1]


def test_a_purge_deletes_only_files_that_are_spilled_parts(
    redis_only: RedisServer, tmp_path: Path
) -> None:
    """Redis names the parts; one gone wrong (a URL that is no part of this run's) deletes
    nothing it names."""
    client = connect(redis_only.url)
    victim = tmp_path / "elsewhere" / "keep.txt"
    victim.parent.mkdir()
    victim.write_text("keep")
    run_id = _going_run(client, tmp_path / "archive", n=20, unsettled=range(16, 20))
    RunStore(client).cancel(run_id)
    client.hset(RunKeys(run_id).spill, "7", f"file://{victim}")
    assert purge(client, run_id, str(tmp_path / "archive"))
    assert victim.read_text() == "keep"


def test_spilled_samples_far_apart_read_the_same(redis_only: RedisServer, tmp_path: Path) -> None:
    """Ids far apart in a large split (their bits read one by one, not as a range of the
    bitmap): spilled and live ones read as before."""
    client = connect(redis_only.url)
    ids = [5_000_000, 3, 7_000_001, 12]
    results, writer = ResultReader(client), ResultWriter(client)
    meta = _new_run(client, ids, tmp_path / "archive")
    writer.record_outputs(meta.run_id, {i: json.dumps(i) for i in ids})
    writer.record_scores(meta.run_id, {i: {"acc": 1.0} for i in ids[:3]})
    before = [r.model_dump() for r in results.fetch(meta.run_id, ids)]
    assert spill_run(client, meta.run_id, 2) == 1
    assert results.settled(meta.run_id, ids) == set(ids[:3])
    assert [r.model_dump() for r in results.fetch(meta.run_id, ids)] == before
    assert writer.record_outputs(meta.run_id, {5_000_000: "0"}) == 0


def _typed_run(client: redis.Redis, archive: Path, outputs: list[object]) -> RunMeta:
    """A completed run made through the store whose sample ``i`` output ``outputs[i]`` (as a
    worker stores it) and scored ``acc`` (every third failed at inference)."""
    writer, meta = ResultWriter(client), _new_run(client, list(range(len(outputs))), archive)
    kept = [i for i in range(len(outputs)) if i % 3]
    writer.record_outputs(meta.run_id, {i: to_json(outputs[i]) for i in kept})
    writer.record_scores(meta.run_id, {i: {"acc": float(i % 2)} for i in kept})
    failed = ErrorRecord(stage=Stage.INFER, kind="RuntimeError", message="boom")
    writer.record_errors(meta.run_id, {i: failed for i in range(len(outputs)) if i % 3 == 0})
    assert writer.finalize(meta.run_id, create("spy", {})) is not None
    return meta


def _parquet_views(api: Client, run_id: str, out: Path) -> dict[str, object]:
    """A run's results as Parquet gives them: ``results_dataset`` and the exported file."""
    write_tables(api.result_tables(run_id), ExportFormat.PARQUET, out)
    exported = pq.read_table(out)
    dataset = api.results_dataset(run_id)
    return {
        "dataset": (dataset.data.schema, dataset.to_list()),
        "export": (exported.schema.field("output").type, exported.schema.field("score.acc").type,
                   exported.to_pylist()),
    }  # fmt: skip


@pytest.mark.parametrize(
    ("outputs", "kind"),
    [
        ([f"label-{i % 4}" for i in range(12)], pa.string()),
        ([i * 10 for i in range(12)], pa.int64()),
        ([{"pred": i % 2, "why": [f"w{i}"]} for i in range(12)],
         pa.struct([("pred", pa.int64()), ("why", pa.list_(pa.string()))])),
    ],
)  # fmt: skip
def test_parquet_outputs_and_scores_are_typed_columns_live_archived_and_in_the_old_layout(
    redis_only: RedisServer, tmp_path: Path, outputs: list[object], kind: pa.DataType
) -> None:
    """Outputs of one JSON type are a column of that type (strings, integers, a struct) and
    each metric a float64 column in the archive's parts, ``results_dataset`` and the Parquet
    export, live and archived alike; an archive written before outputs were typed (JSON text,
    no marker) reads exactly the same."""
    client = connect(redis_only.url)
    results = ResultReader(client)
    meta = _typed_run(client, tmp_path / "archive", outputs)
    api = Client(
        Settings(redis_url=redis_only.url, archive_url=str(tmp_path / "archive")), admin=True
    )
    live = _parquet_views(api, meta.run_id, tmp_path / "live.parquet")
    stored = [r.model_dump() for r in results.results(meta.run_id)]
    dataset = api.results_dataset(meta.run_id)
    assert dataset.data.schema.field("output").type == kind
    assert dataset.data.schema.field("score.acc").type == pa.float64()
    assert dataset["output"][:3] == [None, outputs[1], outputs[2]]
    assert dataset["score.acc"][:3] == [None, 1.0, 0.0]
    exported = pq.read_table(tmp_path / "live.parquet")
    assert exported.schema.field("output").type == kind
    assert exported.column("output").to_pylist()[1] == outputs[1]

    done = archive_run(client, meta.run_id)
    assert done.sealed is SealOutcome.SEALED
    (part,) = ArchiveReader(done.url).files
    written = pq.read_table(part)
    assert written.schema.field("output").type == kind
    assert written.schema.field("score.acc").type == pa.float64()
    assert [r.model_dump() for r in results.results(meta.run_id)] == stored
    assert _parquet_views(api, meta.run_id, tmp_path / "archived.parquet") == live

    old = Chunk(
        written.column("sample_id").to_pylist(),
        [None if v is None else to_json(v) for v in written.column("output").to_pylist()],
        written.column("scores").to_pylist(),
        written.column("error").to_pylist(),
    ).table()  # the layout archives had before: the stored JSON texts, no marker
    pq.write_table(old, part)
    assert pq.read_table(part).schema.field("output").type == pa.string()
    assert [r.model_dump() for r in results.results(meta.run_id)] == stored
    assert _parquet_views(api, meta.run_id, tmp_path / "old.parquet") == live


def test_outputs_without_one_exact_type_stay_json_text(tmp_path: Path) -> None:
    """Outputs that no one Arrow type holds exactly (numbers of two kinds, dicts with other
    keys, a JSON null, an empty dict) stay the stored JSON text, marked so, and a spilled part
    reads back as it was written either way."""
    mixed: list[list[object]] = [[1, 2.5], [{"a": 1}, {"b": 2}], [None, "x"], [{}, {}], ["x", 2]]
    for outputs in mixed:
        texts: list[str | None] = [to_json(o) for o in outputs]
        field, column = typed_output(pa.array(texts, pa.string()))
        assert (field.type, field.metadata) == (pa.string(), {OUTPUT_ENCODING: b"json"})
        assert column.to_pylist() == texts
        chunk = Chunk([0, 1], texts, [None, None], [None, None])
        assert read_part(write_part(f"{tmp_path}/{uuid.uuid4().hex}.parquet", chunk)) == chunk
    typed = Chunk([0, 1], ['"a"', None], [None, None], [None, None])
    url = write_part(f"{tmp_path}/typed.parquet", typed)
    assert pq.read_table(url.removeprefix("file://")).column("output").to_pylist() == ["a", None]
    assert read_part(url) == typed


def test_a_spilled_part_of_large_outputs_is_read_a_row_group_at_a_time(tmp_path: Path) -> None:
    """A stream over spilled segments read each part whole (up to ``EVALQ_SPILL_ROWS`` outputs
    of 256 KiB: 4 GiB) for each few samples it sent. Parts are written in row groups of about
    ``GROUP_BYTES``, and a reader of a sample holds its group only."""
    texts = [to_json("x" * 1_000_000 + str(i)) for i in range(12)]
    chunk = Chunk(list(range(12)), list[str | None](texts), ['{"acc": 1.0}'] * 12, [None] * 12)
    folder = f"{tmp_path}/run/spill"
    url = write_part(f"{folder}/segment-0-{'0' * 8}.parquet", chunk)
    groups = pq.ParquetFile(url.removeprefix("file://")).metadata.num_row_groups
    assert groups >= 3  # 12 MB of outputs in groups of about 4 MiB
    spill = Spill("run", folder, rows=12, parts={0: url})
    assert [spill.texts(i)[0] for i in range(12)] == texts
    held = spill._last
    assert held is not None
    assert len(held[2].sample_ids) <= 12 // groups + 1
    assert spill.by_id([11, 0, 5]) == {
        i: (texts[i], '{"acc": 1.0}', None, None, None) for i in (11, 0, 5)
    }


def test_a_filtered_page_of_a_live_run_reads_it_a_few_samples_at_a_time(
    redis_only: RedisServer, tmp_path: Path
) -> None:
    """A filtered, searched or sorted page of a live run held the whole run's outputs (8 pages
    in flight over a run of large outputs: gigabytes); it now reads ``rows`` at a time and
    keeps only what picks the rows, and answers as before, live, spilled or archived."""
    client = connect(redis_only.url)
    run_id = _going_run(client, tmp_path / "archive")
    queries = [
        PageQuery(failed=True), PageQuery(q='"pred": 2'), PageQuery(sort="-acc"),
        PageQuery(failed=True, sort="acc", q="pred"), PageQuery(ids=(3, 14, 40), sort="acc"),
    ]  # fmt: skip
    live = [PageReader(client, rows=3).page(run_id, 1, 9, q) for q in queries]
    assert live[1][0] == 11  # 2, 20-29
    assert live[0][1].sample_ids == [7, 14, 21, 28, 35, 42]  # 0, 7, ...: from the second
    assert spill_run(client, run_id, 16) == 2
    assert [PageReader(client, rows=3).page(run_id, 1, 9, q) for q in queries] == live
    writer = ResultWriter(client)
    assert writer.record_scores(run_id, {i: {"acc": 1.0} for i in range(45, 50)}).finalize
    live = [PageReader(client, rows=3).page(run_id, 1, 9, q) for q in queries]
    finished = writer.finalize(run_id, create("spy", {}))
    assert finished is not None
    assert archive_run(client, run_id).sealed is SealOutcome.SEALED
    assert [PageReader(client, rows=3).page(run_id, 1, 9, q) for q in queries] == live


SHAPED = {"usage": {"prompt_tokens": 3, "completion_tokens": 1}, "output": "x"}
"""A plugin's own output shaped exactly like the envelope outputs were once stored in (with
their usage inside): an output like any other."""


def test_an_output_shaped_like_usage_stays_an_output_live_spilled_and_archived(
    redis_only: RedisServer, tmp_path: Path
) -> None:
    """Usage and grades are stored beside outputs and scores, never inside them: a plugin's
    output shaped like the old usage envelope (in a span, one by one, beside real usages)
    reads back unchanged, with no usage, live, from spilled parts and from the archive, and
    counts no token; a score dict with metrics named ``grade`` and ``scores`` stays scores.
    Only the real usages and grades count their tokens, each once."""
    client = connect(redis_only.url)
    writer, results = ResultWriter(client), ResultReader(client)
    run_id = _new_run(client, list(range(40)), tmp_path / "archive").run_id
    keys = RunKeys(run_id)
    used = Usage(prompt_tokens=9, completion_tokens=2)
    cached = Usage(prompt_tokens=5, completion_tokens=5, cached=True)
    judged = Usage(prompt_tokens=40, completion_tokens=3)
    grade = Grade(grader="openai/judge", prompt="p", verdict="GRADE: C", usage=judged)
    usages = {i: cached if i == 31 else used for i in range(17, 32, 2)}
    assert writer.record_outputs(run_id, {i: to_json(SHAPED) for i in range(16)}) == 16
    assert _held(client, keys.out) == 16
    assert client.hlen(keys.out) == 1  # one span
    outputs = {i: to_json("42" if i in usages else SHAPED) for i in range(16, 40)}
    stored = {i: u.stored() for i, u in usages.items()}
    assert writer.record_outputs(run_id, outputs, stored) == 24
    plain = {"grade": 1.0, "scores": 0.0}  # metrics named like the old grade envelope
    graded = dict.fromkeys(range(20, 24), grade)
    scores = {i: {"model_graded": 1.0} if i in graded else plain for i in range(32)}
    writer.record_scores(run_id, scores, graded)
    expected = [
        SampleResult(
            sample_id=i,
            output="42" if i in usages else SHAPED,
            usage=usages.get(i),
            scores=scores.get(i),
            grade=graded.get(i),
        )
        for i in range(40)
    ]
    progress = results.progress(run_id)
    counted = (progress.prompt_tokens, progress.completion_tokens, progress.cached)
    assert counted == (9 * 7, 2 * 7, 1)
    assert (progress.grader_prompt_tokens, progress.grader_completion_tokens) == (160, 12)

    def reads() -> dict[str, object]:
        return {
            "results": list(results.results(run_id)),
            "fetch": results.fetch(run_id, [31, 0, 17, 20, 39]),
            "lines": [json.loads(line) for c in results.chunks(run_id) for line in chunk_lines(c)],
            "outputs": results.outputs(run_id, [0, 17, 39]),
            "scores": results.scores(run_id),
        }

    live = reads()
    assert live["results"] == expected
    assert live["fetch"] == [expected[i] for i in (31, 0, 17, 20, 39)]
    assert live["lines"] == [json.loads(result_line(r)) for r in expected]
    assert live["lines"][17]["usage"] == {"prompt_tokens": 9, "completion_tokens": 2}
    assert "usage" not in live["lines"][0]
    assert "grade" not in live["lines"][0]
    assert live["outputs"] == {0: SHAPED, 17: "42", 39: SHAPED}
    assert live["scores"] == scores
    assert spill_run(client, run_id, 16) == 2
    assert not client.exists(keys.usage)  # freed with the outputs
    assert not client.exists(keys.grade)
    assert reads() == live
    writer.record_scores(run_id, {i: plain for i in range(32, 40)})
    assert writer.finalize(run_id, create("spy", {})) is not None
    ended = reads()
    done = archive_run(client, run_id)
    assert done.sealed is SealOutcome.SEALED
    assert reads() == ended
    assert results.progress(run_id) == progress.model_copy(
        update={"scored": 40, "touched": results.progress(run_id).touched}
    )
    (part,) = ArchiveReader(done.url).files
    written = pq.read_table(part).to_pydict()
    assert (written["usage"][17], written["grade"][20]) == (used.stored(), grade.stored())
    assert [json.loads(t) for t in written["scores"][:2]] == [plain, plain]


def _old_layout(sample_ids: list[int], outputs: list[Any], scores: list[Any]) -> pa.Table:
    """A part as evalq wrote it before usage and grades had columns of their own: the usage
    inside the output's text (``{"usage": {...}, "output": ...}``, the output typed when one
    Arrow type holds every value, as then), the grade inside the scores' text (``{"grade":
    {...}, "scores": {...}}``); columns ``sample_id``, ``output``, ``scores``, ``error``,
    ``score.<metric>``."""
    texts = [None if o is None else json.dumps(o, separators=(",", ":")) for o in outputs]
    field, column = typed_output(pa.array(texts, pa.string()))
    metrics = [None if s is None else s.get("scores", s) for s in scores]
    return pa.table(
        {
            "sample_id": pa.array(sample_ids, pa.int64()),
            field.name: column,
            "scores": pa.array(
                [None if s is None else json.dumps(s, separators=(",", ":")) for s in scores],
                pa.string(),
            ),
            "error": pa.array([None] * len(sample_ids), pa.string()),
            "score.model_graded": pa.array(
                [None if m is None else m.get("model_graded") for m in metrics], pa.float64()
            ),
        },
        schema=pa.schema(
            [
                pa.field("sample_id", pa.int64()), field, pa.field("scores", pa.string()),
                pa.field("error", pa.string()), pa.field("score.model_graded", pa.float64()),
            ]
        ),
    )  # fmt: skip


def test_parts_and_archives_of_the_old_layout_read_with_usage_and_grades_apart(
    tmp_path: Path,
) -> None:
    """Archives and spilled parts written before usage and grades had columns of their own
    (both inside the output's and the scores' JSON text) read back with them taken apart:
    outputs typed (a language model's: every one a struct of usage and output) or JSON text
    (a cached one among them makes the keys differ), from a spilled part, a row group, an
    archive's batches, rows and table."""
    used = Usage(prompt_tokens=9, completion_tokens=2)
    cached = Usage(prompt_tokens=5, completion_tokens=5, cached=True)
    grade = Grade(
        grader="openai/judge", prompt="p", verdict="GRADE: C",
        usage=Usage(prompt_tokens=40, completion_tokens=3),
    )  # fmt: skip
    for usages in ([used, used, used], [used, cached, used]):
        outputs = [
            {"usage": u.model_dump(exclude_defaults=True), "output": f"answer {i}"}
            for i, u in enumerate(usages)
        ]
        scores = [
            {"grade": grade.model_dump(), "scores": {"model_graded": 1.0}},
            {"model_graded": 0.0},
            None,
        ]
        old = _old_layout([4, 5, 6], [*outputs[:2], None], scores)
        expected = [
            SampleResult(
                sample_id=4, output="answer 0", usage=usages[0], scores={"model_graded": 1.0},
                grade=grade,
            ),
            SampleResult(
                sample_id=5, output="answer 1", usage=usages[1], scores={"model_graded": 0.0}
            ),
            SampleResult(sample_id=6),
        ]  # fmt: skip
        folder = tmp_path / uuid.uuid4().hex
        folder.mkdir()
        pq.write_table(old, folder / "part-00000.parquet")
        manifest = {
            "parts": [{"file": "part-00000.parquet", "rows": 3}],
            "metrics": ["model_graded"],
        }
        (folder / MANIFEST).write_text(json.dumps(manifest))
        part = f"file://{folder}/part-00000.parquet"
        assert list(results_of(read_part(part))) == expected
        assert read_part(part, columns=("scores",)).scores == [
            '{"model_graded":1.0}',
            '{"model_graded":0.0}',
            None,
        ]
        spill = Spill("run", str(folder), rows=3, parts={0: part})
        assert [spill.texts(i) for i in range(3)] == [
            (expected[i].output and to_json(expected[i].output), *texts)
            for i, texts in enumerate(
                [
                    ('{"model_graded":1.0}', None, usages[0].stored(), grade.stored()),
                    ('{"model_graded":0.0}', None, usages[1].stored(), None),
                    (None, None, None, None),
                ]
            )
        ]
        reader = ArchiveReader(f"file://{folder}")
        (batch,) = reader.batches()
        assert (
            list(results_of(Chunk(*(batch.column(c).to_pylist() for c in RAW_COLUMNS)))) == expected
        )
        assert list(results_of(reader.rows([2, 0]))) == [expected[2], expected[0]]
        table = reader.table()
        assert table.column_names == [*RAW_COLUMNS, "score.model_graded"]
        assert table.column("grade").to_pylist() == [grade.stored(), None, None]
        assert table.column("score.model_graded").to_pylist() == [1.0, 0.0, None]
