"""Unit tests of the shared contract: specs, plugins, scrubbing, settings, ids, payloads."""

from __future__ import annotations

import enum
import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from evalq.producer.reports.export import flat_table, flatten
from evalq.producer.service.submit import SubmitRequest, parse_ids, parse_params, resolve_ids
from evalq.shared.data.loading import build_spec
from evalq.shared.errors import (
    DataError,
    InputError,
    PayloadError,
    PluginError,
    SampleIdError,
    SplitNotFoundError,
    UnknownEvalError,
)
from evalq.shared.evaluation import Evaluation, create, load_plugins, register, scrub
from evalq.shared.keys import RunKeys
from evalq.shared.models import (
    ErrorRecord,
    Grade,
    RunMeta,
    RunStatus,
    SampleResult,
    Stage,
    Usage,
    from_json,
    scores_values,
    to_json,
)
from evalq.shared.queue.celery_app import create_app
from evalq.shared.queue.sizing import split
from evalq.shared.settings import Settings
from evalq.shared.store.wire import (
    SPAN_MAX,
    as_chunks,
    result_line,
    results_of,
    scores_of,
    span_of,
    spans,
)
from evalq.worker.lru import LRU
from evalq.worker.messages import TaskRequest, parse_requests
from tests.helpers import labelled_rows, write_rows

FP = "a" * 64


class Colour(enum.Enum):
    RED = "red"


@dataclass
class Point:
    x: int
    y: int


def test_spec_fingerprint_is_stable_and_content_addressed(tmp_path: Path) -> None:
    write_rows(tmp_path / "d", "validation", labelled_rows(5))
    first, dataset = build_spec(str(tmp_path / "d"), "validation")
    again, _ = build_spec(str(tmp_path / "d"), "validation")
    assert first.fingerprint == again.fingerprint
    assert first.n_rows == len(dataset) == 5
    write_rows(tmp_path / "d", "validation", labelled_rows(5, salt="changed"))
    changed, _ = build_spec(str(tmp_path / "d"), "validation")
    assert changed.fingerprint != first.fingerprint


def test_spec_carries_no_rows_and_no_worker_knobs(tmp_path: Path) -> None:
    write_rows(tmp_path, "validation", labelled_rows(3))
    spec, _ = build_spec(str(tmp_path), "validation")
    text = spec.canonical_json()
    assert "sample 0" not in text
    for knob in ("max_batch", "device", "max_shards", "max_models"):
        assert knob not in text


def test_a_files_split_is_its_stem(tmp_path: Path) -> None:
    path = write_rows(tmp_path, "test", labelled_rows(3))
    assert build_spec(str(path), "test")[0].n_rows == 3
    with pytest.raises(SplitNotFoundError, match="split 'validation' not found"):
        build_spec(str(path), "validation")


def test_a_split_is_exactly_its_own_files(tmp_path: Path) -> None:
    """``test`` is never a prefix of ``test-hard``; Hugging Face shard files of one split are
    that split."""
    write_rows(tmp_path, "test", labelled_rows(3))
    write_rows(tmp_path, "test-hard", labelled_rows(5))
    write_rows(tmp_path, "validation-00000-of-00002", labelled_rows(2))
    write_rows(tmp_path, "validation-00001-of-00002", labelled_rows(4))
    assert build_spec(str(tmp_path), "test")[0].n_rows == 3
    assert build_spec(str(tmp_path), "test-hard")[0].n_rows == 5
    assert build_spec(str(tmp_path), "validation")[0].n_rows == 6
    with pytest.raises(SplitNotFoundError, match=r"splits: test, test-hard, validation\)"):
        build_spec(str(tmp_path), "tes")


def test_missing_split_and_missing_path_are_input_errors(tmp_path: Path) -> None:
    write_rows(tmp_path, "train", labelled_rows(2))
    with pytest.raises(SplitNotFoundError, match=r"splits: train"):
        build_spec(str(tmp_path), "validation")
    with pytest.raises(DataError, match="no such file"):
        build_spec(str(tmp_path / "nope.jsonl"), "nope")


