"""lm-evaluation-harness's tasks found and pinned for evalq: a task resolved by lm-eval's
``TaskManager`` and every file it is made of pinned (:func:`resolve`), checked on every machine
that loads it (:func:`verify`), and its config loaded as lm-eval loads it (:func:`config_of`,
:func:`configurable`). Running it is :mod:`evalq.shared.lm.lmeval_runtime`'s.

lm-eval is an optional dependency (``pip install 'evalq[lm-eval]'``), imported by these
functions, never with the module; a missing or other version is refused in one line.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import importlib
import importlib.util
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import yaml

from evalq.shared.errors import InputError, first_line
from evalq.shared.lm.harness import (
    INSTALL,
    LM_EVAL_VERSION,
    HarnessSpec,
    PinnedFile,
    metric_name,
)

if TYPE_CHECKING:
    from datasets import Dataset

__all__ = ["config_of", "configurable", "lm_eval_package", "plain", "resolve", "verify"]

_STRUCTURAL = ("tag", "group", "task_list")
"""Keys of a task's YAML that say where it is listed, not what it is (lm-eval drops them)."""


def lm_eval_package() -> ModuleType:
    """The installed lm-eval, checked to be :data:`LM_EVAL_VERSION`; :class:`InputError`, one
    line naming the pip command, when it is missing or another version."""
    try:
        module = importlib.import_module("lm_eval")
    except ImportError:
        raise InputError(f"lm-eval tasks need lm-eval {LM_EVAL_VERSION}: {INSTALL}") from None
    version = getattr(module, "__version__", "?")
    if version != LM_EVAL_VERSION:
        raise InputError(
            f"lm-eval tasks need lm-eval {LM_EVAL_VERSION}, this machine has {version}: {INSTALL}"
        )
    return module


def _package_root() -> Path:
    return Path(str(lm_eval_package().__file__)).parent.resolve()


def _root_of(file: PinnedFile, include: str | None) -> Path:
    if file.root == "lm_eval":
        return _package_root()
    if include is None:
        raise InputError(f"{file.path}: an include folder's file, but the task names none")
    return Path(include)


def _pin(path: Path, include: Path | None) -> PinnedFile:
    """``path`` by its root and sha256; a file outside lm-eval and the include folder is
    refused (a worker could not find it by the same name)."""
    path = path.resolve()
    for root, base in (("include", include), ("lm_eval", _package_root())):
        if base is not None and path.is_relative_to(base):
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            relative = path.relative_to(base).as_posix()
            return PinnedFile(root=root, path=relative, sha256=digest)  # type: ignore[arg-type]
    raise InputError(f"{path}: a task's files must lie inside lm-eval or the include folder")


class _Function(str):
    """A ``!function module.name`` value, as the registered config shows it."""

    __slots__ = ()


def _walk(path: Path, include: Path | None, files: dict[Path, PinnedFile]) -> dict[str, Any]:
    """The YAML file ``path`` merged with what it includes, as lm-eval's ``load_yaml`` merges
    them, each file it reads (and each ``!function`` module) pinned into ``files``."""
    path = path.resolve()
    if path in files:
        raise InputError(f"{path}: included twice (an include cycle?)")
    files[path] = _pin(path, include)
    modules: list[str] = []

    class Loader(yaml.SafeLoader):
        pass

    def function(loader: yaml.SafeLoader, node: yaml.Node) -> str:
        spec = str(loader.construct_scalar(node))  # type: ignore[arg-type]
        modules.append(spec)
        return _Function(f"!function {spec}")

    Loader.add_constructor("!function", function)
    config = yaml.load(path.read_text(encoding="utf-8"), Loader=Loader)
    if not isinstance(config, dict):
        raise InputError(f"{path}: not a YAML mapping")
    for spec in modules:
        module = _module_file(spec, path.parent)
        if module not in files:
            files[module] = _pin(module, include)
    includes = config.pop("include", None)
    if includes is None:
        return config
    merged: dict[str, Any] = {}
    for name in includes if isinstance(includes, list) else [includes]:
        found = Path(name) if Path(name).is_absolute() else path.parent / name
        included = _walk(found, include, files)
        included.pop("task_list", None)
        merged.update(included)
    merged.update(config)
    return merged


