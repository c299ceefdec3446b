"""Warm runtimes: each worker process loads a model once per (evaluation, params) and reuses it
for every batch, keeping at most ``max_models`` loaded (LRU)."""

from __future__ import annotations

import gc
import json
from collections.abc import Mapping
from typing import Any

from shared.evaluation import Evaluation, create
from worker.lru import LRU

__all__ = ["RuntimePool", "resolve_device"]

RuntimeKey = tuple[str, str]


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


def _release(_key: RuntimeKey, _model: Any) -> None:
    gc.collect()
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


class RuntimePool:
    """Evaluations (cheap) and their loaded models (expensive), by name and parameters."""

    def __init__(
        self,
        device: str,
        max_models: int,
        cpu_threads: int | None = None,
        process_index: int = 0,
    ) -> None:
        self._device = device
        self._cpu_threads = cpu_threads
        self._process_index = process_index
        self._evaluations: dict[RuntimeKey, Evaluation] = {}
        self._models: LRU[RuntimeKey, Any] = LRU(max_models, on_evict=_release)

    def evaluation(self, name: str, params: Mapping[str, str]) -> Evaluation:
        """The evaluation instance for ``name`` with ``params``."""
        key = (name, json.dumps(dict(params), sort_keys=True))
        if key not in self._evaluations:
            self._evaluations[key] = create(name, params)
        return self._evaluations[key]

    def model(self, evaluation: Evaluation) -> Any:
        """The loaded model of ``evaluation``, loading it on first use in this process."""
        key = (evaluation.name, json.dumps(evaluation.params, sort_keys=True))
        return self._models.get_or_create(key, lambda: self._load(evaluation))

    def _load(self, evaluation: Evaluation) -> Any:
        device = resolve_device(self._device, self._process_index)
        if device == "cpu":
            _limit_cpu_threads(self._cpu_threads)
        return evaluation.load(device)

    def close(self) -> None:
        """Free every loaded model."""
        self._models.clear()
