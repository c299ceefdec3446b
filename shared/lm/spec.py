"""Which language model a run uses: ``hf/<local path or Hub id>[@revision]`` or
``openai/<served model name>`` (an OpenAI-compatible endpoint: ``--model-arg base_url=...``),
plus declared ``--model-arg k=v`` pairs, and the identity of what answers for the run's
provenance.

Only declared arguments exist: a model spec is copied into every message and record, so an
argument that slipped through unchecked (``trust_remote_code`` above all: it would run code
from the model's repository on a worker) must be refused before anything is enqueued.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from evalq.shared.errors import InputError, first_line
from evalq.shared.lm.providers import Provider, provider

__all__ = [
    "KEY_VARIABLE",
    "ModelArgs",
    "ModelSpec",
    "canonical",
    "folder",
    "identity",
    "is_local",
    "present",
]

KEY_VARIABLE = r"^[A-Z][A-Z0-9_]{0,63}$"
"""An environment variable that may hold an endpoint's key (upper-case, digits, ``_``)."""
URL_PATTERN = r"^https?://[^\s/?#@]+(/[^\s?#]*)?$"
"""An endpoint's base URL: http(s), a host, a path; no query, fragment or credentials."""
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_BAD_NAME = re.compile(r"[\s\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]")
"""Whitespace, control characters, and the invisible and bidirectional formatting ones
(``openai/gpt\u202e4-ipa`` was listed as ``openai/gptapi-4``: the viewer's attack review)."""
_IDENTITY_SUFFIXES = (
    ".safetensors",
    ".bin",
    ".pt",
    ".pth",
    ".json",
    ".txt",
    ".model",
    ".jinja",
    ".tiktoken",
)
"""Files whose bytes decide what a local model computes: weights, configs, tokenizer files and
chat templates. READMEs and the like do not, so editing them keeps the identity."""
_identity_cache: dict[tuple[str, tuple[tuple[str, int, int], ...]], str] = {}


class ModelArgs(BaseModel):
    """The model arguments a person may set (``--model-arg k=v``); text values are converted."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    """Weights' dtype; ``auto`` is the checkpoint's own on an accelerator, float32 on CPU."""
    batch_size: int = Field(default=16, ge=1)
    """Requests per forward pass (generation batches are bucketed by prompt length)."""
    max_length: int | None = Field(default=None, ge=1)
    """Context window in tokens; default: the model config's (``n_positions``, …)."""
    base_url: str | None = Field(default=None, pattern=URL_PATTERN)
    """An endpoint model's server, up to ``/v1`` (``http(s)://host[:port]/v1``); it must be
    listed in the policy's ``endpoints:``."""
    api_key_env: str | None = Field(default=None, pattern=KEY_VARIABLE)
    """The worker's environment variable holding the endpoint's API key, as a check: given, it
    must be the one the endpoint's policy entry names (the entry alone decides which key, if
    any, is sent). The key itself is never in a spec, a message, a record or a log."""
    concurrency: int = Field(default=8, ge=1, le=256)
    """An endpoint model's most requests in flight per worker process (lowered on 429s)."""
    timeout: float = Field(default=60.0, gt=0, le=3600)
    """Seconds an endpoint request may take before it counts as a timeout."""
    max_retries: int = Field(default=5, ge=0, le=20)
    """Retries of a request answered 429 or 5xx, or timed out, before the sample fails."""
    tokenizer: str | None = Field(default=None, min_length=1)
    """An endpoint model's tokenizer, a folder on the worker (admitted as a local model's
    folder is): lm-eval tasks' log-likelihood requests are tokenized with it, as lm-eval's
    ``local-completions`` tokenizes them."""

    @field_validator("base_url")
    @classmethod
    def _no_trailing_slash(cls, value: str | None) -> str | None:
        return None if value is None else value.rstrip("/")


