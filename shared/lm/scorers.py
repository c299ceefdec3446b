"""Scorers of language-model tasks: the built-ins, and the registry of Python ones.

A task file names its scorer and never carries code: the name is looked up here, and a name
nobody registered is refused (:func:`scorer`). A scorer is called as ``fn(output, row, task)``
with the model's output (generated text, or for a ``choices`` task one log-likelihood per
choice), the full row (labels included) and the :class:`~evalq.shared.lm.task.TaskSpec`; it returns
``{metric: value}``. Options (``pattern``, ``tolerance``) are the task's own keys; each scorer
declares the ones it takes as a pydantic model (:class:`ScorerOptions`: a field without a
default is needed), which the task's keys are validated against when it is registered and which
the scorer reads them through, typed and with their defaults
(:meth:`evalq.shared.lm.task.TaskSpec.options`). Nothing from the task is evaluated as code.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictStr

from evalq.shared.errors import InputError, PermanentError, PluginError
from evalq.shared.names import PLUGIN_NAME

if TYPE_CHECKING:
    from evalq.shared.lm.task import TaskSpec

__all__ = [
    "OPTIONS",
    "NumericOptions",
    "RegexOptions",
    "ScoreFn",
    "Scorer",
    "ScorerOptions",
    "TargetCheck",
    "last_number",
    "model_graded",
    "register_scorer",
    "registered_scorers",
    "scorer",
]

ScoreFn = Callable[[Any, Mapping[str, Any], "TaskSpec"], dict[str, float]]
TargetCheck = Callable[[Mapping[str, Any], "TaskSpec"], str | None]
"""A scorer's declared check of a full row's target, run on every sample before a run starts
(:meth:`evalq.shared.lm.task.TaskSpec.target_problem`): what is wrong with the target for this
scorer (``"is not a number"``), or None when it can be scored."""
F = TypeVar("F", bound=ScoreFn)

OPTIONS = frozenset({"pattern", "tolerance"})
"""The task keys a scorer may read besides the row: ``pattern`` (regex), ``tolerance``."""

_UNIT = (0.0, 1.0)


class ScorerOptions(BaseModel):
    """The options a scorer takes (subclass it, one field per option of :data:`OPTIONS` with
    its type, and its default unless the scorer needs it); the base takes none."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class RegexOptions(ScorerOptions):
    """``regex``'s: the pattern (one capture group: checked with the task)."""

    pattern: StrictStr


class NumericOptions(ScorerOptions):
    """``numeric``'s: the largest absolute difference that still scores 1."""

    tolerance: StrictFloat = Field(default=1e-6, ge=0)


@dataclass(frozen=True)
class Scorer:
    """A registered scorer and what a task using it must look like."""

    name: str
    fn: ScoreFn
    choices: bool = False
    """Scores per-choice log-likelihoods (a ``choices`` task), not generated text."""
    metrics: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    """The metrics' ``(low, high)`` ranges (an Evaluation's ``metric_ranges``)."""
    options: type[ScorerOptions] = ScorerOptions
    """The options (of :data:`OPTIONS`) a task may set for it, typed; those without a default
    it must set."""
    target: TargetCheck | None = None
    """What it needs of a row's target beyond its presence (a number, a choice), checked on
    every sample before any work (None: any value present)."""


_registry: dict[str, Scorer] = {}


def register_scorer(
    name: str,
    *,
    choices: bool = False,
    metrics: Mapping[str, tuple[float, float]] | None = None,
    options: type[ScorerOptions] = ScorerOptions,
    target: TargetCheck | None = None,
) -> Callable[[F], F]:
    """Decorator: make ``fn(output, row, task) -> dict[str, float]`` the scorer ``name``
    (named like an evaluation). ``choices`` marks a scorer of multiple-choice log-likelihoods;
    ``options`` is the model of the task keys it takes (:class:`ScorerOptions`), read back
    with ``task.options(model)``; ``target`` checks a row's target before a run starts
    (:data:`TargetCheck`), so a target it cannot score is refused at submit instead of failing
    every sample after inference."""
    if not PLUGIN_NAME.match(name):
        raise PluginError(f"invalid scorer name {name!r}")
    if not (isinstance(options, type) and issubclass(options, ScorerOptions)):
        raise PluginError(f"scorer {name!r}: options must be a ScorerOptions subclass")
    unknown = ", ".join(sorted(set(options.model_fields) - OPTIONS))
    if unknown:
        raise PluginError(f"scorer {name!r} declares unknown options: {unknown}")

    def decorate(fn: F) -> F:
        current = _registry.get(name)
        if current is not None and current.fn.__qualname__ != fn.__qualname__:
            raise PluginError(f"scorer {name!r} is registered twice")
        _registry[name] = Scorer(name, fn, choices, dict(metrics or {}), options, target)
        return fn

    return decorate


def registered_scorers() -> list[str]:
    """Names of the registered scorers."""
    return sorted(_registry)


def scorer(name: str) -> Scorer:
    """The scorer registered as ``name``; :class:`InputError` listing the registered ones
    otherwise (a task can only name code someone registered)."""
    found = _registry.get(name)
    if found is None:
        listed = ", ".join(registered_scorers()) or "none"
        raise InputError(f"unknown scorer '{name}' (registered: {listed})")
    return found


def _text(output: Any, name: str) -> str:
    if not isinstance(output, str):
        raise PermanentError(f"scorer '{name}' scores text, got {type(output).__name__}")
    return output


def _golds(row: Mapping[str, Any], task: TaskSpec) -> list[str]:
    """The target's text, stripped; a list target (several right answers, as lm-eval's
    multiple targets) gives each."""
    value = task.label(row)
    values = value if isinstance(value, list | tuple) else [value]
    return [str(v).strip() for v in values]


