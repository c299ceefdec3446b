"""YAML language-model tasks: what a task file may say, the prompts it renders, its scorers."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest

from evalq.shared.errors import InputError, PermanentError, PluginError
from evalq.shared.lm import scorers
from evalq.shared.lm.scorers import (
    NumericOptions,
    ScorerOptions,
    last_number,
    register_scorer,
    registered_scorers,
    scorer,
)
from evalq.shared.lm.task import TaskSpec, fewshot_indices
from evalq.shared.lm.template import chat_messages

MINIMAL = """\
prompt: "What is {a} plus {b}? Answer with only the number."   # fields of the row
chat: true                      # apply the model's chat template
target: answer                  # a label field: scrubbed before inference
generate: {max_new_tokens: 8, stop: ["\\n"]}
scorer: exact_match             # includes | regex | numeric | a registered Python scorer
"""

CHOICE = """\
prompt: "Question: {question}\\nAnswer:"
target: label
choices: options
scorer: accuracy
fewshot: {split: train, n: 2, seed: 7}
"""


def task(**keys: Any) -> TaskSpec:
    """A generation task with ``keys`` over the minimal one's."""
    base: dict[str, Any] = {"prompt": "Q: {q}", "target": "answer", "generate": {}}
    return TaskSpec.load({**base, "scorer": "exact_match", **keys})


def refusal(data: object) -> str:
    """The one-line message a task is refused with."""
    with pytest.raises(InputError) as caught:
        TaskSpec.load(data)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_the_minimal_task_file_parses() -> None:
    spec = TaskSpec.from_yaml(MINIMAL)
    assert spec.chat is True
    assert spec.target == "answer"
    assert spec.label_fields == ("answer",)
    assert spec.fields == ("a", "b")
    assert spec.generate is not None
    assert spec.generate.max_new_tokens == 8
    assert spec.generate.stop == ("\n",)
    assert (spec.generate.temperature, spec.generate.top_p) == (0.0, 1.0)
    assert spec.choices is None
    assert spec.render({"a": 2, "b": 3}) == "What is 2 plus 3? Answer with only the number."
    assert chat_messages(spec.render({"a": 2, "b": 3}), spec.system) == (
        ("user", "What is 2 plus 3? Answer with only the number."),
    )


def test_the_multiple_choice_task_file_parses() -> None:
    spec = TaskSpec.from_yaml(CHOICE)
    assert spec.generate is None
    assert spec.choices == "options"
    assert spec.fewshot is not None
    assert (spec.fewshot.split, spec.fewshot.n, spec.fewshot.seed) == ("train", 2, 7)
    row = {"question": "Sky?", "options": ["blue", "green"], "label": 0}
    assert spec.continuations(row) == [" blue", " green"]
    assert spec.render(row) == "Question: Sky?\nAnswer:"