def _module_file(spec: str, base: Path) -> Path:
    """The file a ``!function`` names, looked up as lm-eval looks it up: a module beside the
    YAML file first, then an importable one."""
    module, _, _ = spec.rpartition(".")
    beside = base / f"{module.replace('.', '/')}.py"
    if beside.exists():
        return beside.resolve()
    found = importlib.util.find_spec(module) if module else None
    if found is None or found.origin is None:
        raise InputError(f"!function {spec}: no module {module!r} beside the YAML or installed")
    return Path(found.origin).resolve()


OVER_NUMBERS = frozenset(
    {
        "mean",
        "median",
        "nanmean",
        "perplexity",
        "weighted_perplexity",
        "bits_per_byte",
        "f1_score",
        "matthews_corrcoef",
    }
)
"""lm-eval's aggregation functions over a number per document (``mean``, ``perplexity``) or a
tuple of numbers (``weighted_perplexity``'s ``(loglikelihood, words)``, ``f1``'s ``(gold,
prediction)``), which evalq stores one number a score. Any other (bleu's, chrf's and ter's over
texts, ``brier_score``'s over lists, a task's own ``!function``) is refused at registration."""


def resolve(task: str, include_path: Path | None) -> HarnessSpec:
    """lm-eval's task ``task``, found by lm-eval's ``TaskManager``: in ``include_path`` when
    given (its YAML may include lm-eval's own files by path), else among lm-eval's own tasks;
    its config read and every file pinned.
    :class:`InputError`, one line, for an unknown task, a group or tag, a task class, and
    anything lm-eval cannot build."""
    lm_eval_package()
    from lm_eval.tasks import TaskManager
    from lm_eval.tasks._index import Kind

    include = None if include_path is None else include_path.resolve()
    if include is not None and not include.is_dir():
        raise InputError(f"--include-path {include_path}: no such folder")
    if include is None:
        manager = TaskManager()
    else:  # the folder alone: scanning lm-eval's 13,000 YAML files too takes 20 s a CPU
        manager = TaskManager(include_path=str(include), include_defaults=False)
    entry = manager.task_index.get(task)
    if entry is None:
        close = difflib.get_close_matches(task, manager.all_tasks, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise InputError(f"lm-eval has no task '{task}'{hint}")
    if entry.kind in (Kind.GROUP, Kind.TAG):
        raise InputError(
            f"'{task}' is an lm-eval {entry.kind.name.lower()}: groups are not supported yet; "
            "register its tasks one by one"
        )
    if entry.kind is Kind.PY_TASK or entry.yaml_path is None:
        raise InputError(f"'{task}' is an lm-eval task class: task classes are not supported yet")
    files: dict[Path, PinnedFile] = {}
    config = _walk(Path(entry.yaml_path), include, files)
    if "class" in config:
        raise InputError(f"'{task}' is an lm-eval task class: task classes are not supported yet")
    if config.get("task") != task:
        raise InputError(f"'{task}': its YAML defines {config.get('task')!r}, not one task")
    for key in _STRUCTURAL:
        config.pop(key, None)
    spec = _spec_with(task, include, files, config)
    built = configurable(config_of(spec, checked=False))
    others = {
        name: getattr(how, "__name__", "?")
        for name, how in built.aggregation().items()
        if getattr(how, "__module__", "") != "lm_eval.api.metrics"
        or getattr(how, "__name__", "") not in OVER_NUMBERS
    }
    if others:
        named = ", ".join(f"{m} ({how})" for m, how in sorted(others.items()))
        raise InputError(
            f"'{task}' aggregates {named}: corpus-level metrics over texts, and a task's own "
            "aggregation functions, are not supported yet"
        )
    return spec.model_copy(
        update={
            "output_type": str(built.get_config("output_type")),
            "metrics": _metric_names(built),
        }
    )


def _spec_with(
    task: str, include: Path | None, files: dict[Path, PinnedFile], config: dict[str, Any]
) -> HarnessSpec:
    fewshot = config.get("fewshot_config") or {}
    split = None
    if not (isinstance(fewshot, dict) and fewshot.get("samples") and not fewshot.get("split")):
        split = next(
            (
                str(s)
                for s in (
                    fewshot.get("split") if isinstance(fewshot, dict) else None,
                    config.get("fewshot_split"),
                    config.get("training_split"),
                    config.get("validation_split"),
                    config.get("test_split"),
                )
                if s
            ),
            None,
        )
    shots = config.get("num_fewshot")
    return HarnessSpec(
        lm_eval=task,
        include_path=None if include is None else str(include),
        files=tuple(files.values()),
        config=plain(config),
        output_type=str(config.get("output_type", "generate_until")),
        labels=_target_fields(config.get("doc_to_target")),
        metrics=(),
        num_fewshot=shots if isinstance(shots, int) else None,
        fewshot_split=split,
    )


def _target_fields(target: Any) -> tuple[str, ...]:
    """The fields a ``doc_to_target`` reads: a Jinja template's undeclared variables, or the
    text itself (a column's name); none for a number or a ``!function``."""
    if not isinstance(target, str) or isinstance(target, _Function):
        return ()
    import jinja2
    from jinja2 import meta

    if "{" not in target:
        return (target,)
    return tuple(sorted(meta.find_undeclared_variables(jinja2.Environment().parse(target))))


def plain(value: Any) -> Any:
    """``value`` as JSON holds it (``!function`` values as their text)."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def verify(spec: HarnessSpec) -> Path:
    """Check every file of ``spec`` against its pinned sha256 on this machine; return the
    task's YAML file. :class:`InputError`, one line, for a changed or missing file or another
    lm-eval version."""
    lm_eval_package()
    if spec.version != LM_EVAL_VERSION:
        raise InputError(
            f"lm-eval task '{spec.lm_eval}' was registered with lm-eval {spec.version}; this "
            f"machine runs {LM_EVAL_VERSION}: register it again"
        )
    for file in spec.files:
        path = _root_of(file, spec.include_path) / file.path
        try:
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError as exc:
            raise InputError(f"lm-eval task '{spec.lm_eval}': {path}: {first_line(exc)}") from None
        if digest != file.sha256:
            raise InputError(
                f"lm-eval task '{spec.lm_eval}': {path} changed since it was registered "
                f"(sha256 {digest[:12]}, pinned {file.sha256[:12]}): register it again"
            )
    first = spec.files[0]
    return _root_of(first, spec.include_path) / first.path


def config_of(spec: HarnessSpec, *, checked: bool = True) -> dict[str, Any]:
    """The task's config as lm-eval loads it (``!function`` values imported), from its pinned
    files, checked first (:func:`verify`) unless ``checked`` is False (at registration, where
    they were just pinned)."""
    from lm_eval.tasks._yaml_loader import load_yaml

    first = spec.files[0]
    path = verify(spec) if checked else _root_of(first, spec.include_path) / first.path
    try:  # a `!function` module may import what this process lacks
        loaded = load_yaml(path, resolve_func=True)
    except Exception as exc:
        raise InputError(f"lm-eval cannot read task '{spec.lm_eval}': {first_line(exc)}") from exc
    config: dict[str, Any] = copy.deepcopy(loaded)
    for key in _STRUCTURAL:
        config.pop(key, None)
    return config


def configurable(config: dict[str, Any], docs: Mapping[str, Dataset] | None = None) -> Any:
    """lm-eval's ``ConfigurableTask`` for ``config`` over ``docs`` (split name -> documents);
    without ``docs``, over one empty-valued document (only its config is read)."""
    from datasets import Dataset, DatasetDict
    from lm_eval.api.task import ConfigurableTask

    if docs is None:
        placeholder = Dataset.from_list([{"_": ""}])
        split = "test"
        config = {**config, "test_split": split, "validation_split": None}
        config |= {"training_split": None, "fewshot_split": None, "process_docs": None}
        config |= {"doc_to_text": "", "doc_to_target": "", "doc_to_choice": None}
        config["fewshot_config"] = None
        docs = {split: placeholder}
    chosen = DatasetDict(dict(docs))

    def dataset(**_: Any) -> DatasetDict:
        return chosen

    try:
        return ConfigurableTask(config={**config, "custom_dataset": dataset})
    except InputError:
        raise
    except Exception as exc:
        name = config.get("task", "?")
        raise InputError(f"lm-eval cannot build task '{name}': {first_line(exc)}") from None


def _metric_names(task: Any) -> tuple[str, ...]:
    filters = [f.name for f in task._filters]
    return tuple(metric_name(m, f) for f in filters for m in task.aggregation())