@register_scorer("exact_match", metrics={"exact_match": _UNIT})
def exact_match(output: Any, row: Mapping[str, Any], task: TaskSpec) -> dict[str, float]:
    """1 when the stripped output equals the stripped target text."""
    text = _text(output, "exact_match").strip()
    return {"exact_match": float(text in _golds(row, task))}


def _not_empty(row: Mapping[str, Any], task: TaskSpec) -> str | None:
    return "is empty (it is in every output)" if "" in _golds(row, task) else None


@register_scorer("includes", metrics={"includes": _UNIT}, target=_not_empty)
def includes(output: Any, row: Mapping[str, Any], task: TaskSpec) -> dict[str, float]:
    """1 when the target text appears in the output; an empty target is refused (it would
    be in every output)."""
    text = _text(output, "includes")
    golds = _golds(row, task)
    if "" in golds:
        raise InputError(f"label field '{task.target}' is empty: it is in every output")
    return {"includes": float(any(gold in text for gold in golds))}


@register_scorer("regex", metrics={"regex": _UNIT}, options=RegexOptions)
def regex(output: Any, row: Mapping[str, Any], task: TaskSpec) -> dict[str, float]:
    """1 when the first capture group of the task's ``pattern`` at its first match in the
    output, stripped, equals the target text; no match (or an unmatched group) scores 0."""
    text = _text(output, "regex")
    found = task.compiled_pattern().search(text)
    answer = found.group(1) if found is not None else None
    return {"regex": float(answer is not None and answer.strip() in _golds(row, task))}


_NUMBER = re.compile(
    r"(?:(?<![\w.])[-+])?"  # a sign, unless it joins two numbers ("10-12")
    r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?"  # 1,234.5  42  1e3
    r"|(?:(?<![\w.])[-+])?\.\d+(?:[eE][-+]?\d+)?"  # .5
)


def last_number(text: str) -> float | None:
    """The last number written in ``text`` (thousands commas, a sign, decimals, an exponent),
    or None: how ``numeric`` reads an answer (``"The answer is 1,234."`` is 1234.0)."""
    found = _NUMBER.findall(text)
    if not found:
        return None
    value = float(found[-1].replace(",", ""))
    return value if math.isfinite(value) else None


def _a_number(row: Mapping[str, Any], task: TaskSpec) -> str | None:
    if any(_NUMBER.fullmatch(gold) is None for gold in _golds(row, task)):
        return "is not a number"
    return None


@register_scorer("numeric", metrics={"numeric": _UNIT}, options=NumericOptions, target=_a_number)
def numeric(output: Any, row: Mapping[str, Any], task: TaskSpec) -> dict[str, float]:
    """1 when the last number in the output is within the task's ``tolerance`` (absolute,
    default 1e-6) of the target; an output without a number scores 0."""
    answer = last_number(_text(output, "numeric"))
    tolerance = task.options(NumericOptions).tolerance
    targets = []
    for gold in _golds(row, task):
        target = last_number(gold)
        if target is None or _a_number(row, task) is not None:
            raise InputError(f"label field '{task.target}' is not a number: {gold!r}")
        targets.append(target)
    hit = answer is not None and any(abs(answer - t) <= tolerance for t in targets)
    return {"numeric": float(hit)}


def _loglikelihoods(output: Any, n: int) -> list[float]:
    if not isinstance(output, list | tuple) or len(output) != n:
        got = len(output) if isinstance(output, list | tuple) else type(output).__name__
        raise PermanentError(f"scorer 'accuracy' needs {n} log-likelihoods, got {got}")
    values = []
    for value in output:
        if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
            raise PermanentError(f"scorer 'accuracy' got a log-likelihood {value!r}")
        values.append(float(value))
    return values


def _argmax(values: Sequence[float]) -> int:
    """The first index of the largest value (numpy's argmax, which lm-eval uses)."""
    return max(range(len(values)), key=values.__getitem__)


def _a_choice(row: Mapping[str, Any], task: TaskSpec) -> str | None:
    choices = task.choice_texts(row)
    try:
        task.gold_index(row)
    except InputError:  # its words hold the target's value: the caller shows it or not
        return f"is not a choice index (0 to {len(choices) - 1}) nor a choice"
    return None


@register_scorer(
    "accuracy",
    choices=True,
    metrics={"accuracy": _UNIT, "accuracy_norm": _UNIT},
    target=_a_choice,
)
def accuracy(output: Any, row: Mapping[str, Any], task: TaskSpec) -> dict[str, float]:
    """lm-eval's ``acc`` and ``acc_norm``: whether the choice of highest log-likelihood is
    the target, and the same with each log-likelihood divided by its choice's length in
    characters (the choice text, without the delimiter before it)."""
    choices = task.choice_texts(row)
    lls = _loglikelihoods(output, len(choices))
    gold = task.gold_index(row)
    pred = _argmax(lls)
    pred_norm = _argmax([ll / len(c) for ll, c in zip(lls, choices, strict=True)])
    return {"accuracy": float(pred == gold), "accuracy_norm": float(pred_norm == gold)}


_VERDICT = re.compile(r"GRADE\s*:\s*([CI])\b")


@register_scorer("model_graded", metrics={"model_graded": _UNIT})
def model_graded(output: Any, row: Mapping[str, Any], task: TaskSpec) -> dict[str, float]:
    """1 when the grader's answer (the task's ``grader`` read the output and the target)
    ends its verdict ``GRADE: C``; ``GRADE: I``, or no verdict, scores 0."""
    found = _VERDICT.findall(_text(output, "model_graded"))
    return {"model_graded": float(bool(found) and found[-1] == "C")}