def test_a_task_is_frozen_and_its_digest_ignores_layout_and_comments() -> None:
    spec = TaskSpec.from_yaml(MINIMAL)
    with pytest.raises(ValueError, match="frozen"):
        spec.chat = False
    same = TaskSpec.from_yaml(
        "scorer: exact_match\ntarget: answer\nchat: true\n"
        'prompt: "What is {a} plus {b}? Answer with only the number."\n'
        'generate:\n  stop: ["\\n"]\n  max_new_tokens: 8\n  temperature: 0\n'
    )
    assert same.digest == spec.digest
    assert re.fullmatch(r"[0-9a-f]{64}", spec.digest)
    assert TaskSpec.from_yaml(MINIMAL.replace("8", "9")).digest != spec.digest


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (
            {"prompt": "x", "target": "y", "scorer": "exact_match", "generate": {}, "promt": 1},
            "unknown key 'promt' (allowed: prompt, chat, system, target, labels, generate, "
            "choices, scorer, pattern, tolerance, fewshot, grader)",
        ),
        (
            {"prompt": "x", "target": "y", "scorer": "exact_match", "generate": {"topk": 5}},
            "unknown key 'generate.topk' (allowed: max_new_tokens, stop, temperature, top_p)",
        ),
        (
            {"prompt": "x", "target": "y", "scorer": "exact_match"},
            "a task has either 'generate' or 'choices' (not both, not neither)",
        ),
        (
            {"prompt": "x", "target": "y", "scorer": "exact_match", "generate": {}, "choices": "c"},
            "a task has either 'generate' or 'choices' (not both, not neither)",
        ),
        (
            {"prompt": "x", "target": "y", "scorer": "accuracy", "generate": {}},
            "scorer 'accuracy' scores choices: it needs 'choices'",
        ),
        (
            {"prompt": "x", "target": "y", "scorer": "numeric", "choices": "c"},
            "scorer 'numeric' scores generated text: it needs 'generate'",
        ),
        (
            {"prompt": "{q} {answer}", "target": "answer", "scorer": "includes", "generate": {}},
            "the prompt uses label field 'answer'",
        ),
        (
            {
                "prompt": "{q} {why}",
                "target": "answer",
                "labels": ["why"],
                "scorer": "includes",
                "generate": {},
            },
            "the prompt uses label field 'why'",
        ),
        (
            {"prompt": "x", "target": "y", "scorer": "bleu", "generate": {}},
            "unknown scorer 'bleu' (registered: accuracy, exact_match, includes, model_graded, "
            "numeric, regex)",
        ),
        (
            {"prompt": "x", "target": "y", "scorer": "regex", "generate": {}},
            "scorer 'regex' needs 'pattern'",
        ),
        (
            {"prompt": "x", "target": "y", "scorer": "regex", "generate": {}, "pattern": "(a)(b)"},
            "pattern '(a)(b)' has 2 capture groups; it needs exactly 1 "
            "(the answer; use (?:...) for the others)",
        ),
        (
            {"prompt": "x", "target": "y", "scorer": "exact_match", "generate": {}, "tolerance": 1},
            "'tolerance' is not an option of scorer 'exact_match'",
        ),
        (
            {"prompt": "x", "target": "y", "scorer": "exact_match", "generate": {"top_p": 0}},
            "task key 'generate.top_p' = 0: Input should be greater than 0",
        ),
        (
            {"prompt": "x", "target": "y", "scorer": "exact_match", "generate": {"stop": [""]}},
            "task key 'generate.stop.0' = '': String should have at least 1 character",
        ),
        (
            {"prompt": "x", "target": "y", "scorer": "accuracy", "choices": "y"},
            "choices field 'y' is a label field (it is scrubbed before inference, which needs "
            "the choices)",
        ),
        (
            {"prompt": "x", "target": "y", "scorer": "exact_match", "generate": {}, "chat": "yes"},
            "task key 'chat' = 'yes': Input should be a valid boolean",
        ),
        ({"prompt": "x", "scorer": "exact_match", "generate": {}}, "task needs 'target'"),
        (["prompt"], "a task is a mapping of keys (prompt, target, ...), got list"),
    ],
)
def test_each_refusal_is_one_line_naming_the_problem(data: object, expected: str) -> None:
    assert refusal(data) == expected


def test_a_task_file_that_is_not_yaml_or_not_a_mapping_is_one_line() -> None:
    for text, expected in [
        ("prompt: [", "task file is not valid YAML"),
        ("just text", "a task is a mapping of keys (prompt, target, ...), got str"),
        ("", "a task is a mapping of keys (prompt, target, ...), got NoneType"),
        ("!!python/object:os.system {}", "task file is not valid YAML"),
    ]:
        with pytest.raises(InputError) as caught:
            TaskSpec.from_yaml(text)
        assert str(caught.value).startswith(expected)
        assert "\n" not in str(caught.value)


@pytest.mark.parametrize("field", ["{a.__class__}", "{a[0]}", "{a!r}", "{a:>10}", "{}", "{0}"])
def test_template_injection_is_refused(field: str) -> None:
    assert refusal(
        {"prompt": f"x {field}", "target": "y", "scorer": "exact_match", "generate": {}}
    ) == (
        f"prompt field {field} is refused: use plain {{field}} names (no attribute, index, "
        "conversion or format spec)"
    )


