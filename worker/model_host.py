"""The inside of an isolated model: ``python -P model_host.py``, one per (evaluation, params)
per worker process, started by :class:`evalq.worker.model_proxy.ModelProxy`.

A fresh interpreter (not a fork): none of the worker's memory is here, neither the rows with
their labels, nor the shard cache, nor the Redis connection; its environment is the allowlist
of :mod:`evalq.shared.isolation.child_env` (no ``EVALQ_`` variable, no Redis URL, password or
token), and ``-P`` keeps the worker's folder off ``sys.path``. Before anything else it makes itself
not dumpable and drops every capability (a worker running as root included), and workers are not
dumpable (:mod:`evalq.shared.isolation.privilege`), so it cannot read its parent's
``/proc/<pid>/environ`` or ``/proc/<pid>/mem`` either.

It reads one hello line ``{"eval", "params", "plugins", "files", "device", "threads"}``, shuts
itself in its sandbox (:func:`evalq.shared.isolation.sandbox.confine`: no network, no file but the
Python installation, the plugins, the model's ``files`` and its own ``HOME``), imports the plugin
modules, loads the model once and says ``{"ready": true, "sandbox": {"applied", "missing"}}``;
then each line ``{"rows": [...]}`` (label-free rows) is answered ``{"ok": [outputs]}`` or
``{"error": "..."}`` (``"permanent": true`` when an output is not JSON, as in-process inference
treats it).

The protocol has its own file descriptor: what the plugin prints goes to stderr.
"""

from __future__ import annotations

import json
import os
import sys
from typing import IO, Any

from evalq.shared.errors import first_line
from evalq.shared.evaluation import Evaluation, create, load_plugins
from evalq.shared.isolation.privilege import drop_capabilities, undumpable
from evalq.shared.isolation.sandbox import confine


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {first_line(exc)}"


def _reply(channel: IO[str], message: dict[str, Any]) -> None:
    channel.write(json.dumps(message, allow_nan=False) + "\n")
    channel.flush()


def _load(hello: dict[str, Any]) -> tuple[Evaluation, Any]:
    if hello.get("threads") and hello["device"] == "cpu":
        # read by torch (and BLAS) when it is first imported: no import here for a model
        # that does not use torch
        os.environ["OMP_NUM_THREADS"] = str(int(hello["threads"]))
    load_plugins(hello["plugins"])
    evaluation = create(hello["eval"], hello["params"])
    return evaluation, evaluation.load(hello["device"])


def _answer(evaluation: Evaluation, model: Any, rows: list[dict[str, Any]]) -> dict[str, Any]:
    try:
        outputs = evaluation.infer(model, rows)
    except Exception as exc:
        return {"error": _why(exc)}
    try:
        json.dumps(outputs, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return {"error": f"output not JSON: {exc}", "permanent": True}
    return {"ok": outputs}


def main() -> int:
    """Serve inference calls until stdin closes."""
    channel = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        undumpable()
        drop_capabilities()
    except OSError as exc:
        _reply(channel, {"error": f"cannot drop its privileges, so it does not run: {exc}"})
        return 1
    hello = json.loads(sys.stdin.readline())
    sandbox = confine(
        modules=hello["plugins"],
        files=hello.get("files", []),
        home=os.environ.get("HOME"),
        device=hello["device"],
    )
    try:
        evaluation, model = _load(hello)
    except Exception as exc:
        _reply(channel, {"error": f"cannot load the model: {_why(exc)}"})
        return 1
    _reply(channel, {"ready": True, "sandbox": sandbox})
    for line in sys.stdin:
        _reply(channel, _answer(evaluation, model, json.loads(line)["rows"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
