"""The real ``evalq`` entry point in subprocesses: exit codes, one-line errors, exports."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from evalq.producer.service.submit import PARAMS_CHARS
from evalq.shared.keys import RUNS
from evalq.shared.queue.celery_app import INFER_QUEUE
from tests.conftest import Stack
from tests.helpers import (
    REPO,
    cli_env,
    evalq,
    evalq_in_process,
    labelled_rows,
    list_splits,
    write_rows,
)

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nope", "--split", "validation"], "unknown evaluation 'nope'"),
        (["spy", "--split", "test"], "has no split 'test' (splits: validation)"),
        (["spy", "--split", "validation", "--ids", "1,12"], "sample id 12 is out of range"),
        (["spy", "--split", "validation", "--ids", "1,x"], "comma-separated non-negative"),
        (["spy", "--split", "validation", "--limit", "3", "--ids", "1"], "not both"),
        (
            ["spy", "--split", "validation", "--routing", "kmeans", "--route-field", "label"],
            "is a label field",
        ),
        (
            ["spy", "--split", "validation", "--routing", "kmeans", "--route-field", "body"],
            "route field 'body' is not a column",
        ),
        (["spy", "--split", "validation", "--tag", "bad tag"], "invalid SubmitRequest tags.0"),
        (["spy", "--split", "validation", "--param", "k" * 101 + "=1"], "invalid SubmitRequest"),
        # the grid's second point is bad: checked before the first is submitted
        (
            ["spy", "--split", "validation", "--sweep", "k=a," + "x" * (PARAMS_CHARS + 1)],
            "params.k",
        ),
        (["spy", "--split", "validation", "--sweep", "k=a", "--follow"], "--follow follows one"),
    ],
)
def test_bad_input_gets_one_line_and_exit_2_and_enqueues_nothing(
    stack: Stack, tmp_path: Path, args: list[str], message: str
) -> None:
    write_rows(tmp_path, "validation", labelled_rows(12))
    name = list_splits(stack.client, str(tmp_path), "validation")
    before = stack.client.zcard(RUNS)
    result = evalq(stack.server.url, "submit", args[0], "--dataset", name, *args[1:])
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert message in lines[0]
    assert "Traceback" not in result.stderr
    assert stack.client.zcard(RUNS) == before


def test_unreachable_hub_is_one_line(stack: Stack, tmp_path: Path) -> None:
    url = stack.server.url
    result = evalq(
        url, "submit", "spy", "--data", "someone/no-such-dataset", "--split", "test", "--admin",
        HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path),
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert "cannot reach someone/no-such-dataset" in result.stderr


def test_unknown_run_and_unreachable_redis(redis_only: object) -> None:
    url = redis_only.url  # type: ignore[attr-defined]
    missing = evalq(url, "status", "nope")
    assert (missing.returncode, missing.stderr.strip()) == (2, "error: no run 'nope'")
    down = evalq("redis://:hunter2@127.0.0.1:1/0", "status", "0123abcd")
    assert down.returncode == 1
    assert down.stderr.startswith("error: cannot reach Redis at redis://:***@127.0.0.1:1/0")
    assert "EVALQ_REDIS_URL" in down.stderr
    assert "hunter2" not in down.stderr
    assert len(down.stderr.strip().splitlines()) == 1
    bad = evalq(url, "runs", EVALQ_MAX_BATCH="zero")
    assert bad.returncode == 2
    assert bad.stderr.startswith("error: invalid setting EVALQ_MAX_BATCH")


def test_submit_follow_status_runs_results(stack: Stack, tmp_path: Path) -> None:
    write_rows(tmp_path / "data", "validation", labelled_rows(50))
    data = str(tmp_path / "data")
    name = list_splits(stack.client, data, "validation")
    url = stack.server.url
    # the submission, the plain watch, the narrow table and the CSV (written past sys.stdout)
    # in their own processes; what the other commands answer, in this one
    followed = evalq(url, "submit", "spy", "--dataset", name, "--split", "validation",
                     "--limit", "30", "--shards", "3", "--routing", "kmeans",
                     "--router-sample", "40", "--follow", "--json")  # fmt: skip
    assert followed.returncode == 0, followed.stderr
    first, last = (json.loads(line) for line in followed.stdout.strip().splitlines())
    run_id = first["run_id"]
    assert last["run_id"] == run_id
    assert last["status"] == "completed"
    assert set(last["aggregate"]) == {"correct", "saw_label"}

    status = json.loads(evalq_in_process(url, "status", run_id, "--json").stdout)
    assert status["progress"] == {
        "inferred": 30, "scored": 30, "failed": 0, "recovered": 0,
        "prompt_tokens": 0, "completion_tokens": 0,  # a language model's, counted as stored
        "cached": 0,  # an endpoint model's answers from the response cache
        "grader_prompt_tokens": 0, "grader_completion_tokens": 0,  # a model_graded task's
    }  # fmt: skip
    assert status["stalled"] is None
    assert status["n"] == 30
    assert status["status"] == "completed"
    assert status["throughput"] > 0
    assert status["eta_seconds"] is None  # finished: nothing left to estimate
    assert status["errors"] == {}

    watched = evalq(url, "watch", run_id)
    assert watched.returncode == 0, watched.stderr
    # not a terminal: one plain line, never a bar cut to pieces at 80 columns
    assert f"{run_id} spy validation: 30/30 settled (100%)" in watched.stdout
    assert "━" not in watched.stdout
    assert f"{run_id} completed" in watched.stdout
    assert "correct:" in watched.stdout
    assert (
        json.loads(evalq_in_process(url, "watch", run_id, "--json").stdout)["status"] == "completed"
    )

    listed = json.loads(evalq_in_process(url, "runs", "--json").stdout)
    assert run_id in [r["run_id"] for r in listed]
    table = evalq(url, "runs", COLUMNS="60")
    assert run_id in table.stdout.split()  # whole, copyable, however narrow the output
    assert "serves evaluations: " in stack.worker_log()
    assert "spy" in stack.worker_log().split("serves evaluations: ")[1].splitlines()[0]

    jsonl = evalq_in_process(url, "results", run_id).stdout.splitlines()
    assert [json.loads(line)["sample_id"] for line in jsonl] == list(range(30))

    rows = list(
        csv.DictReader(io.StringIO(evalq(url, "results", run_id, "--format", "csv").stdout))
    )
    assert len(rows) == 30
    assert {"sample_id", "output", "score.correct", "score.saw_label"} <= set(rows[0])

    path = tmp_path / "out.parquet"
    written = evalq_in_process(url, "results", run_id, "--format", "parquet", "--out", str(path))
    assert written.returncode == 0, written.stderr
    assert pq.read_table(path).num_rows == 30

    bad = evalq_in_process(url, "results", run_id, "--format", "xml")
    assert bad.returncode == 2
    assert "'xml' is not one of" in bad.stderr


def test_redis_only_commands_import_no_torch(stack: Stack, tmp_path: Path) -> None:
    write_rows(tmp_path, "validation", labelled_rows(5))
    name = list_splits(stack.client, str(tmp_path), "validation")
    script = f"""
import sys
from typer.testing import CliRunner
from evalq.shared.cli import create_cli
app = create_cli()
runner = CliRunner()
submitted = runner.invoke(app, ["submit", "topic", "--dataset", {name!r},
                                "--split", "validation", "--json"])
assert submitted.exit_code == 0, submitted.output
run_id = submitted.output.strip().splitlines()[0].split('"')[3]
for args in (["status", run_id], ["results", run_id], ["runs"]):
    assert runner.invoke(app, args).exit_code == 0
heavy = [m for m in ("torch", "sentence_transformers", "transformers") if m in sys.modules]
print("heavy:", heavy)
"""
    result = subprocess.run(
        [sys.executable, "-c", script], env=cli_env(stack.server.url), cwd=REPO,
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "heavy: []" in result.stdout
    stack.client.delete(INFER_QUEUE)
