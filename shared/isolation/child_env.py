"""The environment of every program a worker starts (scorer hosts, isolated model hosts, cold
scorer runs): an allowlist, never the worker's own environment.

A worker's environment holds its secrets (``EVALQ_REDIS_URL`` with the Redis password, an
endpoint's API key) and a child's ``/proc/<pid>/environ`` is readable by every process of the
same user while the child is dumpable (until it calls ``prctl(PR_SET_DUMPABLE, 0)``, and
always by its own code). So a child gets only what Python, torch and Hugging Face libraries
need to run, named here one by one: no ``EVALQ_`` variable, no credential, and a ``HOME`` and
``TMPDIR`` of its own (an empty folder the caller made for it), so that no library finds the
worker's caches or writes into them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["ALLOWED", "child_env"]

ALLOWED = frozenset(
    {
        # finding programs, text encoding, time
        "PATH",
        "LANG",
        "LANGUAGE",
        "TZ",
        # the interpreter: where plugins are imported from, and how it behaves
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONUTF8",
        "PYTHONIOENCODING",
        "PYTHONHASHSEED",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONUNBUFFERED",
        "PYTHONNOUSERSITE",
        # native libraries and the GPU a worker was given
        "LD_LIBRARY_PATH",
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "NVIDIA_VISIBLE_DEVICES",
        "NVIDIA_DRIVER_CAPABILITIES",
        "PYTORCH_CUDA_ALLOC_CONF",
        # CPU threads
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "TOKENIZERS_PARALLELISM",
        # Hugging Face: offline and quiet (never a cache location: those hold datasets too)
        "HF_HUB_OFFLINE",
        "HF_DATASETS_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "HF_HUB_DISABLE_PROGRESS_BARS",
        "HF_HUB_DISABLE_TELEMETRY",
    }
)
"""Variables passed on from the worker's environment when it has them, with ``LC_*``."""


def child_env(home: str | Path, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a child process whose ``HOME``, ``TMPDIR`` and working folder is
    ``home``: the variables of ``environ`` (default: this process's) named in :data:`ALLOWED`
    or starting ``LC_``, with relative ``PYTHONPATH`` entries made absolute against this
    process's working folder (the child's is ``home``)."""
    source = os.environ if environ is None else environ
    env = {k: v for k, v in source.items() if k in ALLOWED or k.startswith("LC_")}
    if "PYTHONPATH" in env:
        entries = env["PYTHONPATH"].split(os.pathsep)
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(entry or ".") for entry in entries)
    env["HOME"] = env["TMPDIR"] = str(home)
    return env
