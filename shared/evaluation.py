"""The Evaluation plugin API: what a user writes, and the registry workers and producers share.

Plugins are imported by module name from ``EVALQ_PLUGINS`` at start-up, never from a message; a
message names an evaluation only by its registered name.

An :class:`Evaluation` is ``load``/``infer``/``score``/``aggregate`` and declared metadata; what a
worker asks of an evaluation beyond that (samples' ids at inference, a grader, its warm model's
key, provenance) is its task kind's business (:mod:`evalq.shared.kinds`).
"""

from __future__ import annotations

import importlib
import json
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from statistics import fmean
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from evalq.shared.errors import (
    ParamError,
    PayloadError,
    PermanentError,
    PluginError,
    UnknownEvalError,
)
from evalq.shared.failures import FailurePolicy, FailureRule
from evalq.shared.names import PLUGIN_NAME
from evalq.shared.scorer import ScriptCall, ScriptScorer, run_cold
from evalq.shared.source import SourceFile, snapshot

__all__ = [
    "Evaluation",
    "Parameters",
    "checked_outputs",
    "checked_scores",
    "create",
    "every_label_field",
    "failure_rule",
    "label_fields",
    "load_plugins",
    "lower_is_better",
    "model_key",
    "register",
    "registered",
    "scrub",
    "source",
]

BUILTIN_PLUGINS = ("evalq.shared.evals",)
_registry: dict[str, type[Evaluation]] = {}
_sources: dict[str, SourceFile | None] = {}

E = TypeVar("E", bound="type[Evaluation]")


