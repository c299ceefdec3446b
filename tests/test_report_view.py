"""The run report's and the viewer's rendering of a language task's run, as plain functions:
the target read from the task's target field, the prompt the model read, outputs as text, the
model's folder without the canonical double slash, and provenance naming the task."""

from __future__ import annotations

import time

import yaml

from evalq.producer.comparison import Comparison
from evalq.producer.page import render, render_comparison
from evalq.producer.report import Report
from evalq.producer.samples import target_of
from evalq.producer.views import RunView
from evalq.shared.access.policy import Tier
from evalq.shared.evals.language import LanguageEvaluation
from evalq.shared.lm.run import Example, LanguageRun
from evalq.shared.lm.spec import ModelSpec
from evalq.shared.lm.task import TaskSpec
from evalq.shared.models import Progress, RunMeta, RunStatus, shown_model
from evalq.shared.stats import Delta
from evalq.shared.store.wire import result_of

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


def test_a_chat_tasks_prompt_is_its_messages() -> None:
    shown = _run(chat=True).shown_prompt({"text": "awful", "label": "negative"}, 0)
    assert shown == [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": "Review: great\nSentiment: positive\n\nReview: awful\nSentiment:",
        },
    ]


def test_models_print_without_the_double_slash_and_provenance_names_the_task() -> None:
    assert shown_model("hf//root/.cache/m") == "hf:/root/.cache/m"
    assert shown_model("hf/org/name@main") == "hf/org/name@main"
    evaluation = LanguageEvaluation.of("senti-gen", _run())()
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