class ModelSpec(BaseModel):
    """A language model as a run names it; ``str()`` is the canonical ``hf/name[@revision]``
    (:meth:`arg_items` the non-default arguments), and both round-trip through :meth:`parse`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    provider: str
    """A registered provider's name (:mod:`evalq.shared.lm.providers`)."""
    name: str = Field(min_length=1)
    """A local folder (on the worker) or a Hugging Face Hub id; an endpoint's model name."""
    revision: str | None = None
    """A Hub branch, tag or commit; None: the default branch."""
    args: ModelArgs = ModelArgs()

    @classmethod
    def parse(cls, text: str, args: Mapping[str, str] | None = None) -> ModelSpec:
        """``hf/<path-or-id>[@revision]`` and ``--model-arg`` pairs; :class:`InputError` (one
        line naming the problem) for anything else."""
        name_of, sep, rest = text.strip().partition("/")
        try:
            found = provider(name_of)
        except InputError as exc:
            raise InputError(f"model {text!r}: {exc}") from None
        if not sep:
            raise InputError(f"model {text!r}: expected {name_of}/<name>")
        name, at, revision = rest.rpartition("@") if "@" in rest else (rest, "", "")
        name = name.rstrip("/") or name
        if not name:
            raise InputError(f"model {text!r}: empty model name after '{found.name}/'")
        if _BAD_NAME.search(name):
            raise InputError(
                f"model {text!r}: the name holds whitespace, control or formatting characters"
            )
        if at and not revision.strip():
            raise InputError(f"model {text!r}: empty revision after '@'")
        if at and _BAD_NAME.search(revision):
            raise InputError(f"model {text!r}: the revision holds whitespace")
        if found.endpoint:
            if at:
                raise InputError(f"model {text!r}: an endpoint model takes no @revision")
            made = cls(provider=found.name, name=rest.strip(), args=_args(found, args or {}))
            if made.args.base_url is None:
                raise InputError(
                    f"model {text!r}: an endpoint model needs --model-arg base_url=http(s)://…/v1"
                )
            return made
        return cls(
            provider=found.name, name=name, revision=revision or None, args=_args(found, args or {})
        )

    @field_validator("provider")
    @classmethod
    def _registered(cls, value: str) -> str:
        return provider(value).name

    @property
    def endpoint(self) -> str | None:
        """The server an endpoint provider's model is called at (None for a local model)."""
        return self.args.base_url if provider(self.provider).endpoint else None

    def arg_items(self) -> dict[str, str]:
        """The arguments that differ from their defaults, as ``--model-arg`` text."""
        return {k: str(v) for k, v in self.args.model_dump(exclude_defaults=True).items()}

    def __str__(self) -> str:
        at = f"@{self.revision}" if self.revision else ""
        return f"{self.provider}/{self.name}{at}"


def _args(found: Provider, given: Mapping[str, str]) -> ModelArgs:
    if "trust_remote_code" in given:
        raise InputError(
            "model arg 'trust_remote_code' is never accepted: evalq runs no code from a "
            "model's repository"
        )
    if "api_key" in given:
        raise InputError(
            "model arg 'api_key' is never accepted: name the worker's environment variable "
            "that holds it with api_key_env=NAME (a key in a spec would reach Redis and logs)"
        )
    unknown = sorted(set(given) - found.args)
    if unknown:
        raise InputError(
            f"unknown model arg '{unknown[0]}' for {found.name}/ models "
            f"(declared: {', '.join(sorted(found.args))})"
        )
    try:
        return ModelArgs.model_validate(dict(given))
    except ValidationError as exc:
        first = exc.errors()[0]
        key = str(first["loc"][0]) if first["loc"] else "?"
        msg = str(first["msg"]).splitlines()[0]
        if key == "base_url":  # not echoed: a URL may carry credentials
            raise InputError(
                "model arg base_url: expected http(s)://host[:port]/path, without credentials, "
                "query or fragment"
            ) from None
        raise InputError(f"model arg {key}={given.get(key)!r}: {msg}") from None


def is_local(spec: ModelSpec) -> bool:
    """Whether the name is a folder: a local provider's (``hf``'s) model written as a path
    (``/``, ``.`` or ``~`` first). Any other local name is a Hub id, even where a folder of that
    name exists (transformers would prefer the folder, relative to whichever directory the
    worker runs in)."""
    return spec.endpoint is None and spec.name.startswith(("/", ".", "~"))


