"""The registries a new task kind or model provider is added through (fast: no Redis): a third
provider registered here is parsed and loaded with no evalq module edited, a kind registered
here builds its runs, and the plugin API's ``Evaluation`` keeps only what a plugin writes."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from evalq.shared.errors import GraderError, InputError, PermanentError, PluginError
from evalq.shared.evals.language import LanguageTask
from evalq.shared.evaluation import Evaluation, model_key
from evalq.shared.kinds import (
    PythonRunner,
    TaskKind,
    evaluation_of,
    kind_of,
    register_kind,
    runner_of,
)
from evalq.shared.lm import providers
from evalq.shared.lm.providers import Provider, register_provider
from evalq.shared.lm.run import LanguageRun
from evalq.shared.lm.spec import ModelSpec
from evalq.shared.lm.task import TaskSpec
from evalq.shared.models import RunMeta, RunStatus
from evalq.shared.services import Services
from evalq.shared.settings import Settings
from tests.helpers import REPO

ADD = {"prompt": "add {a} and {b}", "target": "answer", "generate": {}, "scorer": "exact_match"}
CHOICE = {"prompt": "{question}", "target": "label", "choices": "options", "scorer": "accuracy"}


@pytest.fixture
def echo() -> Iterator[None]:
    """``echo/`` registered for one test (the registries are the process's)."""
    saved, loaders = dict(providers._registry), dict(providers._loaders)
    register_provider(Provider("echo", "tests.echo_provider:load", frozenset({"batch_size"})))
    yield
    providers._registry.clear()
    providers._registry.update(saved)
    providers._loaders.clear()
    providers._loaders.update(loaders)


def _meta(eval_name: str, task: str | None = None, **params: str) -> RunMeta:
    return RunMeta(
        run_id="r1", eval=eval_name, params=params, task=task, spec="s", dataset_id="d",
        split="test", n=1, status=RunStatus.QUEUED, created=time.time(),
    )  # fmt: skip


def _services() -> Services:
    settings = Settings()
    return Services(settings, redis.Redis())  # never asked: nothing here reaches Redis


@pytest.mark.usefixtures("echo")
def test_a_third_provider_is_parsed_loaded_and_run_without_editing_evalq() -> None:
    spec = ModelSpec.parse("echo/parrot", {"batch_size": "3"})
    assert (spec.provider, spec.name, spec.args.batch_size, spec.endpoint) == (
        "echo", "parrot", 3, None
    )  # fmt: skip
    assert ModelSpec.parse(str(spec), spec.arg_items()) == spec
    with pytest.raises(InputError, match=r"unknown model arg 'base_url' for echo/ models "):
        ModelSpec.parse("echo/parrot", {"base_url": "http://x/v1"})
    assert "tests.echo_provider" not in sys.modules  # registered by name, not imported
    services = _services()
    task = LanguageTask("add", LanguageRun(task=TaskSpec.load(ADD), model=spec), {}, services)
    model = task.load("cpu")
    assert "tests.echo_provider" in sys.modules
    assert (type(model).__name__, model.services) == ("EchoModel", services)  # type: ignore[attr-defined]
    rows = [{"a": 1, "b": 2}, {"a": 3, "b": 4}]
    outputs = task.infer_samples(model, rows, [("r1", 0), ("r1", 1)])
    assert [o.output for o in outputs] == ["parrot:ADD 1 AND 2", "parrot:ADD 3 AND 4"]
    assert task.score({"answer": "parrot:ADD 1 AND 2"}, outputs[0].output) == {"exact_match": 1.0}


@pytest.mark.usefixtures("echo")
def test_an_unknown_provider_is_one_line_listing_the_registered_ones() -> None:
    with pytest.raises(InputError) as refused:
        ModelSpec.parse("vllm/org/model")
    assert str(refused.value) == (
        "model 'vllm/org/model': unknown provider 'vllm' (registered: echo/, hf/, openai/)"
    )
    with pytest.raises(PluginError, match="registered twice"):
        register_provider(Provider("echo", "tests.echo_provider:other", frozenset()))
    with pytest.raises(PluginError, match="'module:function'"):
        register_provider(Provider("echo2", "tests.echo_provider", frozenset()))


@pytest.mark.usefixtures("echo")
def test_a_provider_without_log_likelihoods_refuses_a_multiple_choice_task() -> None:
    run = LanguageRun(task=TaskSpec.load(CHOICE), model=ModelSpec.parse("echo/parrot"))
    task = LanguageTask("pick", run, {}, _services())
    row = {"question": "2+2?", "options": ["3", "4"]}
    with pytest.raises(PermanentError, match="echo/ models do not read"):
        task.infer_samples(task.load("cpu"), [row], [("r1", 0)])


def test_parsing_a_spec_imports_no_provider_runtime() -> None:
    """``hf``'s loader (torch, transformers) is imported when a model is loaded, never when
    a spec is parsed (the producer parses every ``--model``)."""
    probe = (
        "import sys; from evalq.shared.lm.spec import ModelSpec; ModelSpec.parse('hf/org/m'); "
        "ModelSpec.parse('openai/m', {'base_url': 'http://h/v1'}); "
        "print(sorted(m for m in ('evalq.shared.lm.hf', 'evalq.shared.evals.endpoints', "
        "'torch') if m in sys.modules))"
    )
    found = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120,
        check=True,
    )  # fmt: skip
    assert found.stdout.strip() == "[]"