def test_scrub_removes_labels_and_fails_closed() -> None:
    row = {"text": "t", "label": 1, "secret": "s"}
    assert scrub(row, ("label", "secret")) == {"text": "t"}
    assert row == {"text": "t", "label": 1, "secret": "s"}
    with pytest.raises(PayloadError):
        scrub(["text", "label"], ("label",))


def test_registry_rejects_unknown_names_and_double_registration() -> None:
    load_plugins(["tests.plugins"])
    with pytest.raises(UnknownEvalError, match=r"unknown evaluation 'nope'.*spy"):
        create("nope")
    with pytest.raises(PluginError):
        register("Bad Name!")

    with pytest.raises(PluginError, match="registered twice"):

        @register("spy")
        class Other(Evaluation):
            def infer(self, model: object, rows: list[dict[str, object]]) -> list[object]:
                return []

            def score(self, row: dict[str, object], output: object) -> dict[str, float]:
                return {}

    with pytest.raises(PluginError, match="cannot import"):
        load_plugins(["tests.no_such_plugin"])


def test_default_aggregate_is_the_mean_of_each_metric() -> None:
    load_plugins(["tests.plugins"])
    spy = create("spy")
    assert spy.aggregate([{"a": 1.0, "b": 0.0}, {"a": 0.0}]) == {"a": 0.5, "b": 0.0}


def test_settings_parse_plugins_and_default_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVALQ_PLUGINS", "a.b, c ,")
    monkeypatch.setenv("EVALQ_REDIS_URL", "redis://h:1/2")
    settings = Settings()
    assert settings.plugins == ("a.b", "c")
    assert settings.broker == "redis://h:1/2"
    monkeypatch.setenv("EVALQ_BROKER_URL", "redis://b:1/0")
    assert Settings().broker == "redis://b:1/0"
    assert create_app(Settings()).conf.worker_send_task_events is True  # Flower sees tasks
    monkeypatch.setenv("EVALQ_TASK_EVENTS", "0")
    assert create_app(Settings()).conf.worker_send_task_events is False


def test_sample_selection() -> None:
    assert resolve_ids(10, 3, None) == [0, 1, 2]
    assert resolve_ids(2, 5, None) == [0, 1]
    assert resolve_ids(10, None, [9, 0]) == [9, 0]
    assert resolve_ids(4, None, None) == [0, 1, 2, 3]
    with pytest.raises(SampleIdError, match="out of range"):
        resolve_ids(10, None, [10])
    with pytest.raises(SampleIdError, match="twice"):
        resolve_ids(10, None, [1, 1])
    with pytest.raises(InputError, match="not both"):
        resolve_ids(10, 1, [1])
    with pytest.raises(SampleIdError):
        parse_ids("1,x")
    assert parse_ids("3, 7,9") == [3, 7, 9]
    assert parse_params(["a=1", "b=x=y"]) == {"a": "1", "b": "x=y"}
    with pytest.raises(InputError):
        parse_params(["novalue"])


def _request(kwargs: dict[str, object], args: tuple[object, ...] = ()) -> TaskRequest:
    return TaskRequest("id", "evalq.infer", dict(kwargs), args)


def test_malformed_payloads_are_dropped_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    good: dict[str, object] = {"run_id": "r1", "eval": "spy", "spec": FP, "sample_ids": [3, 4]}
    parsed = parse_requests(
        [
            _request(good),
            _request({**good, "sample_ids": [-1]}),
            _request({**good, "sample_ids": []}),
            _request({**good, "extra": "row bytes"}),
            _request({"run_id": "r1"}),
            _request(good, args=("positional",)),
        ]
    )
    assert [t.sample_ids for _, t in parsed] == [[3, 4]]
    assert caplog.text.count("dropping malformed") == 5


