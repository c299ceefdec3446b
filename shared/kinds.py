"""Task kinds: how a run's record becomes the evaluation a worker runs, and what a worker asks
of an evaluation beyond the plugin API.

A kind is registered once (:func:`register_kind`) and claims the runs it builds
(:meth:`TaskKind.claims`; the latest registered is asked first): the Python evaluation (a
plugin's class, by its registered name and parameters) is built in; the YAML language task is
registered by :mod:`evalq.shared.evals.language`, imported the first time a run is built
(:data:`BUILTIN_KINDS`).
A new kind (an lm-eval task, an Inspect task, an agent task) is one more registration.

The worker drives every evaluation through a :class:`Runner`: a kind's evaluation that needs more
than ``load``/``infer``/``score`` (each sample's id at inference, a grader, a warm model shared
across tasks, provenance of its own) implements it; any other evaluation gets
:class:`PythonRunner`'s defaults (:func:`runner_of`).
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

from evalq.shared.errors import PluginError
from evalq.shared.evaluation import Evaluation, create, model_key
from evalq.shared.models import Grade, RunMeta
from evalq.shared.services import Services
from evalq.shared.stats import Stat

__all__ = [
    "BUILTIN_KINDS",
    "Graded",
    "PythonKind",
    "PythonRunner",
    "Runner",
    "TaskKind",
    "evaluation_of",
    "kind_of",
    "register_kind",
    "registered_kinds",
    "runner_of",
]

Graded = tuple[dict[str, float], Grade]
"""A sample's metrics and the grade they came from (:meth:`Runner.grade`)."""

K = TypeVar("K", bound="TaskKind")

BUILTIN_KINDS = ("evalq.shared.evals.language", "evalq.shared.evals.harness")
"""Modules that register the built-in kinds besides the Python evaluation's, imported the first
time a run's kind is looked up."""


class Runner(ABC):
    """What a worker asks of an evaluation besides ``load``/``infer``/``score``."""

    isolatable: ClassVar[bool] = True
    """Whether an isolating subprocess can rebuild the evaluation by its name (a plugin's
    class); one that cannot (a registered language task, which runs no code a caller chose)
    runs in the worker process even under ``isolate``."""

    @abstractmethod
    def infer_samples(
        self, model: Any, rows: list[dict[str, Any]], samples: list[tuple[str, int]]
    ) -> list[Any]:
        """``infer()`` told each row's run id and sample id (a sampling seed per sample, so a
        redelivered sample generates the same text)."""

    @abstractmethod
    def grade(
        self, run_id: str, rows: Mapping[int, dict[str, Any]], outputs: Mapping[int, Any]
    ) -> dict[int, Graded | Exception]:
        """For samples a grader model scores (a ``model_graded`` task): each one's metrics and
        the grade they came from, or why it has none; nothing for samples ``score()`` scores."""

    @abstractmethod
    def model_key(self) -> str:
        """What identifies the loaded model in a worker's pool of warm models."""

    @abstractmethod
    def weights(self) -> str | None:
        """What identifies the weights the model runs (provenance); None: the code's business."""

    @abstractmethod
    def definition(self) -> str | None:
        """sha256 of what defines the evaluation when it is not a source file (a registered
        task's spec); None: its class's source file is."""

    @abstractmethod
    def described(self) -> str:
        """What provenance names the evaluation by."""

    def stats(self, scores: Mapping[int, Mapping[str, float]]) -> dict[str, Stat] | None:
        """Each metric's value and uncertainty as the evaluation's own framework reports them
        (an lm-eval task: lm-eval's aggregation and standard error), from the counted
        ``scores``; None: evalq's (:func:`evalq.shared.stats.describe`)."""
        return None


class PythonRunner(Runner):
    """A plugin's Python evaluation as the worker drives it: ``infer()`` on the rows, no
    grader, its model keyed by name and parameters, its source file its definition."""

    def __init__(self, evaluation: Evaluation) -> None:
        self.evaluation = evaluation

    def infer_samples(
        self, model: Any, rows: list[dict[str, Any]], samples: list[tuple[str, int]]
    ) -> list[Any]:
        return self.evaluation.infer(model, rows)

    def grade(
        self, run_id: str, rows: Mapping[int, dict[str, Any]], outputs: Mapping[int, Any]
    ) -> dict[int, Graded | Exception]:
        return {}

    def model_key(self) -> str:
        return model_key(self.evaluation.name, self.evaluation.params)

    def weights(self) -> str | None:
        return None

    def definition(self) -> str | None:
        return None

    def described(self) -> str:
        cls = type(self.evaluation)
        return f"{cls.__module__}.{cls.__qualname__}"


def runner_of(evaluation: Evaluation) -> Runner:
    """How the worker drives ``evaluation``: itself when its kind made it a :class:`Runner`,
    else as a Python evaluation."""
    return evaluation if isinstance(evaluation, Runner) else PythonRunner(evaluation)


class TaskKind(ABC):
    """One kind of task a run can be: which runs are its own, and the evaluation each one is."""

    name: ClassVar[str]

    @abstractmethod
    def claims(self, meta: RunMeta) -> bool:
        """Whether run ``meta`` is of this kind."""

    @abstractmethod
    def evaluation(self, meta: RunMeta, services: Services | None) -> Evaluation:
        """The evaluation run ``meta`` records, with the ``services`` of the process that runs
        it (None where it is only described, never loaded)."""


class PythonKind(TaskKind):
    """A plugin's evaluation, by its registered name and parameters."""

    name = "python"

    def claims(self, meta: RunMeta) -> bool:
        return meta.task is None

    def evaluation(self, meta: RunMeta, services: Services | None) -> Evaluation:
        return create(meta.eval, meta.params)


_kinds: dict[str, TaskKind] = {}


def register_kind(kind: K) -> K:
    """Make ``kind`` build the runs it claims; :class:`PluginError` for a second kind under one
    name."""
    current = _kinds.get(kind.name)
    if current is not None and type(current).__qualname__ != type(kind).__qualname__:
        raise PluginError(f"task kind {kind.name!r} is registered twice")
    _kinds[kind.name] = kind
    return kind


def registered_kinds() -> list[str]:
    """Names of the registered kinds (the built-in ones included)."""
    _load_builtins()
    return sorted(_kinds)


def kind_of(meta: RunMeta) -> TaskKind:
    """The kind that claims run ``meta``, the latest registered first (the Python evaluation,
    registered first, is the last asked); :class:`PluginError` when none does."""
    _load_builtins()
    for kind in reversed(_kinds.values()):
        if kind.claims(meta):
            return kind
    raise PluginError(f"run {meta.run_id}: no task kind claims it (kinds: {', '.join(_kinds)})")


def evaluation_of(meta: RunMeta, services: Services | None = None) -> Evaluation:
    """The evaluation run ``meta`` names, built by its kind (:meth:`TaskKind.evaluation`)."""
    return kind_of(meta).evaluation(meta, services)


def _load_builtins() -> None:
    for module in BUILTIN_KINDS:  # after the first time, a look-up in sys.modules
        importlib.import_module(module)


register_kind(PythonKind())
