"""Registered language tasks on a language model, end to end on the shared stack's worker: a
task registered as YAML, run with ``--model hf/<folder>`` (a tiny random GPT-2), each output the
text the model generates in this process for the same prompt, with its tokens, and the model
shown on the run; the refusals that keep labels and folders out of a caller's reach."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import huggingface_hub
import pytest

from evalq.producer.commands.submit import point as point_of
from evalq.producer.reports.page import render
from evalq.producer.service.client import Client
from evalq.producer.service.report import gather
from evalq.producer.service.rescore import RescoreRequest
from evalq.producer.service.submit import SubmitRequest
from evalq.producer.service.views import SampleQuery
from evalq.shared.access.policy import Tier
from evalq.shared.access.roles import Role
from evalq.shared.access.tiers import TierRegistry
from evalq.shared.cli import python
from evalq.shared.errors import InputError, TierRefusedError, UnknownEvalError
from evalq.shared.evals.language import LanguageTask
from evalq.shared.kinds import evaluation_of
from evalq.shared.lm.hf import HFModel
from evalq.shared.lm.request import ChoiceRequest, ChoiceScore
from evalq.shared.lm.run import LanguageRun
from evalq.shared.lm.spec import ModelSpec, canonical, folder, identity, is_local
from evalq.shared.lm.task import TaskSpec
from evalq.shared.models import Usage, shown_model, to_json
from evalq.shared.store.wire import result_line, result_of, text_line
from tests.conftest import Stack
from tests.helpers import NOWHERE, REPO, cli_env, gateway, list_splits, wait_completed, write_rows
from tests.lm_fixtures import tiny_model

ADD = """
prompt: "Add {a} and {b}:"
target: answer
generate: {max_new_tokens: 6, stop: ["\\n"]}
scorer: exact_match
fewshot: {split: train, n: 2, seed: 3}
"""
CHOOSE = """
prompt: "Which is bigger, {a} or {b}?"
choices: options
target: answer
scorer: accuracy
"""


def _rows(n: int, salt: int) -> list[dict[str, object]]:
    return [
        {"a": i + salt, "b": 2 * i, "answer": str(3 * i + salt), "options": [str(i), str(i + 9)],
         "gold": 1}
        for i in range(n)
    ]  # fmt: skip


@pytest.fixture(scope="module")
def model_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("models")
    tiny_model(root / "tiny")
    return root


@pytest.fixture
def place(stack: Stack, model_root: Path, tmp_path: Path) -> Iterator[tuple[Client, Client, str]]:
    """A user and an admin (model roots: the tiny model's), a dataset with viewable
    ``validation`` and ``train`` splits and a non_viewable ``held`` one."""
    for split, salt in (("validation", 0), ("train", 50), ("held", 90)):
        rows = [{**row, "place": tmp_path.name} for row in _rows(8, salt)]  # own contents
        write_rows(tmp_path / "data", split, rows)
    name = list_splits(stack.client, tmp_path / "data", "validation", "train")
    TierRegistry(stack.client).set(name, "held", Tier.NON_VIEWABLE, who="tests")
    settings = stack.settings.model_copy(update={"model_roots": (model_root,)})
    user = Client(settings.model_copy(update={"principal": "lm-user"}))
    admin = Client(settings.model_copy(update={"principal": "lm-admin"}), admin=True)
    yield user, admin, name
    user.close()
    admin.close()


def _request(dataset: str, task: str, model: Path, **more: object) -> SubmitRequest:
    fields: dict[str, object] = {"eval": task, "dataset": dataset, "split": "validation"}
    return SubmitRequest.model_validate({**fields, "model": f"hf/{model}", **more})


def test_a_task_generates_what_the_model_generates_with_its_tokens(
    stack: Stack, place: tuple[Client, Client, str], model_root: Path
) -> None:
    user, admin, name = place
    admin.add_task("lm-add", ADD)
    assert "lm-add" in [t.name for t in user.tasks()]
    meta = user.submit(_request(name, "lm-add", model_root / "tiny"))
    assert meta.model == f"hf/{model_root / 'tiny'}"
    wait_completed(stack.client, meta.run_id)
    results = sorted(user.results(meta.run_id), key=lambda r: r.sample_id)
    # the same prompts (few-shot examples included), generated in this process
    evaluation = evaluation_of(user.status(meta.run_id).meta)
    assert isinstance(evaluation, LanguageTask)
    model = evaluation.load("cpu")
    assert isinstance(model, HFModel)
    rows = [{k: v for k, v in r.items() if k != "answer"} for r in _rows(8, 0)]
    expected = evaluation.infer_samples(model, rows, [(meta.run_id, i) for i in range(8)])
    assert [r.output for r in results] == [e.output for e in expected]
    assert all("\n" not in str(r.output) for r in results)
    for result, row in zip(results, rows, strict=True):
        assert result.usage is not None
        prompt = evaluation.prompt(model, row, result.sample_id)
        assert isinstance(prompt, str)
        assert result.usage.prompt_tokens == len(model.encode(prompt))
        assert 1 <= result.usage.completion_tokens <= 6
        assert prompt.count("Add ") == 3  # two few-shot examples, from train, then the row
    provenance = user.status(meta.run_id).provenance  # the weights' digest, the task's
    assert provenance is not None
    assert {w.weights for w in provenance.workers} == {identity(evaluation.run.model)}
    assert {w.source_sha256 for w in provenance.workers} == {evaluation.run.task.digest}
    counted = user.status(meta.run_id).progress  # the run's tokens, each output's once
    assert counted.prompt_tokens == sum(r.usage.prompt_tokens for r in results if r.usage)
    assert counted.completion_tokens == sum(r.usage.completion_tokens for r in results if r.usage)
    shown = [v.meta.model for v in user.recent() if v.meta.run_id == meta.run_id]
    assert shown == [f"hf/{model_root / 'tiny'}"]


def test_a_chat_samples_view_shows_the_text_its_chat_template_made(
    stack: Stack, place: tuple[Client, Client, str], model_root: Path
) -> None:
    """A chat task's sample page (the API's sample JSON, the viewer's page) shows the prompt
    as the model read it: the tokenizer's chat template over the few-shot prompt, the very
    text whose tokens the worker counted; a held-out split's samples show no prompt at all."""
    user, admin, name = place
    admin.add_task("lm-add-chat", ADD + "chat: true\nsystem: Be brief.\n")
    meta = user.submit(_request(name, "lm-add-chat", model_root / "tiny"))
    wait_completed(stack.client, meta.run_id)
    page = user.samples.page(meta.run_id, SampleQuery(with_input=True))
    assert len(page.samples) == 8
    model = HFModel.load(ModelSpec.parse(f"hf/{model_root / 'tiny'}"), "cpu")
    for result in page.samples:
        shown = result.prompt
        assert isinstance(shown, str)
        assert shown.startswith("<|system|>Be brief.\n<|user|>Add ")
        assert shown.endswith(":\n<|assistant|>")
        assert shown.count("Add ") == 3  # two few-shot examples, then the row
        assert result.input is not None
        assert result.usage is not None
        assert f"Add {result.input['a']} and {result.input['b']}:" in shown
        assert result.usage.prompt_tokens == len(model.encode(shown))  # what the model read
    held = user.submit(_request(name, "lm-add-chat", model_root / "tiny", split="held"))
    wait_completed(stack.client, held.run_id)
    with pytest.raises(TierRefusedError):
        user.samples.page(held.run_id, SampleQuery(with_input=True))


def test_a_multiple_choice_task_scores_the_model_s_log_likelihoods(
    stack: Stack, place: tuple[Client, Client, str], model_root: Path
) -> None:
    user, admin, name = place
    admin.add_task("lm-choose", CHOOSE.replace("target: answer", "target: gold"))
    meta = user.submit(_request(name, "lm-choose", model_root / "tiny"))
    wait_completed(stack.client, meta.run_id)
    evaluation = evaluation_of(user.status(meta.run_id).meta)
    assert isinstance(evaluation, LanguageTask)
    model = HFModel.load(evaluation.run.model, "cpu")
    right = 0
    for result in user.results(meta.run_id):
        i = result.sample_id
        context = f"Which is bigger, {i} or {2 * i}?"
        scores = [s.logprob for s in model_scores(model, context, [f" {i}", f" {i + 9}"])]
        assert result.output == pytest.approx(scores, abs=1e-4)
        assert result.scores is not None
        assert result.scores["accuracy"] == float(scores[1] > scores[0])
        right += int(scores[1] > scores[0])
    aggregate = user.status(meta.run_id).aggregate
    assert aggregate is not None
    assert aggregate["accuracy"] == pytest.approx(right / 8)


def model_scores(model: HFModel, context: str, continuations: list[str]) -> list[ChoiceScore]:
    return model.loglikelihood([ChoiceRequest(context, c) for c in continuations])


def test_what_a_caller_may_not_name_is_refused_in_one_line(
    place: tuple[Client, Client, str], model_root: Path, tmp_path: Path
) -> None:
    user, admin, name = place
    admin.add_task("lm-add", ADD)
    tiny = model_root / "tiny"
    with pytest.raises(InputError, match="'topic' is a Python evaluation: it loads its own model"):
        user.submit(
            SubmitRequest(eval="topic", dataset=name, split="validation", model=f"hf/{tiny}")
        )
    with pytest.raises(InputError, match="task 'lm-add' runs on a model: add --model"):
        user.submit(SubmitRequest(eval="lm-add", dataset=name, split="validation"))
    with pytest.raises(UnknownEvalError, match="lm-add"):
        user.submit(_request(name, "lm-nothing", tiny))
    outside = tiny_model(tmp_path / "elsewhere")
    with pytest.raises(TierRefusedError, match="is not inside a model root"):
        user.submit(_request(name, "lm-add", outside))
    with pytest.raises(TierRefusedError, match="model refused: /etc is not inside"):
        user.submit(_request(name, "lm-add", Path("../" * 64 + "etc")))  # a path, resolved
    # refused before anything is looked up: a caller cannot probe which folders exist
    with pytest.raises(TierRefusedError, match="/no/such/evalq/folder is not inside"):
        user.submit(_request(name, "lm-add", Path("/no/such/evalq/folder")))
    with pytest.raises(TierRefusedError, match="neither a Hub id"):
        user.submit(_request(name, "lm-add", Path("a/b/c")))
    assert admin.submit(_request(name, "lm-add", outside)).model == f"hf/{outside}"
    # a link inside the root to a folder outside it is the folder outside (the attack review)
    (model_root / f"link-{name}").symlink_to(outside)
    with pytest.raises(TierRefusedError, match="is not inside a model root"):
        user.submit(_request(name, "lm-add", model_root / f"link-{name}"))
    # a home that cannot be expanded is a path like any other (was an HTTP 500, then the OS's
    # error: an oracle of which users exist on the gateway's host)
    with pytest.raises(TierRefusedError, match="is not inside a model root"):
        user.submit(SubmitRequest(eval="lm-add", dataset=name, split="validation",
                                  model="hf/~nosuchuser/x"))  # fmt: skip
    for bad, why in (
        (f"hf/{model_root}/absent", "no such model folder on this machine"),
        (f"hf/{tiny}@main", "a revision applies to Hub ids, not local folders"),
    ):
        with pytest.raises(InputError, match=why):
            user.submit(SubmitRequest(eval="lm-add", dataset=name, split="validation", model=bad))
    # few-shot examples are labelled rows: never from a held-out split, even for an admin
    admin.add_task("lm-held", ADD.replace("split: train", "split: held"))
    for caller in (user, admin):
        with pytest.raises(TierRefusedError, match="only from a viewable split"):
            caller.submit(_request(name, "lm-held", tiny))
    admin.add_task("lm-none", ADD.replace("split: train", "split: nowhere"))
    with pytest.raises(InputError, match="has no split 'nowhere'"):  # exit 2, not a refusal
        user.submit(_request(name, "lm-none", tiny))
    with pytest.raises(InputError, match="from a registered dataset's viewable split"):
        admin.submit(
            SubmitRequest(
                eval="lm-add", data=next(d.data for d in admin.datasets() if d.name == name),
                split="validation", model=f"hf/{tiny}",
            )
        )  # fmt: skip
    admin.add_task("lm-c", ADD.replace("{b}", "{c}"))
    with pytest.raises(InputError, match="the split's rows has no field 'c'"):
        user.submit(_request(name, "lm-c", tiny))
    with pytest.raises(InputError, match="Python evaluation's name"):
        admin.add_task("topic", ADD)
    with pytest.raises(InputError, match="unknown scorer 'eval_me'"):
        admin.add_task("lm-x", ADD.replace("exact_match", "eval_me"))
    assert json.loads(json.dumps([t.name for t in user.tasks()]))  # listed, JSON-able


@pytest.mark.integration
def test_a_redelivered_sample_generates_the_same_text_in_any_batch(model_root: Path) -> None:
    """Sampled generation draws each sample's tokens from a seed of its run and id alone: a
    sample sent again (alone, or with other samples) writes what it wrote the first time."""
    spec = TaskSpec.from_yaml(
        ADD.replace("max_new_tokens: 6", "max_new_tokens: 12, temperature: 1.5")
    )
    run = LanguageRun(task=spec, model=ModelSpec.parse(f"hf/{model_root / 'tiny'}"))
    evaluation = LanguageTask("lm-sampled", run)
    model = evaluation.load("cpu")
    rows = [{"a": i, "b": 7 * i} for i in range(6)]
    samples = [("r1", i) for i in range(6)]
    together = evaluation.infer_samples(model, rows, samples)
    alone = [
        evaluation.infer_samples(model, [row], [sample])[0]
        for row, sample in zip(rows, samples, strict=True)
    ]
    reversed_ = evaluation.infer_samples(model, rows[::-1], samples[::-1])[::-1]
    assert together == alone == reversed_
    other_run = evaluation.infer_samples(model, rows, [("r2", i) for i in range(6)])
    assert [o.output for o in other_run] != [t.output for t in together]


def test_a_result_line_carries_output_and_usage_apart() -> None:
    """An output stored with its usage beside it reads as ``output`` and ``usage`` side by
    side, in the line built from the stored texts as in the result parsed from them."""
    usage = Usage(prompt_tokens=9, completion_tokens=2)
    line = json.loads(text_line(3, '"42"', '{"exact_match":1.0}', None, usage=usage.stored()))
    assert line == {
        "sample_id": 3, "output": "42", "usage": {"prompt_tokens": 9, "completion_tokens": 2},
        "scores": {"exact_match": 1.0},
    }  # fmt: skip
    result = result_of(3, '"42"', '{"exact_match":1.0}', None, usage=usage.stored())
    assert (result.output, result.usage) == ("42", usage)
    assert json.loads(result_line(result)) == line
    plain = result_of(4, to_json({"output": 1, "usage": 2}), None, None)  # a plugin's own dict
    assert (plain.output, plain.usage) == ({"output": 1, "usage": 2}, None)


@pytest.mark.integration  # the demo starts its own worker process
def test_the_language_demo_runs_both_tasks_and_reports_tokens(
    model_root: Path, tmp_path: Path
) -> None:
    """``evalq demo --lm`` end to end (a private Redis, a worker, both built-in tasks), on the
    tiny model instead of SmolLM2 (``make lm`` is not part of the test install)."""
    result = subprocess.run(
        [*python("-c", "from evalq.shared.cli import main; main()"), "demo", "--lm", "--json",
         "--model", f"hf/{model_root / 'tiny'}", "--out", str(tmp_path)],
        env={k: v for k, v in os.environ.items() if not k.startswith("EVALQ_")},
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    summaries = {s["task"]: s for s in json.loads(result.stdout)}
    assert (summaries["sums"]["samples"], summaries["capitals"]["samples"]) == (100, 40)
    assert set(summaries["sums"]["stats"]) == {"numeric"}
    assert set(summaries["capitals"]["stats"]) == {"accuracy", "accuracy_norm"}
    assert summaries["sums"]["completion_tokens"] > 0
    lines = (tmp_path / "sums.jsonl").read_text().splitlines()
    assert len(lines) == 100
    assert {"output", "usage", "scores"} <= set(json.loads(lines[0]))


def test_runs_of_one_task_on_two_models_compare_side_by_side(
    stack: Stack, place: tuple[Client, Client, str], model_root: Path
) -> None:
    """The model is its own axis: ``--sweep model=…`` gives one run per model, and ``runs``,
    ``compare`` and the report say which model each run was."""
    user, admin, name = place
    admin.add_task("lm-add", ADD)
    other = tiny_model(model_root / f"tiny-{name}", seed=1)
    models = [f"hf/{model_root / 'tiny'}", f"hf/{other}"]
    metas = []
    for model in models:  # what the CLI's --sweep model=… submits, point by point
        point = point_of(
            _request(name, "lm-add", model_root / "tiny"), {"model": model}, "ab12", models=True
        )
        metas.append(user.submit(point))
    assert [(m.model, m.sweep) for m in metas] == [(model, "ab12") for model in models]
    for meta in metas:
        wait_completed(stack.client, meta.run_id)
    found = user.compare([m.run_id for m in metas])
    assert found.runs == {
        m.run_id: f"model={model}" for m, model in zip(metas, models, strict=True)
    }
    listed = {v.meta.run_id: v.meta.settings_shown for v in user.recent()}
    assert listed[metas[1].run_id] == f"model={models[1]}"
    page = render(gather(user.status(metas[1].run_id), user.samples))
    assert f"<th>model</th><td>{shown_model(models[1])}</td>" in page
    assert "hf//" not in page  # a folder's path after hf:, not the canonical double slash


def test_a_language_run_is_rescored_by_another_task_without_inference(
    stack: Stack, place: tuple[Client, Client, str], model_root: Path
) -> None:
    """``rescore RUN --eval TASK`` scores the run's stored texts with the other task's scorer
    on the same model and examples (it failed: the task's name is no Python evaluation)."""
    user, admin, name = place
    admin.add_task("lm-add", ADD)
    admin.add_task("lm-add-includes", ADD.replace("exact_match", "includes"))
    admin.add_task("lm-choose", CHOOSE)
    source = user.submit(_request(name, "lm-add", model_root / "tiny"))
    wait_completed(stack.client, source.run_id)
    meta = user.rescore(RescoreRequest(run=source.run_id, eval="lm-add-includes"))
    assert (meta.eval, meta.model, meta.rescored_from) == (
        "lm-add-includes",
        source.model,
        source.run_id,
    )
    wait_completed(stack.client, meta.run_id)
    before = {r.sample_id: r for r in user.results(source.run_id)}
    after = {r.sample_id: r for r in user.results(meta.run_id)}
    assert {i: r.output for i, r in after.items()} == {i: r.output for i, r in before.items()}
    rows = {i: row for i, row in enumerate(_rows(8, 0))}
    includes = TaskSpec.from_yaml(ADD.replace("exact_match", "includes"))
    assert {i: r.scores for i, r in after.items()} == {
        i: includes.score(str(r.output), rows[i]) for i, r in after.items()
    }
    run = LanguageRun.model_validate_json(user.status(meta.run_id).meta.task or "")
    assert run.task.scorer == "includes"
    assert run.examples == LanguageRun.model_validate_json(source.task or "").examples
    with pytest.raises(InputError, match="output kinds"):
        user.rescore(RescoreRequest(run=source.run_id, eval="lm-choose"))


def test_a_name_shaped_like_a_hub_id_is_never_a_local_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model_root: Path
) -> None:
    """``hf/evil/model`` loaded ``./evil/model`` relative to the worker's directory (the attack
    review): a folder is named as a path, anything else is a Hub id, looked up in the Hub's
    cache only."""
    monkeypatch.chdir(tmp_path)
    tiny_model(tmp_path / "evil" / "model")
    hub = ModelSpec.parse("hf/evil/model")
    assert not is_local(hub)
    assert canonical(hub) == hub
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(InputError, match="not found on the Hub nor in its cache"):
        folder(hub)
    here = canonical(ModelSpec.parse("hf/./evil/model"))
    assert here.name == str(tmp_path / "evil" / "model")
    assert folder(here) == tmp_path / "evil" / "model"


def test_the_cli_registers_lists_and_runs_a_task_through_the_gateway(
    stack: Stack, place: tuple[Client, Client, str], model_root: Path, tmp_path: Path
) -> None:
    """The whole contract through the gateway with tokens: an admin adds the task from its
    file, a user lists it, submits it with ``--model``, reads each result's output and usage,
    the run's tokens in ``status --json`` and its model in ``runs``; a user cannot add one."""
    _, operator, name = place
    admin_token = operator.create_token("lm-root", Role.ADMIN)
    user_token = operator.create_token("lm-cli", Role.USER)
    task = tmp_path / "add.yaml"
    task.write_text(ADD)
    tiny = f"hf/{model_root / 'tiny'}"
    with gateway(stack.server.url, tmp_path / "gw.log", EVALQ_MODEL_ROOTS=str(model_root)) as (
        api,
        _,
    ):

        def cli(token: str, *args: str) -> subprocess.CompletedProcess[str]:
            env = cli_env(NOWHERE, EVALQ_API_URL=api)
            return subprocess.run(
                [*python("-c", "from evalq.shared.cli import main; main()"), *args],
                env={**env, "EVALQ_TOKEN": token}, cwd=REPO, capture_output=True, text=True,
                timeout=120, check=False,
            )  # fmt: skip

        refused = cli(user_token, "tasks", "add", "lm-cli", "--file", str(task))
        assert refused.returncode == 3, refused.stderr
        added = cli(admin_token, "tasks", "add", "lm-cli", "--file", str(task))
        assert added.returncode == 0, added.stderr
        listed = json.loads(cli(user_token, "tasks", "list", "--json").stdout)
        assert "lm-cli" in [t["name"] for t in listed]
        submitted = cli(
            user_token, "submit", "lm-cli", "--dataset", name, "--split", "validation",
            "--model", tiny, "--follow", "--json",
        )  # fmt: skip
        assert submitted.returncode == 0, submitted.stderr
        run_id = json.loads(submitted.stdout.splitlines()[0])["run_id"]
        lines = [json.loads(x) for x in cli(user_token, "results", run_id).stdout.splitlines()]
        assert len(lines) == 8
        assert all(isinstance(x["output"], str) and x["usage"]["prompt_tokens"] > 0 for x in lines)
        status = json.loads(cli(user_token, "status", run_id, "--json").stdout)
        assert status["model"] == tiny
        generated = sum(x["usage"]["completion_tokens"] for x in lines)
        assert status["progress"]["completion_tokens"] == generated
        runs = json.loads(cli(user_token, "runs", "--json").stdout)
        assert [r["model"] for r in runs if r["run_id"] == run_id] == [tiny]