def test_literal_braces_stay_literal() -> None:
    spec = task(prompt="{{q}} is {q}")
    assert spec.fields == ("q",)
    assert spec.render({"q": "{a.__class__}"}) == "{q} is {a.__class__}"


def test_label_fields_never_reach_the_prompt_but_few_shot_answers_do() -> None:
    """The rule: a rendered prompt holds no label value of the evaluated row, and of each
    few-shot example only its answer (the target's text); never a ``labels`` field."""
    spec = task(prompt="Q: {q} ({hint})", target="answer", labels=["rationale"], system="Sys")
    row = {"q": "two?", "hint": "h", "answer": "MARK-ROW-ANSWER", "rationale": "MARK-ROW-WHY"}
    examples: list[dict[str, Any]] = [
        {"q": f"q{i}", "hint": "h", "answer": f"MARK-EX{i}-ANSWER", "rationale": f"MARK-EX{i}-WHY"}
        for i in range(2)
    ]
    rendered = [spec.render(row, examples), spec.text(row, examples)]
    rendered += [content for _, content in chat_messages(spec.render(row, examples), spec.system)]
    for text in rendered:
        assert set(re.findall(r"MARK-[A-Z0-9]+-[A-Z]+", text)) <= {
            "MARK-EX0-ANSWER",
            "MARK-EX1-ANSWER",
        }
    assert spec.render(row, examples) == (
        "Q: q0 (h) MARK-EX0-ANSWER\n\nQ: q1 (h) MARK-EX1-ANSWER\n\nQ: two? (h)"
    )
    # the evaluated row may arrive scrubbed: rendering reads none of its labels
    assert spec.render({"q": "two?", "hint": "h"}) == "Q: two? (h)"


def test_multiple_choice_few_shot_shows_the_right_choice_text() -> None:
    spec = TaskSpec.from_yaml(CHOICE)
    examples: list[dict[str, Any]] = [
        {"question": "Grass?", "options": ["red", "green"], "label": 1},
        {"question": "Snow?", "options": ["white", "black"], "label": "white"},
    ]
    row = {"question": "Sky?", "options": ["blue", "MARK"], "label": 0}
    assert spec.render(row, examples) == (
        "Question: Grass?\nAnswer: green\n\nQuestion: Snow?\nAnswer: white\n\n"
        "Question: Sky?\nAnswer:"
    )


def test_system_prompt_is_a_message_with_chat_and_a_prefix_without() -> None:
    spec = task(system="Be brief. ")
    messages = chat_messages(spec.render({"q": 1}), spec.system)
    assert messages == (("system", "Be brief. "), ("user", "Q: 1"))
    assert spec.text({"q": 1}) == "Be brief. Q: 1"
    assert spec.system is not None
    assert "{" not in messages[0][1]


def test_a_template_field_missing_in_the_row_is_one_line() -> None:
    spec = task(prompt="{q} and {r}")
    with pytest.raises(InputError) as caught:
        spec.render({"q": 1})
    assert str(caught.value) == "the row has no field 'r' (the prompt uses it)"
    with pytest.raises(InputError) as caught:
        spec.render({"q": 1, "r": 2}, [{"q": 1, "r": 2, "answer": 3}, {"q": 1, "answer": 3}])
    assert str(caught.value) == "few-shot example 1 has no field 'r' (the prompt uses it)"