def test_split_packs_consecutive_ids_of_one_run() -> None:
    meta = RunMeta(
        run_id="r", eval="spy", spec=FP, dataset_id="d", split="s", n=70,
        status=RunStatus.QUEUED, created=0.0,
    )  # fmt: skip
    tasks = list(split(meta, list(range(70)), size=32))
    assert [len(t.sample_ids) for t in tasks] == [32, 32, 6]
    assert [i for t in tasks for i in t.sample_ids] == list(range(70))
    assert {t.run_id for t in tasks} == {"r"}


def test_run_keys_share_one_hash_tag() -> None:
    keys = RunKeys("abc")
    tags = {
        k.split("{")[1].split("}")[0]
        for k in (keys.meta, keys.out, keys.score, keys.err, keys.facts)
    }
    assert tags == {"abc"}
    assert not keys.facts.startswith("evalq:{")  # outside the worker user's write pattern


def test_a_run_s_params_are_bounded_in_count_and_size() -> None:
    """100 params of 10,000 characters per run were accepted and kept (20 runs: +27 MB of
    gateway RSS, a 20 MB ``GET /v1/runs``)."""
    base = {"eval": "spy", "dataset": "ds", "split": "validation"}
    with pytest.raises(ValidationError, match="at most 16,384 are kept"):
        SubmitRequest.model_validate({**base, "params": {f"p{i}": "x" * 10_000 for i in range(2)}})
    with pytest.raises(ValidationError, match="at most 64 items"):
        SubmitRequest.model_validate({**base, "params": {f"p{i}": "x" for i in range(65)}})
    fine = {f"p{i}": "x" * 200 for i in range(64)}
    assert SubmitRequest.model_validate({**base, "params": fine}).params == fine


def test_lru_evicts_least_recently_used() -> None:
    evicted: list[str] = []
    cache: LRU[str, int] = LRU(2, on_evict=lambda k, _: evicted.append(k))
    cache.get_or_create("a", lambda: 1)
    cache.get_or_create("b", lambda: 2)
    cache.get_or_create("a", lambda: 99)
    seen_at_create: list[str] = []

    def create_c() -> int:
        seen_at_create.extend(evicted)
        return 3

    cache.get_or_create("c", create_c)
    assert seen_at_create == ["b"]  # evicted before the new value was created
    assert evicted == ["b"]
    assert len(cache) == 2
    assert "a" in cache


def test_flatten_for_csv_and_parquet() -> None:
    result = SampleResult(
        sample_id=4,
        output={"b": 1, "a": 2},
        scores={"acc": 1.0},
        error=None,
    )
    assert flatten(result) == {
        "sample_id": 4,
        "output": '{"b":1,"a":2}',  # as stored: compact, in the output's own order
        "error": None,
        "score.acc": 1.0,
    }
    failed = SampleResult(sample_id=5, error=ErrorRecord(stage=Stage.INFER, kind="E", message="m"))
    assert flatten(failed)["error"] == "E: m"


def test_a_graded_result_reads_the_same_from_its_texts_and_its_table() -> None:
    """A ``model_graded`` sample's grade is stored beside its scores; every reader keeps the
    metrics apart from it (the attack review found the archive's export without its
    columns, and the report taking ``grade`` for a metric)."""
    usage = Usage(prompt_tokens=40, completion_tokens=2)
    grade = Grade(
        grader="openai/judge", prompt="[Expert answer]: 3", verdict="GRADE: C", usage=usage
    )
    graded = SampleResult(sample_id=1, output="3", scores={"model_graded": 1.0}, grade=grade)
    (chunk,) = as_chunks([graded, SampleResult(sample_id=2, scores={"model_graded": 0.0})], 10)
    assert list(results_of(chunk)) == [
        graded,
        SampleResult(sample_id=2, scores={"model_graded": 0.0}),
    ]
    assert scores_of(chunk.sample_ids, chunk.scores) == {
        1: {"model_graded": 1.0},
        2: {"model_graded": 0.0},
    }
    line = json.loads(result_line(graded))
    assert (line["scores"], line["grade"]["verdict"]) == ({"model_graded": 1.0}, "GRADE: C")
    table = flat_table(chunk.table())
    assert table.column_names == [
        "sample_id", "output", "error", "score.model_graded", "grade.verdict", "grade.prompt",
    ]  # fmt: skip
    assert table.column("grade.verdict").to_pylist() == ["GRADE: C", None]
    assert flatten(graded)["grade.verdict"] == "GRADE: C"


