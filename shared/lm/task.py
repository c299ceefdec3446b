"""Language-model tasks written as YAML: how a dataset row becomes a prompt, how it is scored.

A task is data, never code. The prompt is a ``str.format`` template over the row's fields, but
only plain ``{field}`` names are accepted (``{a.__class__}``, ``{a[0]}``, ``{a!r}``, ``{a:>10}``
are refused: attribute and index access reach into Python objects), and rendering substitutes
``str(row[field])`` itself instead of calling ``str.format``. The scorer is a registered name
(:mod:`evalq.shared.lm.scorers`). The label fields (``target`` and ``labels``) are scrubbed before
inference, so a prompt may not use them: the only label text a prompt ever holds is the
answers of its few-shot examples, which is what few-shot examples are.

Prompts are laid out as lm-eval 0.4.13 lays them out, so results can be compared with it: each
few-shot example is its prompt, :data:`TARGET_DELIMITER`, its answer and
:data:`FEWSHOT_DELIMITER`, then the row's prompt; a multiple-choice continuation is
:data:`TARGET_DELIMITER` and the choice text.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import string
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Annotated, Any, Self, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    model_validator,
)

from evalq.shared.errors import InputError, first_line
from evalq.shared.lm.scorers import OPTIONS, Scorer, ScorerOptions, scorer
from evalq.shared.names import NAME_RULE, is_name

if TYPE_CHECKING:
    import yaml

__all__ = [
    "DEFAULT_GRADER_PROMPT",
    "FEWSHOT_DELIMITER",
    "GRADER_FIELDS",
    "TARGET_DELIMITER",
    "Fewshot",
    "Generate",
    "Grader",
    "TaskSpec",
    "fewshot_indices",
]

TARGET_DELIMITER = " "
"""Between a prompt and its answer (lm-eval's ``target_delimiter``)."""
FEWSHOT_DELIMITER = "\n\n"
"""After each few-shot example (lm-eval's ``fewshot_delimiter``)."""

_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
OptionsT = TypeVar("OptionsT", bound=ScorerOptions)

FieldName = Annotated[StrictStr, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_-]*$")]
Stop = Annotated[StrictStr, Field(min_length=1)]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Generate(_Spec):
    """How the model generates an answer (a ``generate`` task)."""

    max_new_tokens: StrictInt = Field(256, ge=1, le=4096)
    stop: tuple[Stop, ...] = ()
    """Generation ends at the first of these strings (cut from the output)."""
    temperature: StrictFloat = Field(0.0, ge=0)
    """0 is greedy decoding."""
    top_p: StrictFloat = Field(1.0, gt=0, le=1)


class Fewshot(_Spec):
    """Where few-shot examples come from: ``n`` rows of ``split`` (:func:`fewshot_indices`)."""

    split: StrictStr
    n: StrictInt = Field(ge=0, le=32)
    seed: StrictInt = 1234
    """lm-eval's default few-shot seed."""


GRADER_FIELDS = ("input", "output", "target")
"""What a grader's prompt may show: the row's prompt (no few-shot examples), the model's output
and the target's text."""

DEFAULT_GRADER_PROMPT = """You are comparing a submitted answer to an expert answer on a given \
question.

[Question]: {input}
[Expert answer]: {target}
[Submission]: {output}

Does the submission give the expert answer? Reply with GRADE: C if it does (correct) or \
GRADE: I if it does not (incorrect), and nothing else."""
"""After Inspect AI's ``model_graded_qa``: the verdict is the last ``GRADE: C`` or ``GRADE: I``
of the grader's answer (:func:`evalq.shared.lm.scorers.model_graded`)."""


class Grader(_Spec):
    """The model that grades a ``model_graded`` task's outputs against their targets."""

    model: StrictStr
    """A ``--model``-style spec of an endpoint model (``openai/<name>``)."""
    model_args: dict[StrictStr, StrictStr] = {}
    """Its ``--model-arg`` pairs (``base_url``, ``api_key_env``, ``timeout``, ...)."""
    prompt: StrictStr = DEFAULT_GRADER_PROMPT
    """A template over :data:`GRADER_FIELDS`, plain ``{field}`` names only."""
    max_new_tokens: StrictInt = Field(64, ge=1, le=4096)

    @model_validator(mode="after")
    def _check(self) -> Self:
        from evalq.shared.lm.spec import ModelSpec

        unknown = [f for f in _template(self.prompt)[1] if f not in GRADER_FIELDS]
        if unknown:
            raise InputError(
                f"the grader's prompt uses '{unknown[0]}': it may use {', '.join(GRADER_FIELDS)}"
            )
        if ModelSpec.parse(self.model, self.model_args).endpoint is None:
            raise InputError("a grader is an endpoint model: openai/<name> with base_url")
        return self

    def text(self, values: Mapping[str, str]) -> str:
        """The grader's prompt filled with ``values`` (:data:`GRADER_FIELDS`)."""
        return "".join(
            literal + ("" if name is None else values[name])
            for literal, name in _template(self.prompt)[0]
        )


class TaskSpec(_Spec):
    """One task file, validated: a bad one is refused in one line naming the problem
    (:meth:`load`, :meth:`from_yaml`)."""

    prompt: StrictStr
    """``str.format`` template over the row's fields, plain ``{field}`` names only."""
    chat: StrictBool = False
    """Apply the model's chat template (:meth:`messages`)."""
    system: StrictStr | None = None
    """A system prompt, as is (not a template)."""
    target: FieldName
    """The label field scored against: an answer text, or the index of the right choice."""
    labels: tuple[FieldName, ...] = ()
    """More label fields, scrubbed before inference like the target."""
    generate: Generate | None = None
    choices: FieldName | None = None
    """The row field listing the choice texts (a multiple-choice task)."""
    scorer: StrictStr
    pattern: StrictStr | None = None
    """``regex``: a regular expression with one capture group, the answer."""
    tolerance: StrictFloat | None = Field(None, ge=0)
    """``numeric``: the largest absolute difference that still scores 1 (default 1e-6)."""
    fewshot: Fewshot | None = None
    grader: Grader | None = None
    """``model_graded``: the model that grades each output against its target."""

    @model_validator(mode="after")
    def _check(self) -> Self:
        fields = _template(self.prompt)[1]
        if (self.grader is not None) != (self.scorer == "model_graded"):
            raise InputError("'grader' goes with scorer 'model_graded', and only with it")
        if (self.generate is None) == (self.choices is None):
            raise InputError("a task has either 'generate' or 'choices' (not both, not neither)")
        if self.pattern is not None:
            _compile(self.pattern)
        for name in fields:
            if name in self.label_fields:
                raise InputError(f"the prompt uses label field '{name}'")
        if self.choices is not None and self.choices in self.label_fields:
            raise InputError(
                f"choices field '{self.choices}' is a label field (it is scrubbed before "
                "inference, which needs the choices)"
            )
        if self.fewshot is not None and not is_name(self.fewshot.split):
            raise InputError(f"invalid fewshot split {self.fewshot.split!r}: use {NAME_RULE}")
        return self

    def check_scorer(self) -> Self:
        """The task, checked against the scorers this process registered: its scorer exists,
        scores what the task produces (choices or generated text) and gets the options it
        takes and needs; :class:`InputError` in one line otherwise.

        Validating a task (:meth:`model_validate`) checks only what the task itself says: a
        task read back from Redis or from the gateway is data, whatever plugins the reading
        process loaded. Where a task is registered (:meth:`load`) or a run of it is submitted,
        this check runs with the plugins of that process."""
        found = scorer(self.scorer)
        if found.choices and self.choices is None:
            raise InputError(f"scorer '{self.scorer}' scores choices: it needs 'choices'")
        if not found.choices and self.generate is None:
            raise InputError(f"scorer '{self.scorer}' scores generated text: it needs 'generate'")
        self.options(found.options)
        return self

    def options(self, model: type[OptionsT]) -> OptionsT:
        """The task's options (its keys of :data:`evalq.shared.lm.scorers.OPTIONS` it sets)
        as the scorer's ``model`` types them, defaults filled in; :class:`InputError` in one
        line for a key the scorer does not take, one it needs and the task lacks, or a value
        that is not of its type."""
        given = {k: getattr(self, k) for k in sorted(OPTIONS) if getattr(self, k) is not None}
        try:
            return model.model_validate(given)
        except ValidationError as exc:
            first = exc.errors()[0]
            key = str(first["loc"][0]) if first["loc"] else "?"
            if first["type"] == "extra_forbidden":
                raise InputError(f"'{key}' is not an option of scorer '{self.scorer}'") from None
            if first["type"] == "missing":
                raise InputError(f"scorer '{self.scorer}' needs '{key}'") from None
            raise InputError(
                f"option '{key}' = {given.get(key)!r} of scorer '{self.scorer}': {first['msg']}"
            ) from None

    @classmethod
    def load(cls, data: object) -> TaskSpec:
        """A task from its parsed file, checked against the registered scorers
        (:meth:`check_scorer`); :class:`InputError` in one line naming the problem."""
        if not isinstance(data, Mapping):
            raise InputError(
                f"a task is a mapping of keys (prompt, target, ...), got {type(data).__name__}"
            )
        try:
            spec = cls.model_validate(dict(data))
        except ValidationError as exc:
            raise InputError(_problem(exc)) from None
        return spec.check_scorer()

    @classmethod
    def from_yaml(cls, text: str) -> TaskSpec:
        """A task from the text of its YAML file (``yaml.safe_load``: no tags, no objects)."""
        import yaml  # here, not with the module: the access rules import TaskSpec, every CLI start

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise InputError(f"task file is not valid YAML: {_yaml_problem(exc)}") from None
        return cls.load(data)

    @property
    def label_fields(self) -> tuple[str, ...]:
        """The fields scrubbed before inference: the target, then ``labels``."""
        return (self.target, *(f for f in self.labels if f != self.target))

    @property
    def fields(self) -> tuple[str, ...]:
        """The row fields the prompt uses, in order of first use."""
        return _template(self.prompt)[1]

    @property
    def scorer_spec(self) -> Scorer:
        """The registered scorer (its metrics' ranges, what it scores)."""
        return scorer(self.scorer)

    @property
    def digest(self) -> str:
        """sha256 of the task's canonical JSON (defaults written out, keys sorted): the same
        for two files that say the same thing, whatever their layout or comments."""
        canonical = json.dumps(
            self.model_dump(mode="json"),
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
        )
        return hashlib.sha256(canonical.encode()).hexdigest()

    def compiled_pattern(self) -> re.Pattern[str]:
        """``pattern`` compiled (once per process); :class:`InputError` when it is not set."""
        if self.pattern is None:
            raise InputError(f"scorer '{self.scorer}' needs 'pattern'")
        return _compile(self.pattern)

    def fill(self, row: Mapping[str, Any], what: str = "the row") -> str:
        """The prompt template filled from ``row`` (no few-shot examples)."""
        pieces = []
        for literal, name in _template(self.prompt)[0]:
            pieces.append(literal)
            if name is not None:
                if name not in row:
                    raise InputError(f"{what} has no field '{name}' (the prompt uses it)")
                pieces.append(str(row[name]))
        return "".join(pieces)

    def render(self, row: Mapping[str, Any], examples: Sequence[Mapping[str, Any]] = ()) -> str:
        """The prompt text: each few-shot example (a full row) as its prompt, the target
        delimiter, its answer (:meth:`answer`) and the few-shot delimiter, then ``row``'s
        prompt. ``row`` may be scrubbed: no label field of it is read."""
        shots = [
            self.fill(ex, f"few-shot example {i}") + TARGET_DELIMITER + self.answer(ex)
            for i, ex in enumerate(examples)
        ]
        return "".join(shot + FEWSHOT_DELIMITER for shot in shots) + self.fill(row)

    def text(self, row: Mapping[str, Any], examples: Sequence[Mapping[str, Any]] = ()) -> str:
        """The prompt without a chat template: the system prompt, when set, directly before
        :meth:`render` (lm-eval 0.4.13 joins them with no delimiter)."""
        return (self.system or "") + self.render(row, examples)

    def label(self, row: Mapping[str, Any]) -> Any:
        """The target value of a full row; :class:`InputError` when the row lacks it."""
        if self.target not in row:
            raise InputError(f"the row has no label field '{self.target}'")
        return row[self.target]

    def target_problem(self, row: Mapping[str, Any]) -> tuple[str, Any] | None:
        """What keeps a full row from being scored, before any work is done: its choices field
        (a ``choices`` task), its target's presence, and the scorer's declared target check
        (:attr:`evalq.shared.lm.scorers.Scorer.target`: ``numeric`` needs a number). None when
        it can be scored; else the problem, in words that hold no value of the row, and the
        value at fault (the caller shows it only to whoever may read the row)."""
        if self.choices is not None:
            try:
                self.choice_texts(row)
            except InputError:
                return (
                    f"choices field '{self.choices}' is not a list of non-empty strings",
                    row.get(self.choices),
                )
        if self.target not in row:
            return f"has no label field '{self.target}'", None
        check = self.scorer_spec.target
        problem = None if check is None else check(row, self)
        if problem is None:
            return None
        return f"label field '{self.target}' {problem} (scorer '{self.scorer}')", row[self.target]

    def answer(self, row: Mapping[str, Any]) -> str:
        """A full row's answer as a few-shot example shows it: the target's text (the first
        of a list, as lm-eval), or for a multiple-choice task the right choice's text."""
        if self.choices is not None:
            return self.choice_texts(row)[self.gold_index(row)]
        value = self.label(row)
        if isinstance(value, list | tuple):
            if not value:
                raise InputError(f"label field '{self.target}' is an empty list")
            value = value[0]
        return str(value)

    def choice_texts(self, row: Mapping[str, Any]) -> list[str]:
        """The row's choice texts (a non-empty list of non-empty strings)."""
        if self.choices is None:
            raise InputError("the task has no 'choices'")
        if self.choices not in row:
            raise InputError(f"the row has no choices field '{self.choices}'")
        value = row[self.choices]
        if (
            not isinstance(value, list | tuple)
            or not value
            or not all(isinstance(c, str) and c for c in value)
        ):
            raise InputError(
                f"choices field '{self.choices}' is not a list of non-empty strings: "
                f"{_short(value)}"
            )
        return list(value)

    def continuations(self, row: Mapping[str, Any]) -> list[str]:
        """What the model scores after the prompt, one per choice: the target delimiter and
        the choice text (lm-eval's multiple-choice requests)."""
        return [TARGET_DELIMITER + choice for choice in self.choice_texts(row)]

    def gold_index(self, row: Mapping[str, Any]) -> int:
        """The index of the right choice: the target as an index, or (as lm-eval) a target
        text that is one of the choices."""
        choices = self.choice_texts(row)
        value = self.label(row)
        if isinstance(value, str) and value in choices:
            return choices.index(value)
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(choices):
            return value
        raise InputError(
            f"label field '{self.target}' = {_short(value)} is not a choice index "
            f"(0 to {len(choices) - 1}) nor a choice"
        )

    def score(self, output: Any, row: Mapping[str, Any]) -> dict[str, float]:
        """The scorer's metrics for one output and its full row (for ``model_graded``, the
        output is the grader's answer)."""
        return self.scorer_spec.fn(output, row, self)

    def grader_text(self, row: Mapping[str, Any], output: Any) -> str:
        """What the grader reads for a full row and the model's output."""
        if self.grader is None:
            raise InputError(f"scorer '{self.scorer}' has no grader")
        values = {"input": self.fill(row), "output": str(output), "target": self.answer(row)}
        return self.grader.text(values)


def fewshot_indices(n_rows: int, n: int, seed: int, *, exclude: int | None = None) -> list[int]:
    """Which ``n`` of ``n_rows`` rows are the few-shot examples, in the order shown.

    The same arguments give the same list on every machine and Python version: a partial
    Fisher-Yates shuffle of ``range(n_rows)`` driven only by ``random.Random(seed).random()``,
    whose sequence Python guarantees (``Random.sample`` carries no such promise). Every sample
    of a run gets the same examples, whatever order workers take samples in (lm-eval draws
    anew for each document from one generator, which depends on that order). ``exclude`` is
    a row never chosen: the evaluated row, when examples come from its own split.
    """
    if n_rows < 0 or n < 0:
        raise InputError(f"few-shot needs counts of 0 or more, got n_rows={n_rows}, n={n}")
    skip = exclude if exclude is not None and 0 <= exclude < n_rows else None
    size = n_rows - (skip is not None)
    if n > size:
        raise InputError(f"few-shot needs {n} example rows, the split has {size}")
    rng = random.Random(seed)
    moved: dict[int, int] = {}
    chosen = []
    for i in range(n):
        j = i + int(rng.random() * (size - i))
        picked = moved.get(j, j)
        moved[j] = moved.get(i, i)
        chosen.append(picked)
    return [p + 1 if skip is not None and p >= skip else p for p in chosen]


Pieces = tuple[tuple[str, str | None], ...]


@lru_cache(maxsize=256)
def _template(prompt: str) -> tuple[Pieces, tuple[str, ...]]:
    """The template as (literal text, field or None) pieces and its fields; only plain
    ``{name}`` fields pass."""
    try:
        parsed = list(string.Formatter().parse(prompt))
    except ValueError as exc:
        raise InputError(f"prompt is not a valid template: {exc}") from None
    pieces: list[tuple[str, str | None]] = []
    fields: list[str] = []
    for literal, name, spec, conversion in parsed:
        if name is None:
            pieces.append((literal, None))
            continue
        shown = "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "")
        if not _FIELD.fullmatch(name) or conversion or spec:
            raise InputError(
                f"prompt field {shown}}} is refused: use plain {{field}} names (no attribute, "
                "index, conversion or format spec)"
            )
        pieces.append((literal, name))
        if name not in fields:
            fields.append(name)
    return tuple(pieces), tuple(fields)


@lru_cache(maxsize=64)
def _compile(pattern: str) -> re.Pattern[str]:
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise InputError(f"pattern {pattern!r} is not a valid regular expression: {exc}") from None
    if compiled.groups != 1:
        raise InputError(
            f"pattern {pattern!r} has {compiled.groups} capture groups; it needs exactly 1 "
            "(the answer; use (?:...) for the others)"
        )
    return compiled


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _problem(exc: ValidationError) -> str:
    """One line for the first problem pydantic found."""
    first = exc.errors()[0]
    loc = [str(part) for part in first["loc"]]
    where = ".".join(loc)
    if first["type"] == "extra_forbidden":
        model: type[BaseModel] = TaskSpec
        if loc[:1] == ["generate"]:
            model = Generate
        elif loc[:1] == ["fewshot"]:
            model = Fewshot
        allowed = ", ".join(model.model_fields)
        return f"unknown key '{where}' (allowed: {allowed})"
    if first["type"] == "missing":
        return f"task needs '{where}'"
    message = first_line(ValueError(first["msg"]))
    return f"task key '{where}' = {_short(first.get('input'))}: {message}"


def _yaml_problem(exc: yaml.YAMLError) -> str:
    problem = getattr(exc, "problem", None) or first_line(exc)
    mark = getattr(exc, "problem_mark", None)
    return f"{problem} (line {mark.line + 1})" if mark is not None else str(problem)