def test_few_shot_indices_are_deterministic_distinct_and_in_range() -> None:
    first = fewshot_indices(1000, 5, 1234)
    assert first == fewshot_indices(1000, 5, 1234)
    assert first == [966, 441, 9, 911, 939]  # pinned: the same on every machine and version
    assert fewshot_indices(1000, 5, 1235) != first
    for n_rows, n, seed in [(5, 5, 0), (7, 3, 1), (1, 1, 9), (40, 32, -3), (3, 0, 0)]:
        got = fewshot_indices(n_rows, n, seed)
        assert len(got) == len(set(got)) == n
        assert all(0 <= i < n_rows for i in got)
    assert sorted(fewshot_indices(5, 5, 0)) == [0, 1, 2, 3, 4]
    for exclude in range(6):
        got = fewshot_indices(6, 5, 3, exclude=exclude)
        assert sorted(got) == [i for i in range(6) if i != exclude]
    with pytest.raises(InputError, match="few-shot needs 6 example rows, the split has 5"):
        fewshot_indices(5, 6, 0)
    with pytest.raises(InputError, match="the split has 4"):
        fewshot_indices(5, 5, 0, exclude=2)


def test_few_shot_settings_are_bounded() -> None:
    assert (
        refusal({**_generation(), "fewshot": {"split": "train", "n": 33}})
        == "task key 'fewshot.n' = 33: Input should be less than or equal to 32"
    )
    assert refusal({**_generation(), "fewshot": {"split": "a/b", "n": 1}}) == (
        "invalid fewshot split 'a/b': use 1-64 letters, digits, '_' or '-', "
        "starting with a letter or digit"
    )


def _generation() -> dict[str, Any]:
    return {"prompt": "{q}", "target": "answer", "scorer": "exact_match", "generate": {}}


def test_exact_match_strips_both_sides() -> None:
    spec = task()
    assert spec.score("  42\n", {"answer": 42}) == {"exact_match": 1.0}
    assert spec.score("42.", {"answer": " 42 "}) == {"exact_match": 0.0}
    assert spec.score("b", {"answer": ["a", "b"]}) == {"exact_match": 1.0}
    with pytest.raises(InputError, match="the row has no label field 'answer'"):
        spec.score("42", {"q": 1})


def test_includes_finds_the_target_in_the_output() -> None:
    spec = task(scorer="includes")
    assert spec.score("I think Paris, France.", {"answer": "Paris"}) == {"includes": 1.0}
    assert spec.score("I think Lyon.", {"answer": "Paris"}) == {"includes": 0.0}
    with pytest.raises(InputError, match="label field 'answer' is empty"):
        spec.score("anything", {"answer": " "})


def test_regex_compares_the_first_group_and_no_match_scores_zero() -> None:
    spec = task(scorer="regex", pattern=r"answer is\s*\(?([A-D])\)?")
    assert spec.score("The answer is (B).", {"answer": "B"}) == {"regex": 1.0}
    assert spec.score("The answer is C, not B", {"answer": "B"}) == {"regex": 0.0}
    assert spec.score("I do not know", {"answer": "B"}) == {"regex": 0.0}
    optional = task(scorer="regex", pattern=r"x(y)?")
    assert optional.score("x", {"answer": "y"}) == {"regex": 0.0}
    with pytest.raises(InputError, match="not a valid regular expression"):
        task(scorer="regex", pattern="(a")


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1,234", 1234.0),
        ("-3.5", -3.5),
        ("The answer is 42.", 42.0),
        ("It costs $1,234,567.89 in total", 1234567.89),
        ("from 3 to +7", 7.0),
        ("pages 10-12", 12.0),
        ("x = -0.25, so", -0.25),
        ("about 1e3 or 2.5E-2", 0.025),
        ("ratio .5", 0.5),
        ("no number here", None),
        ("", None),
    ],
)
def test_numeric_reads_the_last_number(text: str, value: float | None) -> None:
    assert last_number(text) == value


def test_numeric_scores_within_tolerance() -> None:
    spec = task(scorer="numeric")
    assert spec.score("So 1,234 apples.", {"answer": 1234}) == {"numeric": 1.0}
    assert spec.score("-3.5", {"answer": "-3.5"}) == {"numeric": 1.0}
    assert spec.score("The answer is 42.", {"answer": "1,234"}) == {"numeric": 0.0}
    assert spec.score("I cannot tell", {"answer": 3}) == {"numeric": 0.0}
    assert spec.score("3.0000001", {"answer": 3}) == {"numeric": 1.0}
    assert spec.score("3.01", {"answer": 3}) == {"numeric": 0.0}
    loose = task(scorer="numeric", tolerance=0.05)
    assert loose.score("3.01", {"answer": 3}) == {"numeric": 1.0}
    with pytest.raises(InputError, match="label field 'answer' is not a number: 'three'"):
        spec.score("3", {"answer": "three"})