def canonical(spec: ModelSpec) -> ModelSpec:
    """``spec`` with a folder named by its absolute, resolved path (``~`` expanded, links
    followed); :class:`InputError` (one line) for a revision given to a folder. A Hub id is
    returned as it is. Whether the folder exists is :func:`present`'s question, asked after
    the policy admitted the path (a refusal never says what exists outside the roots): a path
    that cannot be expanded or followed here (``~nosuchuser``, a link loop, a folder this
    process may not enter) is named by its absolute path as written, for the policy to judge
    like any other (the OS's error told which users and folders exist)."""
    if not is_local(spec):
        return spec
    if spec.revision is not None:
        raise InputError(f"model {spec}: a revision applies to Hub ids, not local folders")
    try:
        path = Path(spec.name).expanduser().resolve()
    except (RuntimeError, OSError):  # ~nosuchuser, a link loop, a folder it may not enter
        path = Path(os.path.abspath(spec.name))
    return spec.model_copy(update={"name": str(path)})


def present(spec: ModelSpec) -> ModelSpec:
    """:func:`canonical`'s ``spec``, checked to be a folder here when it names one
    (:class:`InputError`, one line, otherwise)."""
    found = canonical(spec)
    if is_local(found) and not Path(found.name).is_dir():
        raise InputError(f"model {spec}: no such model folder on this machine")
    return found


def folder(spec: ModelSpec) -> Path:
    """Where the model's files are on this machine: its folder, or a Hub model's snapshot in
    the Hugging Face cache (fetched when the Hub can be reached); :class:`InputError` when
    there is none."""
    if is_local(spec):
        return Path(present(spec).name)
    from huggingface_hub import snapshot_download

    try:
        return Path(str(snapshot_download(spec.name, revision=spec.revision)))
    except Exception as exc:
        raise InputError(
            f"model {spec}: not found on the Hub nor in its cache: {first_line(exc)}"
        ) from None


def identity(spec: ModelSpec) -> str:
    """What the run's provenance records of the weights: ``sha256:<hex>`` over a local
    folder's weight, config and tokenizer files, ``git:<commit>`` for a Hub model (the
    pinned commit, or the one the local Hugging Face cache resolves the revision to), or
    ``endpoint:<base_url>#<name>`` for an endpoint model (its server owns the weights)."""
    if spec.endpoint is not None:
        return f"endpoint:{spec.args.base_url}#{spec.name}"
    if is_local(spec):
        return _folder_digest(Path(present(spec).name))
    if spec.revision is not None and _COMMIT.match(spec.revision):
        return f"git:{spec.revision}"
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        folder = snapshot_download(
            spec.name, revision=spec.revision, local_files_only=True, allow_patterns=[]
        )
    except (LocalEntryNotFoundError, ValueError, OSError) as exc:
        raise InputError(
            f"model {spec}: not a local folder, and not in the local Hugging Face cache "
            f"({type(exc).__name__}); pin a commit with @<sha> or download it first"
        ) from None
    return f"git:{Path(str(folder)).name}"


def _folder_digest(folder: Path) -> str:
    files = sorted(
        p
        for p in folder.rglob("*")
        if p.is_file()
        and p.suffix in _IDENTITY_SUFFIXES
        and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    )
    if not files:
        raise InputError(f"model folder {folder} holds no weight or config files")
    stats = tuple(
        (p.relative_to(folder).as_posix(), p.stat().st_mtime_ns, p.stat().st_size) for p in files
    )
    key = (str(folder), stats)
    cached = _identity_cache.get(key)
    if cached is not None:
        return cached
    digest = hashlib.sha256()
    for path, (rel, _, size) in zip(files, stats, strict=True):
        digest.update(f"{rel}\0{size}\0".encode())
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    result = f"sha256:{digest.hexdigest()}"
    _identity_cache[key] = result
    return result