class Parameters(BaseModel):
    """What an evaluation's ``--param k=v`` may be: subclass it inside the evaluation as
    ``Params``, one field per parameter with its type and default (a field without a default
    is required). Values arrive as text and are converted (``"0.1"`` to a float, ``"1"`` or
    ``"true"`` to a bool); an undeclared name, or a value that is not of its type, is refused
    before anything is charged. An evaluation that declares nothing takes no parameter."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @classmethod
    def described(cls) -> str:
        """``tolerance (float, default 1e-06), text_field (str, default 'text')``, or ``none``."""
        parts = []
        for name, field in cls.model_fields.items():
            kind = getattr(field.annotation, "__name__", str(field.annotation))
            default = "required" if field.is_required() else f"default {field.default!r}"
            parts.append(f"{name} ({kind}, {default})")
        return ", ".join(parts) or "none"


class Evaluation(ABC):
    """Base class of an evaluation: a model, how to run it on rows, and how to score it.

    ``load`` runs once per worker process and model; ``infer`` gets a batch of rows with every
    field in ``label_fields`` removed; ``score`` gets one full row, labels included.

    An evaluation that scores with a script sets ``scorer`` and implements ``script_call``
    (and ``script_score`` when the answer is not one number) instead of ``score``: workers then
    run the script in warm sandboxed subprocesses.
    """

    name: str = ""
    """The registered name (set by :func:`register`)."""
    label_fields: tuple[str, ...] = ()
    scorer: ClassVar[ScriptScorer | None] = None
    isolated: ClassVar[bool] = False
    """Run ``infer()`` in a warm subprocess of its own that only ever receives label-free rows
    (for models that run code the caller controls); ``EVALQ_ISOLATE_INFERENCE`` does it for
    every evaluation. Rows and outputs then cross a pipe as JSON."""
    model_files: ClassVar[tuple[str, ...]] = ()
    """Absolute paths (files or folders) an isolated model's sandbox may read besides the
    Python installation and the plugins: the model's weights when they live elsewhere (a
    Hugging Face cache folder holds datasets too, so name the model's own folder). Fixed in
    the plugin's code, never taken from ``params``, which the caller chooses."""
    lower_is_better: ClassVar[frozenset[str]] = frozenset()
    """Metrics where less is better (a loss, an error rate); every other one, more is."""
    metric_ranges: Mapping[str, tuple[float, float]] = {}
    """Metrics' ``(low, high)`` ranges: a failed sample scores the end on the metric's bad
    side, and error bars stay inside. An undeclared metric whose scores are all 0 or 1 is
    taken as ``(0, 1)``; any other undeclared one has no range (a failed sample then scores
    the worst value the run scored). A ``score()`` outside its metric's declared range is a
    failed sample (stage ``score``), so no mean leaves the range."""
    on_failure: ClassVar[FailurePolicy] = FailurePolicy.WORST
    """What a failed sample counts as in every metric (:mod:`evalq.shared.failures`): its worst
    value, or ``FailurePolicy.SKIP`` to leave failed samples out (the count is then shown
    beside each metric)."""
    output_kind: str | None = None
    """What ``infer()``'s outputs are, as a name evaluations share (``"topic-label"``): a run
    may be rescored (``evalq rescore``) with any evaluation of the same kind, and only then."""
    cluster_field: ClassVar[str | None] = None
    """A row field grouping samples that are not independent (questions about one passage):
    error bars are then cluster-robust (:mod:`evalq.shared.stats`)."""
    rows_per_call: int | None = None
    """Most rows one ``infer()`` call takes; None: the worker's ``EVALQ_MAX_BATCH``. A model
    that holds nothing per row (an endpoint's requests, bounded by its own concurrency) takes
    a whole message at once, so no batch's last wave leaves requests idle."""

    Params: ClassVar[type[Parameters]] = Parameters
    """The declared parameters (a :class:`Parameters` subclass); the base declares none."""
    args: Parameters
    """This instance's parameters, typed and with their defaults (annotate ``args: Params``
    in an evaluation that declares some)."""

    def __init__(self, **params: str) -> None:
        self.params: dict[str, str] = dict(params)
        """The parameters as given (text), as the run's record keeps them."""
        self.args = self.check(params, self.name)

    @classmethod
    def check(cls, params: Mapping[str, str], name: str | None = None) -> Parameters:
        """``params`` validated against :attr:`Params`; :class:`ParamError` (exit 2) naming
        the first problem and the evaluation (``name``, by default the class's) otherwise."""
        try:
            return cls.Params.model_validate(dict(params))
        except ValidationError as exc:
            raise ParamError(_param_problem(name or cls.name, cls.Params, exc)) from None

    def load(self, device: str) -> Any:
        """Load and return the model on ``device``; called once per worker process."""
        return None

    @abstractmethod
    def infer(self, model: Any, rows: list[dict[str, Any]]) -> list[Any]:
        """Run the model on a batch of label-free rows; one JSON-able output per row."""

    def score(self, row: dict[str, Any], output: Any) -> dict[str, float]:
        """Score one output against its full row (for a script scorer: one cold run of it)."""
        if self.scorer is None:
            raise NotImplementedError(f"{type(self).__name__} defines neither score() nor scorer")
        return self.script_score(run_cold(self.scorer, self.script_call(row, output)))

    def script_call(self, row: dict[str, Any], output: Any) -> ScriptCall:
        """The scorer script's arguments (and extra environment) for one full row and output."""
        raise NotImplementedError(f"{type(self).__name__} has a scorer but no script_call()")

    def script_score(self, answer: str) -> dict[str, float]:
        """Metrics from what the scorer script returned; by default ``{"score": float(answer)}``."""
        return {"score": float(answer)}

    def clusters(self, rows: Mapping[int, Mapping[str, Any]]) -> dict[int, str] | None:
        """Each sample's cluster (its row's ``cluster_field``; a row without one is a cluster
        of its own), or None when the evaluation declares no cluster field."""
        field = self.cluster_field
        if field is None:
            return None
        return {i: str(row[field]) if field in row else f"#{i}" for i, row in rows.items()}

    def failure_rule(self) -> FailureRule:
        """How this evaluation's failed samples count
        (:func:`evalq.shared.failures.metric_samples`)."""
        return _failure_rule(self)

    @classmethod
    def custom_aggregate(cls) -> bool:
        """Whether ``aggregate()`` is the evaluation's own, not the mean of each metric (its
        error bars are then bootstrapped)."""
        return cls.aggregate is not Evaluation.aggregate

    def aggregate(self, scores: list[dict[str, float]]) -> dict[str, float]:
        """Reduce per-sample metrics to run metrics; by default the mean of each metric."""
        names = sorted(set[str]().union(*scores))
        return {n: fmean([s[n] for s in scores if n in s]) for n in names}


def checked_outputs(outputs: object, expected: int) -> list[Any]:
    """``infer()``'s answer for ``expected`` rows: a list of one output per row;
    :class:`PermanentError` otherwise."""
    if not isinstance(outputs, list) or len(outputs) != expected:
        got = len(outputs) if isinstance(outputs, list) else type(outputs).__name__
        raise PermanentError(f"infer() returned {got} outputs for {expected} rows")
    return outputs


def checked_scores(scores: object, ranges: Mapping[str, tuple[float, float]]) -> dict[str, float]:
    """``score()``'s answer as metric -> float; :class:`PermanentError` (a failed sample) for
    anything else, for a value that is not finite, or one outside its declared range
    (``Evaluation.metric_ranges``: the interval is clipped to it)."""
    if not isinstance(scores, dict) or not scores:
        raise PermanentError(f"score() returned {type(scores).__name__}, not a dict of metrics")
    checked: dict[str, float] = {}
    for name, value in scores.items():
        if (
            not isinstance(name, str)
            or isinstance(value, bool)
            or not isinstance(value, int | float)
        ):
            raise PermanentError(f"score() metric {name!r} is not a number")
        if not math.isfinite(value):
            raise PermanentError(f"score() metric {name!r} is {value}")
        low, high = ranges.get(name, (-math.inf, math.inf))
        if not low <= value <= high:
            raise PermanentError(
                f"score() metric {name!r} is {value}, outside its declared range [{low}, {high}]"
            )
        checked[name] = float(value)
    return checked