def _choice_task() -> TaskSpec:
    return TaskSpec.load(
        {"prompt": "{q}", "target": "label", "choices": "options", "scorer": "accuracy"}
    )


def test_accuracy_and_accuracy_norm_disagree_where_lengths_differ() -> None:
    spec = _choice_task()
    row = {"q": "?", "options": ["a", "a much longer choice"], "label": 1}
    # raw: choice 0 (-2 > -10); per character: -2/1 = -2 < -10/20 = -0.5, so choice 1
    assert spec.score([-2.0, -10.0], row) == {"accuracy": 0.0, "accuracy_norm": 1.0}
    assert spec.score([-2.0, -10.0], {**row, "label": 0}) == {
        "accuracy": 1.0,
        "accuracy_norm": 0.0,
    }
    # lengths are the choice texts' own, without the " " before each (lm-eval's
    # completion_len): -1/1 < -1.9/2, where -1/2 > -1.9/3 would pick the first
    assert spec.score([-1.0, -1.9], {**row, "options": ["a", "bb"], "label": 1}) == {
        "accuracy": 0.0,
        "accuracy_norm": 1.0,
    }
    # ties go to the first choice, as numpy's argmax
    assert spec.score([-1.0, -1.0], {**row, "options": ["ab", "cd"], "label": 0}) == {
        "accuracy": 1.0,
        "accuracy_norm": 1.0,
    }
    assert spec.score([-math.inf, -3.0], row) == {"accuracy": 1.0, "accuracy_norm": 1.0}


def test_accuracy_refuses_malformed_outputs_and_labels() -> None:
    spec = _choice_task()
    row = {"q": "?", "options": ["a", "b"], "label": 1}
    with pytest.raises(PermanentError, match="needs 2 log-likelihoods, got 3"):
        spec.score([0.0, 1.0, 2.0], row)
    with pytest.raises(PermanentError, match="got a log-likelihood nan"):
        spec.score([math.nan, 1.0], row)
    with pytest.raises(PermanentError, match="got a log-likelihood True"):
        spec.score([True, 1.0], row)
    with pytest.raises(InputError, match="label field 'label' = 2 is not a choice index"):
        spec.score([0.0, 1.0], {**row, "label": 2})
    with pytest.raises(InputError, match="label field 'label' = True is not a choice index"):
        spec.score([0.0, 1.0], {**row, "label": True})
    with pytest.raises(InputError, match="choices field 'options' is not a list of non-empty"):
        spec.continuations({**row, "options": ["a", ""]})
    with pytest.raises(PermanentError, match="scorer 'exact_match' scores text, got list"):
        task().score(["x"], {"answer": "x"})


def test_only_registered_scorers_can_be_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scorers, "_registry", dict(scorers._registry))
    with pytest.raises(InputError) as caught:
        scorer("__import__('os')")
    assert str(caught.value).startswith("unknown scorer '__import__('os')' (registered: ")

    @register_scorer("length-ok", metrics={"length_ok": (0.0, 1.0)})
    def length_ok(output: Any, row: Any, spec: TaskSpec) -> dict[str, float]:
        return {"length_ok": float(len(output) <= int(row[spec.target]))}

    assert "length-ok" in registered_scorers()
    assert task(scorer="length-ok").score("abc", {"answer": 3}) == {"length_ok": 1.0}
    assert scorer("length-ok").metrics == {"length_ok": (0.0, 1.0)}
    with pytest.raises(PluginError, match="invalid scorer name 'Bad Name'"):
        register_scorer("Bad Name")
    with pytest.raises(PluginError, match="declares unknown options: code"):
        register_scorer("fine", options=_CodeOptions)
    with pytest.raises(PluginError, match="scorer 'exact_match' is registered twice"):
        register_scorer("exact_match")(length_ok)


