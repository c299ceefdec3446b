"""Isolated inference: an evaluation's model loaded and run in a warm subprocess of its own
(``worker/model_host.py``), which only ever receives label-free rows.

Used when the evaluation sets ``isolated = True`` or the worker runs with
``EVALQ_ISOLATE_INFERENCE=1``: code the caller controls (a prompt, a program passed as a param)
then cannot walk the worker's stack or heap for the rows its labels were scrubbed from. The
subprocess is started once per (evaluation, params) per worker process, replaced after it dies
or times out (the batch is then tried again like any failed inference), and killed when its
model is evicted or the worker stops. It runs in a sandbox (:mod:`evalq.shared.isolation.sandbox`):
each start
is logged with the layers the machine allowed (``sandbox=seccomp,landlock,...``), and a warning
names each layer that is missing and why.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from evalq.shared.errors import ModelHostError, PermanentError
from evalq.shared.evaluation import Evaluation
from evalq.worker.host_process import HostProcess, ended

__all__ = ["ModelProxy"]

HOST = Path(__file__).with_name("model_host.py")

log = logging.getLogger(__name__)


class ModelProxy:
    """An evaluation's model in its own subprocess; call :meth:`infer` as ``infer()``."""

    def __init__(
        self,
        evaluation: Evaluation,
        *,
        device: str,
        plugins: Sequence[str],
        threads: int | None,
        timeout: float,
    ) -> None:
        hello = {
            "eval": evaluation.name,
            "params": evaluation.params,
            "plugins": list(plugins),
            "files": list(evaluation.model_files),
            "device": device,
            "threads": threads,
        }
        self._name = evaluation.name
        self._timeout = timeout
        self.sandbox: dict[str, Any] = {}
        """What the latest subprocess reported of its sandbox: ``applied``, ``missing``."""
        self._host = HostProcess(
            [sys.executable, "-P", str(HOST)],
            name=f"the model host of {evaluation.name}",
            error=ModelHostError,
            death=partial(ended, "the model host"),
            start_timeout=timeout,
            hello=hello,
            on_ready=self._ready,
        )

    def _ready(self, pid: int, reply: dict[str, Any]) -> None:
        sandbox = reply.get("sandbox")
        self.sandbox = sandbox if isinstance(sandbox, dict) else {}
        applied = ",".join(map(str, self.sandbox.get("applied", []))) or "none"
        log.info("the model host of %s started (pid %d) sandbox=%s", self._name, pid, applied)
        for layer, why in dict(self.sandbox.get("missing", {})).items():
            log.warning("the model host of %s runs without %s: %s", self._name, layer, why)

    def start(self) -> ModelProxy:
        """Start the subprocess and load the model now (a failure is a ModelHostError)."""
        self._host.start()
        return self

    @property
    def started(self) -> int:
        """Subprocesses started so far (respawns included)."""
        return self._host.started

    def infer(self, rows: list[dict[str, Any]]) -> list[Any]:
        """The model's outputs for ``rows``, computed in the subprocess."""
        try:
            reply = self._host.request({"rows": rows}, self._timeout)
        except (TypeError, ValueError) as exc:
            raise PermanentError(f"isolated inference sends rows as JSON: {exc}") from None
        if "ok" in reply and isinstance(reply["ok"], list):
            return reply["ok"]
        message = str(reply.get("error", "the model host answered nothing"))
        raise (PermanentError if reply.get("permanent") else ModelHostError)(message)

    def close(self) -> None:
        """Stop the subprocess (its memory, GPU memory included, goes with it)."""
        self._host.close()