def model_key(name: str, params: Mapping[str, str]) -> str:
    """The warm model of a Python evaluation's run: its name and parameters."""
    return f"{name}:{json.dumps(dict(params), sort_keys=True)}"


def _failure_rule(declared: Evaluation | type[Evaluation]) -> FailureRule:
    """The failure rule an evaluation (or its class) declares."""
    return FailureRule(declared.on_failure, dict(declared.metric_ranges), declared.lower_is_better)


def _param_problem(name: str, params: type[Parameters], exc: ValidationError) -> str:
    first = exc.errors()[0]
    key = str(first["loc"][0]) if first["loc"] else ""
    declared = params.described()
    if first["type"] == "extra_forbidden":
        if not params.model_fields:
            return f"evaluation '{name}' takes no parameters, got '{key}'"
        return f"evaluation '{name}' has no parameter '{key}' (its parameters: {declared})"
    if first["type"] == "missing":
        return f"evaluation '{name}' needs parameter '{key}' (its parameters: {declared})"
    return (
        f"evaluation '{name}' parameter '{key}' = {first.get('input')!r}: {first['msg']} "
        f"(its parameters: {declared})"
    )


def register(name: str) -> Callable[[E], E]:
    """Class decorator: make an :class:`Evaluation` subclass available under ``name``."""
    if not PLUGIN_NAME.match(name):
        raise PluginError(f"invalid evaluation name {name!r}")

    def decorate(cls: E) -> E:
        if not (isinstance(cls, type) and issubclass(cls, Evaluation)):
            raise PluginError(f"@register({name!r}) needs an Evaluation subclass")
        current = _registry.get(name)
        if current is not None and current.__qualname__ != cls.__qualname__:
            raise PluginError(f"evaluation {name!r} is registered twice")
        cls.name = name
        if _registry.get(name) is not cls:
            _sources[name] = snapshot(name, cls)
        _registry[name] = cls
        return cls

    return decorate


def load_plugins(modules: Iterable[str]) -> None:
    """Import the built-in evaluations and every module in ``modules`` (from settings only)."""
    for module in (*BUILTIN_PLUGINS, *modules):
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise PluginError(f"cannot import plugin module {module!r}: {exc}") from exc


def registered() -> list[str]:
    """Names of the registered evaluations."""
    return sorted(_registry)


def label_fields(name: str) -> tuple[str, ...]:
    """The label fields of evaluation ``name``, scrubbed before ``infer()`` (none for an unknown
    name)."""
    cls = _registry.get(name)
    return cls.label_fields if cls is not None else ()


def every_label_field() -> frozenset[str]:
    """Every label field of every evaluation this process loaded: a field one evaluation calls
    a label is a label of any split it is in, whichever evaluation runs
    (:class:`evalq.shared.store.labels.LabelFields`)."""
    return frozenset(field for cls in _registry.values() for field in cls.label_fields)


def source(name: str) -> SourceFile | None:
    """The source file of evaluation ``name`` with the sha256 it had when this process loaded
    it (None for an unknown name, or a class without a source file)."""
    return _sources.get(name)


def lower_is_better(name: str) -> frozenset[str]:
    """The metrics of evaluation ``name`` where less is better (none for an unknown name)."""
    cls = _registry.get(name)
    return cls.lower_is_better if cls is not None else frozenset()


def failure_rule(name: str) -> FailureRule:
    """How failed samples of evaluation ``name`` count (the default rule for an unknown
    name)."""
    cls = _registry.get(name)
    return _failure_rule(cls) if cls is not None else FailureRule()


def create(name: str, params: Mapping[str, str] | None = None) -> Evaluation:
    """Instantiate the evaluation registered as ``name`` with ``params`` (checked against its
    declared :attr:`Evaluation.Params`: :class:`ParamError` otherwise)."""
    cls = _registry.get(name)
    if cls is None:
        raise UnknownEvalError(name, registered())
    return cls(**dict(params or {}))


def scrub(row: object, label_fields: Iterable[str]) -> dict[str, Any]:
    """A copy of ``row`` without its label fields; anything but a dict is refused."""
    if not isinstance(row, dict):
        raise PayloadError(f"row is a {type(row).__name__}, not a mapping; refusing to scrub")
    hidden = set(label_fields)
    return {k: v for k, v in row.items() if k not in hidden}