class _CodeOptions(ScorerOptions):
    code: str = ""


class _Near(ScorerOptions):
    tolerance: float = 0.5


def test_a_scorer_reads_its_options_typed_with_its_own_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each scorer declares its options as a model: the task's keys are validated against it
    when the task is registered, and the scorer reads them back typed, defaults filled in."""
    monkeypatch.setattr(scorers, "_registry", dict(scorers._registry))

    @register_scorer("near", metrics={"near": (0.0, 1.0)}, options=_Near)
    def near(output: Any, row: Any, spec: TaskSpec) -> dict[str, float]:
        gap = abs(float(output) - float(row[spec.target]))
        return {"near": float(gap <= spec.options(_Near).tolerance)}

    assert task(scorer="near").score("1.4", {"answer": "1"}) == {"near": 1.0}
    assert task(scorer="near", tolerance=0.1).score("1.4", {"answer": "1"}) == {"near": 0.0}
    assert task(scorer="numeric").options(NumericOptions).tolerance == 1e-6
    assert (
        refusal({"prompt": "x", "target": "y", "generate": {}, "scorer": "near", "pattern": "(a)"})
        == "'pattern' is not an option of scorer 'near'"
    )
    with pytest.raises(PluginError, match="scorer 'odd': options must be a ScorerOptions"):
        register_scorer("odd", options=dict)  # type: ignore[arg-type]


def test_every_builtin_metric_is_zero_or_one_in_a_unit_range() -> None:
    assert registered_scorers() == [
        "accuracy", "exact_match", "includes", "model_graded", "numeric", "regex",
    ]  # fmt: skip
    for name in registered_scorers():
        assert set(scorer(name).metrics.values()) == {(0.0, 1.0)}


JUDGE: dict[str, object] = {
    "model": "openai/judge", "model_args": {"base_url": "http://judge:8000/v1"},
}  # fmt: skip
GRADED: dict[str, object] = {
    "prompt": "What is {a} plus {b}?", "target": "answer", "generate": {},
    "scorer": "model_graded", "grader": JUDGE,
}  # fmt: skip


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"grader": None}, "'grader' goes with scorer 'model_graded', and only with it"),
        ({"scorer": "exact_match"}, "'grader' goes with scorer 'model_graded', and only with it"),
        (
            {"grader": {"model": "hf/org/judge"}},
            "a grader is an endpoint model: openai/<name> with base_url",
        ),
        (
            {"grader": {**JUDGE, "prompt": "{output} vs {answer}"}},
            "the grader's prompt uses 'answer': it may use input, output, target",
        ),
        (
            {"grader": {**JUDGE, "prompt": "{output.__class__}"}},
            "prompt field {output.__class__} is refused",
        ),
    ],
)
def test_a_graded_task_is_refused_in_one_line(change: dict[str, object], expected: str) -> None:
    with pytest.raises(InputError) as refused:
        TaskSpec.load({k: v for k, v in {**GRADED, **change}.items() if v is not None})
    assert str(refused.value).startswith(expected)


def test_the_grader_reads_the_prompt_output_and_target_and_its_last_verdict_counts() -> None:
    task = TaskSpec.load(GRADED)
    text = task.grader_text({"a": 1, "b": 2, "answer": "3"}, "three")
    assert "[Question]: What is 1 plus 2?" in text
    assert "[Expert answer]: 3" in text
    assert "[Submission]: three" in text
    row = {"answer": "3"}
    assert task.score("GRADE: I ... on reflection GRADE: C", row) == {"model_graded": 1.0}
    assert task.score("GRADE: C, no: GRADE: I", row) == {"model_graded": 0.0}
    assert task.score("it is right", row) == {"model_graded": 0.0}  # no verdict
