"""Script scorers: scoring code that runs as a script, outside the worker process.

A scorer script is a Python file exposing ``main(argv: list[str]) -> str`` and still runnable
as ``python script.py ARGS`` (it prints ``main(sys.argv[1:])``). An evaluation declares one with
``scorer = ScriptScorer(path=...)``, turns each (row, output) into a :class:`ScriptCall` and the
script's answer into metrics. Workers run it in warm subprocesses (``worker/script_pool.py``);
:func:`run_cold` is the same call the slow way, one fresh interpreter per call.

The path comes from the plugin's code, never from a message.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from evalq.shared.errors import ScriptError
from evalq.shared.isolation.child_env import child_env

__all__ = ["ScriptCall", "ScriptScorer", "run_cold"]


@dataclass(frozen=True)
class ScriptScorer:
    """A scorer script and the limits each call runs under."""

    path: str
    """Absolute path of the script."""
    timeout: float = 10.0
    """Wall-clock seconds per call; past it the subprocess is killed (and replaced)."""
    cpu_seconds: int = 10
    """CPU seconds per call (``RLIMIT_CPU``)."""
    memory_mb: int = 1024
    """Address space of the subprocess in MiB (``RLIMIT_AS``); core files are off."""

    def __post_init__(self) -> None:
        if not Path(self.path).is_absolute():
            raise ValueError(f"a scorer script path must be absolute, got {self.path!r}")


@dataclass(frozen=True)
class ScriptCall:
    """One call of a scorer script: its arguments and extra environment variables."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


def run_cold(scorer: ScriptScorer, call: ScriptCall) -> str:
    """Run ``python script.py ARGS`` once in a fresh empty directory, with the environment
    a worker gives its scorer processes (:func:`evalq.shared.isolation.child_env.child_env`) and the
    call's ``env`` over it; its stdout, stripped."""
    with tempfile.TemporaryDirectory(prefix="evalq-cold-") as workdir:
        try:
            done = subprocess.run(
                [sys.executable, scorer.path, *call.argv],
                cwd=workdir,
                env={**child_env(workdir), **call.env},
                capture_output=True,
                text=True,
                timeout=scorer.timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise ScriptError(f"scorer timed out after {scorer.timeout:g}s") from exc
    if done.returncode != 0:
        last = done.stderr.strip().splitlines()[-1:] or [f"exit code {done.returncode}"]
        raise ScriptError(f"scorer failed: {last[0]}")
    return done.stdout.strip()
