"""``evalq.run``: an evaluation tried in this process on a handful of rows, by the rules a
worker applies (labels scrubbed before ``infer()``, a raising batch tried row by row, scores
checked, failures counted by the evaluation's policy), with no Redis and no worker."""

from __future__ import annotations

import math

import evalq
from evalq.shared.evaluation import load_plugins
from evalq.shared.models import RunStatus, Stage
from tests.plugins import predict

load_plugins(["tests.plugins"])


def test_a_run_in_process_scrubs_labels_and_scores_as_the_fleet_does() -> None:
    rows = [{"text": t, "label": predict(t), "secret": "s3cret"} for t in ("a", "bb", "ccc")]
    trial = evalq.run("spy", rows)
    assert trial.status is RunStatus.COMPLETED
    assert all(output["fields"] == ["text"] for output in trial.outputs.values())  # no label
    assert trial.aggregate == {"correct": 1.0, "saw_label": 1.0}  # score() sees the full row
    assert set(trial.stats) == {"correct", "saw_label"}
    assert trial.errors == {}


def test_a_failing_row_fails_alone_and_counts_by_the_failure_policy() -> None:
    rows = [
        {"text": "fine", "label": predict("fine")},
        {"text": "boom", "label": 0},  # infer() raises on the batch, then on this row alone
        {"text": "bust", "label": predict("bust")},  # score() raises
    ]
    trial = evalq.run("flaky", rows)
    assert trial.status is RunStatus.COMPLETED
    assert sorted(trial.outputs) == [0, 2]
    assert trial.errors[1].stage is Stage.INFER
    assert trial.errors[1].stage_kind == "infer/RuntimeError"
    assert trial.errors[2].stage_kind == "score/ValueError"
    assert trial.scores == {0: {"correct": 1.0}}
    assert math.isclose(trial.aggregate["correct"], 1 / 3)  # failures count as 0 (worst)


def test_a_run_whose_every_row_fails_says_why() -> None:
    trial = evalq.run("flaky", [{"text": "boom", "label": 0}])
    assert trial.status is RunStatus.FAILED
    assert trial.reason == "no sample could be scored"
    assert trial.aggregate == {}


def test_the_plugin_api_is_exported_from_evalq() -> None:
    from evalq.producer.clients.api import open_api
    from evalq.shared.lm.scorers import register_scorer
    from evalq.shared.trial import run

    assert evalq.run is run
    assert evalq.register_scorer is register_scorer
    assert evalq.open_api is open_api
