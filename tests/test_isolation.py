"""Isolated inference: a model in a warm subprocess of its own that only ever receives
label-free rows. A candidate that walks the stack and the heap for rows holding labels finds
every label when its inference runs in the worker, and none when it is isolated."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from producer.submit import SubmitRequest, submit
from shared.errors import ModelHostError, PermanentError
from shared.evaluation import create, load_plugins
from shared.results import ResultStore
from tests.conftest import Stack
from tests.helpers import REPO, labelled_rows, list_splits, wait_completed, write_rows
from worker.model_proxy import ModelProxy
from worker.runtime_pool import RuntimePool

ROWS = [{"text": "a"}, {"text": "b"}]


@pytest.fixture
def host_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker's environment: the plugins importable, and a Redis URL with a password."""
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setenv("EVALQ_REDIS_URL", "redis://worker:secret@127.0.0.1:1/0")
    load_plugins(["tests.plugins"])


def _proxy(**params: str) -> ModelProxy:
    return ModelProxy(
        create("probe", params), device="cpu", plugins=["tests.plugins"], threads=1, timeout=60
    )


@pytest.mark.usefixtures("host_env")
def test_an_isolated_model_runs_elsewhere_without_the_workers_secrets_or_modules() -> None:
    proxy = _proxy().start()
    try:
        seen = proxy.infer(ROWS)
    finally:
        proxy.close()
    assert len(seen) == 2
    assert seen[0]["pid"] != os.getpid()
    assert seen[0]["evalq_env"] == []
    assert seen[0]["worker_loaded"] is False
    assert seen[0]["fields"] == ["text"]


@pytest.mark.usefixtures("host_env")
def test_a_failing_infer_is_an_error_and_a_dead_host_is_replaced() -> None:
    raising = _proxy(fail="raise")
    with pytest.raises(ModelHostError, match="RuntimeError: the probe failed"):
        raising.infer(ROWS)
    with pytest.raises(ModelHostError, match="RuntimeError"):
        raising.infer(ROWS)
    assert raising.started == 1  # an exception in infer() keeps the model loaded
    raising.close()
    exiting = _proxy(fail="exit")
    with pytest.raises(ModelHostError, match=r"the model host exited \(code 3\)"):
        exiting.infer(ROWS)
    with pytest.raises(ModelHostError, match="exited"):
        exiting.infer(ROWS)
    assert exiting.started == 2
    exiting.close()


@pytest.mark.usefixtures("host_env")
def test_what_is_not_json_is_a_permanent_error() -> None:
    nonjson = _proxy(fail="nonjson")
    with pytest.raises(PermanentError, match="output not JSON"):
        nonjson.infer(ROWS)
    with pytest.raises(PermanentError, match="sends rows as JSON"):
        nonjson.infer([{"text": object()}])
    nonjson.close()


@pytest.mark.usefixtures("host_env")
def test_a_model_that_cannot_load_says_why() -> None:
    missing = ModelProxy(
        create("probe"), device="cpu", plugins=["no_such_plugin"], threads=None, timeout=60
    )
    with pytest.raises(ModelHostError, match="cannot load the model: PluginError"):
        missing.start()


@pytest.mark.usefixtures("host_env")
def test_the_runtime_pool_isolates_on_request_and_stops_evicted_hosts() -> None:
    pool = RuntimePool("cpu", max_models=1, isolate=True, plugins=["tests.plugins"])
    first = pool.model(create("probe"))(ROWS)[0]["pid"]
    assert pool.model(create("probe"))(ROWS)[0]["pid"] == first  # warm
    pool.model(create("probe", {"other": "1"}))  # evicts the first host
    with pytest.raises(ProcessLookupError):
        os.kill(first, 0)
    pool.close()


def _leaked(stack: Stack, folder: Path, eval_name: str) -> tuple[float, list[object]]:
    rows = labelled_rows(20)
    write_rows(folder, "validation", rows)
    name = list_splits(stack.client, str(folder), "validation")
    request = SubmitRequest(eval=eval_name, dataset=name, split="validation")
    meta = submit(
        stack.client, stack.app, request, principal="tests", archive=stack.settings.archive_url
    )
    wait_completed(stack.client, meta.run_id)
    results = ResultStore(stack.client)
    aggregate = results.aggregate(meta.run_id)
    assert aggregate is not None
    outputs = results.outputs(meta.run_id, list(range(20)))
    return aggregate["leaked"], [outputs[i] for i in range(20)]


@pytest.mark.integration
def test_a_stack_walking_candidate_finds_labels_in_the_worker_and_none_isolated(
    stack: Stack, tmp_path: Path
) -> None:
    leaked, outputs = _leaked(stack, tmp_path / "in", "snoop")
    assert leaked == 1.0  # every label found in the worker's memory
    leaked, outputs = _leaked(stack, tmp_path / "out", "snoop_isolated")
    assert (leaked, set(outputs)) == (0.0, {None})


@pytest.mark.integration
def test_the_operator_setting_isolates_every_evaluation(fresh_stack: Stack, tmp_path: Path) -> None:
    fresh_stack.start_workers(EVALQ_ISOLATE_INFERENCE="1")
    leaked, outputs = _leaked(fresh_stack, tmp_path, "snoop")
    assert (leaked, set(outputs)) == (0.0, {None})


@pytest.mark.integration
def test_an_isolated_model_cannot_read_its_workers_environment_or_memory(
    stack: Stack, tmp_path: Path
) -> None:
    rows = labelled_rows(5)
    write_rows(tmp_path, "validation", rows)
    name = list_splits(stack.client, str(tmp_path), "validation")
    request = SubmitRequest(eval="probe", dataset=name, split="validation")
    meta = submit(
        stack.client, stack.app, request, principal="tests", archive=stack.settings.archive_url
    )
    wait_completed(stack.client, meta.run_id)
    seen = ResultStore(stack.client).outputs(meta.run_id, [0])[0]
    assert seen["ancestors_read"] == []  # the worker's /proc environ and mem: refused
    assert seen["evalq_env"] == []
    assert seen["fields"] == ["secret", "text"]  # label fields scrubbed
