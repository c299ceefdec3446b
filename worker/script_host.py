"""The inside of a warm scorer subprocess: ``python script_host.py SCRIPT CPU_S MEMORY_MB``.

Standard library only, and started by path, so a scorer process imports nothing of the worker.

Before anything else it makes itself not dumpable, so that no other process of its user (an
isolated model's host among them) can read its ``/proc/<pid>/environ`` or memory; its
environment is already the worker's allowlist (:mod:`evalq.shared.isolation.child_env`). It applies
its resource limits (address space, no core files), imports the script once, says
``{"ready": true}``, then answers one JSON line per call read from stdin:
``{"argv": [...], "env": {...}}`` -> ``{"ok": "<answer>"}`` or ``{"error": "<one line>"}``.
Each call runs in a fresh empty working directory (also its ``TMPDIR``) that is deleted after
it, with the caller's ``env`` laid over the process environment and restored after, and with a
CPU limit of ``CPU_S`` seconds more than the process has used so far (past it the kernel
sends SIGXCPU, which ends the process). A script that calls
``sys.exit`` gets its error reply and then this process exits, so the pool starts a fresh one.

The protocol has its own file descriptor: what the script prints goes to stderr, not into it.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import math
import os
import resource
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

Main = Callable[[list[str]], object]


def _undumpable() -> None:
    """``prctl(PR_SET_DUMPABLE, 0)`` (:func:`evalq.shared.isolation.privilege.undumpable`, which
    this file cannot import)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(4, 0, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def _limit(memory_mb: int) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    size = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (size, size))


def _cpu_budget(seconds: int) -> None:
    """Let the next call use ``seconds`` more CPU seconds: the soft limit moves, the hard one
    stays (an unprivileged process could not raise it again for the call after)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    soft = math.ceil(usage.ru_utime + usage.ru_stime) + seconds
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def _load(path: str) -> Main:
    sys.path.insert(0, str(Path(path).parent))  # as `python script.py` would
    spec = importlib.util.spec_from_file_location("evalq_scorer_script", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    main = getattr(module, "main", None)
    if not callable(main):
        raise ImportError(f"{path} has no main(argv) function")
    return main  # type: ignore[no-any-return]


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _call(main: Main, request: dict[str, Any], root: Path, cpu_seconds: int) -> dict[str, Any]:
    workdir = tempfile.mkdtemp(prefix="call-", dir=root)
    saved = dict(os.environ)
    os.environ.update({str(k): str(v) for k, v in request.get("env", {}).items()})
    os.environ["TMPDIR"] = tempfile.tempdir = workdir
    os.chdir(workdir)
    _cpu_budget(cpu_seconds)
    try:
        answer = main([str(arg) for arg in request["argv"]])
        if not isinstance(answer, str):
            return {"error": f"main() returned {type(answer).__name__}, not str"}
        return {"ok": answer}
    except SystemExit as exc:
        return {"error": f"the script called sys.exit({exc.code})", "exit": True}
    except MemoryError:
        return {"error": "MemoryError: the script went over its memory limit"}
    except Exception as exc:
        return {"error": _first_line(exc)}
    finally:
        os.chdir(root)
        os.environ.clear()
        os.environ.update(saved)
        tempfile.tempdir = None
        shutil.rmtree(workdir, ignore_errors=True)


def _reply(channel: IO[str], message: dict[str, Any]) -> None:
    channel.write(json.dumps(message) + "\n")
    channel.flush()


def main(argv: list[str]) -> int:
    """Serve calls of the script ``argv[0]`` until stdin closes."""
    _undumpable()
    path, cpu_seconds, memory_mb = argv[0], int(argv[1]), int(argv[2])
    channel = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    _limit(memory_mb)
    root = Path(tempfile.mkdtemp(prefix="evalq-scorer-"))
    try:
        try:
            script_main = _load(path)
        except Exception as exc:
            _reply(channel, {"error": f"cannot load the scorer: {_first_line(exc)}"})
            return 1
        _reply(channel, {"ready": True})
        for line in sys.stdin:
            reply = _call(script_main, json.loads(line), root, cpu_seconds)
            _reply(channel, reply)
            if reply.get("exit"):
                return 0
        return 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