def test_stored_scores_parse_together_as_each_alone() -> None:
    """Scores are parsed as one JSON array (finalizing reads every one of them): the same
    metrics as parsing each text, and a text that is not one JSON value refused, not shifting
    its neighbours' values."""
    texts = [
        to_json({"acc": 1.0, "f1": 0.5}),
        None,
        to_json({"model_graded": 0.0}),
        to_json({"acc": -2.5e-07}),
    ]
    assert scores_of([7, 8, 9, 10], texts) == {
        7: {"acc": 1.0, "f1": 0.5},
        9: {"model_graded": 0.0},
        10: {"acc": -2.5e-07},
    }
    assert scores_values([]) == []
    with pytest.raises(ValueError, match="read as 3 values"):
        scores_values(['{"acc":1.0},{"acc":0.0}', '{"acc":1.0}'])


def test_only_a_batch_of_consecutive_plain_texts_travels_as_one_span() -> None:
    """A span holds samples lo..hi, every one, joined by newlines: what a reader splits back
    exactly; anything else (a gap, out of order, one sample, a newline in a text) goes one by
    one."""
    texts = {i: json.dumps({"pred": i, "note": "a\nb"}) for i in range(5, 9)}
    span = span_of(texts)
    assert span is not None
    assert dict(spans([f"{span[0]}-8"], [span[1]])) == texts
    assert span_of({5: "1", 7: "1"}) is None
    assert span_of({6: "1", 5: "1"}) is None
    assert span_of({5: "1"}) is None
    assert span_of({5: "1", 6: '"a\nb"'}) is None
    assert span_of({i: "1" for i in range(SPAN_MAX + 1)}) is None
    assert list(spans(["0-1"], [None])) == []


def test_stored_json_is_strict_and_reads_back_the_same_value() -> None:
    """``to_json`` / ``from_json`` (orjson where it agrees with the standard library): NaN and
    infinity refused as ``json.dumps(allow_nan=False)`` refuses them, anywhere in the value;
    what JSON cannot hold refused with the standard library's error, also what orjson would
    write (a UUID, an enum, a dataclass); dict keys of ints, bools and None written as the
    standard library writes them, float keys too; integers beyond 64 bits and lone surrogates
    written and read back exactly; non-ASCII text written as UTF-8."""
    for bad in (float("nan"), [1.0, float("inf")], {"a": {"b": [float("-inf")]}}):
        with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
            to_json(bad)
    for unheld in (uuid.UUID(int=1), Colour.RED, Point(1, 2), {1, 2}, {"a": object()}):
        with pytest.raises(TypeError, match="is not JSON serializable"):
            to_json(unheld)
    keyed = {1: "a", None: "b", False: "c", 1e-05: "d", 2.5: "e"}
    assert to_json(keyed) == json.dumps(keyed, separators=(",", ":"))
    huge = {"n": [2**70, -(2**64) - 1], "m": 2**63, "f": 1e300}
    assert from_json(to_json(huge)) == huge
    assert from_json(to_json(2**70)) == 2**70
    assert from_json("123456789012345678901234567890") == 123456789012345678901234567890
    assert from_json(to_json("a\ud800b")) == "a\ud800b"
    assert to_json("é ✓") == '"é ✓"'
    assert from_json('"\\u00e9"') == "é"
    deep: Any = "x"
    for _ in range(300):
        deep = [deep]
    assert from_json(to_json(deep)) == deep
    values: list[Any] = ["x", 3, 0.1, -2.5e-07, 1e16, True, None, [], {}, {"a": [1, {"b": None}]}]
    for value in values:
        assert json.loads(to_json(value)) == value
        assert from_json(to_json(value)) == value