def test_runs_of_a_language_task_are_one_class_configured_by_their_record() -> None:
    spec = ModelSpec.parse("openai/judge", {"base_url": "http://h/v1"})
    first = LanguageRun(task=TaskSpec.load(ADD), model=spec).model_dump_json()
    second = LanguageRun(task=TaskSpec.load(CHOICE), model=ModelSpec.parse("hf/org/m"))
    made = [
        evaluation_of(_meta("add", first)),
        evaluation_of(_meta("pick", second.model_dump_json())),
    ]
    assert [type(e) for e in made] == [LanguageTask, LanguageTask]
    assert [(e.name, e.label_fields, e.output_kind, e.rows_per_call) for e in made] == [
        ("add", ("answer",), "language-text", 256),
        ("pick", ("label",), "language-choices", None),
    ]
    assert dict(made[1].metric_ranges) == {"accuracy": (0.0, 1.0), "accuracy_norm": (0.0, 1.0)}
    assert made[1].failure_rule().ranges == made[1].metric_ranges
    assert LanguageTask.label_fields == ()  # the class itself is configured by nothing
    assert not runner_of(made[0]).isolatable
    with pytest.raises(InputError, match="evaluation 'add' takes no parameters, got 'x'"):
        evaluation_of(_meta("add", first, x="1"))


def test_a_language_task_described_only_loads_no_endpoint_and_grades_nothing() -> None:
    """The producer's evaluation (no services) cannot reach the fleet's stores."""
    grader = {"model": "openai/judge", "model_args": {"base_url": "http://h/v1"}}
    task = TaskSpec.load({**ADD, "scorer": "model_graded", "grader": grader})
    spec = ModelSpec.parse("openai/m", {"base_url": "http://h/v1"})
    described = evaluation_of(_meta("graded", LanguageRun(task=task, model=spec).model_dump_json()))
    with pytest.raises(PermanentError, match="loaded by a worker only"):
        described.load("cpu")
    row = {"a": 1, "b": 1, "answer": "2"}
    graded = runner_of(described).grade("r1", {0: row}, {0: {"output": "2"}})
    assert isinstance(graded[0], GraderError)
    assert "graded by a worker only" in str(graded[0])


def test_a_python_run_is_built_by_name_and_driven_with_the_defaults() -> None:
    made = evaluation_of(_meta("null"))
    assert kind_of(_meta("null")).name == "python"
    runner = runner_of(made)
    assert isinstance(runner, PythonRunner)
    assert runner.model_key() == model_key("null", {})
    assert runner.infer_samples(made.load("cpu"), [{"x": 1}], [("r1", 0)]) == made.infer(
        made.load("cpu"), [{"x": 1}]
    )
    assert (runner.grade("r1", {}, {}), runner.weights(), runner.definition()) == ({}, None, None)
    assert runner.described() == f"{type(made).__module__}.{type(made).__qualname__}"


class _Probe(Evaluation):
    name = "probe-kind"

    def infer(self, model: Any, rows: list[dict[str, Any]]) -> list[Any]:
        return [len(rows)] * len(rows)


class _ProbeKind(TaskKind):
    name = "probe"

    def __init__(self) -> None:
        self.services: list[Services | None] = []

    def claims(self, meta: RunMeta) -> bool:
        return meta.eval.startswith("probe-")

    def evaluation(self, meta: RunMeta, services: Services | None) -> Evaluation:
        self.services.append(services)
        return _Probe()


class _OtherProbeKind(_ProbeKind):
    """Another kind under the probe's name."""


def test_a_registered_kind_builds_the_runs_it_claims(monkeypatch: pytest.MonkeyPatch) -> None:
    from evalq.shared import kinds

    monkeypatch.setattr(kinds, "_kinds", dict(kinds._kinds))
    kind = register_kind(_ProbeKind())
    services = _services()
    assert isinstance(evaluation_of(_meta("probe-one"), services), _Probe)
    assert kind.services == [services]
    assert kind_of(_meta("null")).name == "python"  # the others' runs stay theirs
    assert sorted(kinds.registered_kinds()) == ["language", "lm-eval", "probe", "python"]
    with pytest.raises(PluginError, match="registered twice"):
        register_kind(_OtherProbeKind())


def test_the_plugin_api_keeps_only_what_a_plugin_writes() -> None:
    """What only a kind's evaluation answers is the kind's (:class:`evalq.shared.kinds.Runner`)."""
    for moved in ("infer_samples", "grade", "weights", "definition", "model_key", "isolatable"):
        assert not hasattr(Evaluation, moved), moved
    for kept in ("load", "infer", "score", "aggregate", "label_fields", "Params", "rows_per_call"):
        assert hasattr(Evaluation, kept), kept
