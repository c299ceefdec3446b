"""Warm runtimes: each worker process loads a model once per (evaluation, params) and reuses it
for every batch, keeping at most ``max_models`` loaded (LRU), and keeps warm subprocess pools
for scorer scripts (at most ``max_models`` scripts, ``scorer_procs`` subprocesses each).

An isolated evaluation (``isolated = True``, or every one with ``isolate``) has its model
loaded in a subprocess of its own instead (:class:`evalq.worker.model_proxy.ModelProxy`); it counts
as one of the ``max_models`` and is stopped when evicted.

A model is evicted before the next one loads, never after, so a process never holds more than
``max_models``; with no reference left it is garbage-collected and its CUDA memory returned
(``torch.cuda.empty_cache``) before the load. ``close`` frees every model and stops every
scorer subprocess."""

from __future__ import annotations

import gc
import json
import logging
import sys
from collections.abc import Callable
from functools import partial
from typing import Any

from evalq.shared.evaluation import Evaluation
from evalq.shared.kinds import evaluation_of, runner_of
from evalq.shared.models import RunMeta
from evalq.shared.scorer import ScriptScorer
from evalq.shared.services import Services
from evalq.worker.lru import LRU
from evalq.worker.model_proxy import ModelProxy
from evalq.worker.script_pool import ScriptPool

__all__ = ["Infer", "RuntimePool", "resolve_device"]

log = logging.getLogger(__name__)

Infer = Callable[[list[dict[str, Any]], list[tuple[str, int]]], list[Any]]
"""An evaluation's ``infer_samples()`` (:class:`evalq.shared.kinds.Runner`) bound to its loaded
model: label-free rows and each row's run id and sample id in, outputs out."""


def _limit_cpu_threads(threads: int | None) -> None:
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


def resolve_device(device: str, process_index: int = 0) -> str:
    """``auto`` becomes ``cuda:<k>`` when torch sees GPUs (worker process ``k`` of a prefork
    pool takes GPU ``k mod count``: one process per GPU), else ``cpu``; other values are kept."""
    if device != "auto":
        return device
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    return f"cuda:{process_index % torch.cuda.device_count()}"


def _free_memory() -> None:
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def _proxied(proxy: ModelProxy, rows: list[dict[str, Any]], _samples: object) -> list[Any]:
    return proxy.infer(rows)


def _stop(_scorer: ScriptScorer, pool: ScriptPool) -> None:
    pool.close()


class RuntimePool:
    """Evaluations (cheap) and their loaded models (expensive), by name and parameters."""

    def __init__(self, services: Services, *, process_index: int = 0) -> None:
        """The worker's ``services`` are handed to every evaluation built here
        (:func:`evalq.shared.kinds.evaluation_of`), and their settings size the pool: the
        device, ``max_models``, ``torch_threads``, ``scorer_procs``; ``isolate_inference``
        runs every evaluation's model in a subprocess, which imports ``plugins`` and may take
        ``task_time_limit`` seconds to load or answer."""
        settings = services.settings
        self._device = settings.device
        self._services = services
        self._isolate = settings.isolate_inference
        self._plugins = tuple(settings.plugins)
        self._isolated_timeout = float(settings.task_time_limit)
        self._cpu_threads = settings.torch_threads
        self._process_index = process_index
        self._scorer_procs = settings.scorer_procs
        max_models = settings.max_models
        self._evaluations: dict[str, Evaluation] = {}
        self._models: LRU[str, Any] = LRU(max_models, on_evict=self._evicted)
        self._scripts: LRU[ScriptScorer, ScriptPool] = LRU(max_models, on_evict=_stop)
        self._dropped = False

    @property
    def device(self) -> str:
        """The device this process's models run on."""
        return resolve_device(self._device, self._process_index)

    def evaluation(self, meta: RunMeta) -> Evaluation:
        """The evaluation instance run ``meta`` names (with its parameters, and for a
        language task its task and model)."""
        key = "\0".join((meta.eval, json.dumps(meta.params, sort_keys=True), meta.task or ""))
        if key not in self._evaluations:
            self._evaluations[key] = evaluation_of(meta, self._services)
        return self._evaluations[key]

    def model(self, evaluation: Evaluation) -> Infer:
        """``evaluation``'s ``infer()`` bound to its model, loading the model on first use in
        this process (in a subprocess of its own when the evaluation is isolated)."""
        runner = runner_of(evaluation)
        model = self._models.get_or_create(runner.model_key(), lambda: self._load(evaluation))
        if isinstance(model, ModelProxy):
            return partial(_proxied, model)
        return partial(runner.infer_samples, model)

    def scripts(self, scorer: ScriptScorer) -> ScriptPool:
        """The warm subprocess pool of a scorer script, started on first use."""
        return self._scripts.get_or_create(scorer, lambda: ScriptPool(scorer, self._scorer_procs))

    def _evicted(self, _key: str, model: Any) -> None:
        if isinstance(model, ModelProxy):
            model.close()
        self._dropped = True

    def _load(self, evaluation: Evaluation) -> Any:
        if self._dropped:  # a model was evicted to make room and nothing refers to it now
            self._dropped = False
            log.info(
                "evicted a model (EVALQ_MAX_MODELS reached) before loading %s", evaluation.name
            )
            _free_memory()
        device = self.device
        if runner_of(evaluation).isolatable and (evaluation.isolated or self._isolate):
            return ModelProxy(
                evaluation,
                device=device,
                plugins=self._plugins,
                threads=self._cpu_threads,
                timeout=self._isolated_timeout,
            ).start()
        if device == "cpu":
            _limit_cpu_threads(self._cpu_threads)
        return evaluation.load(device)

    def close(self) -> None:
        """Free every loaded model and stop every scorer and model subprocess."""
        self._models.clear()
        self._scripts.clear()
        _free_memory()
