"""Model providers: what ``--model PROVIDER/NAME`` may name, each registered by its name with
the module that loads its models, imported on first use (``hf``'s pulls in torch and
transformers, which a producer never needs).

A provider declares what parsing a spec needs (its ``--model-arg`` names; whether it is an
endpoint, called at ``base_url`` and taking no ``@revision``; whether it reads log-likelihoods,
which multiple-choice tasks need) and where its loader is (``"module:function"``, called as
``load(spec, device, services, cache)``). ``hf`` and ``openai`` are registered here; a plugin
registers another with :func:`register_provider`, and :meth:`evalq.shared.lm.spec.ModelSpec.parse`,
the worker's model pool and the heartbeat's list of providers reach it with no other change.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from evalq.shared.errors import InputError, PluginError
from evalq.shared.names import PLUGIN_NAME

if TYPE_CHECKING:
    from evalq.shared.lm.request import (
        ChoiceRequest,
        ChoiceScore,
        Generation,
        GenerationRequest,
        Prompt,
    )
    from evalq.shared.lm.spec import ModelSpec
    from evalq.shared.services import Services

__all__ = [
    "ChoiceModel",
    "LanguageModel",
    "Loader",
    "Provider",
    "load_model",
    "provider",
    "register_provider",
    "registered_providers",
]


class LanguageModel(Protocol):
    """A loaded model of any provider, as a language task drives it."""

    def render(self, prompt: str, *, chat: bool, system: str | None = None) -> Prompt:
        """What the model is sent for ``prompt`` (:class:`evalq.shared.lm.template.Renderer`)."""

    def generate(
        self, requests: Sequence[GenerationRequest], runs: Sequence[str] | None = None
    ) -> Sequence[Generation | Exception]:
        """Each request's generation (or why it has none), in order; ``runs``: each request's
        run, for a provider that meters or caches by run."""


class ChoiceModel(LanguageModel, Protocol):
    """A model of a provider that reads log-likelihoods (``Provider.loglikelihoods``)."""

    def encode(self, text: str) -> list[int]:
        """``text``'s tokens."""

    def loglikelihood(self, requests: Sequence[ChoiceRequest]) -> list[ChoiceScore]:
        """Each continuation's summed log-likelihood after its context, in order."""


Loader = Callable[["ModelSpec", str, "Services | None", bool], LanguageModel]
"""``load(spec, device, services, cache)``: the model ``spec`` names on ``device``; ``services``
are the worker's (None where nothing is loaded to run), ``cache`` whether the run asked for the
fleet's response cache."""


@dataclass(frozen=True)
class Provider:
    """A registered model provider."""

    name: str
    loader: str
    """``"module:function"``, a :data:`Loader`, imported the first time a model is loaded."""
    args: frozenset[str]
    """The ``--model-arg`` names its models take (fields of
    :class:`evalq.shared.lm.spec.ModelArgs`)."""
    endpoint: bool = False
    """Its models answer over HTTP at ``base_url`` (required; no ``@revision``; the weights are
    the server's): a local model's name is a folder or a Hub id otherwise."""
    loglikelihoods: bool = False
    """Its models read log-likelihoods (multiple-choice tasks run on them)."""


_registry: dict[str, Provider] = {}
_loaders: dict[str, Loader] = {}


def register_provider(found: Provider) -> None:
    """Make ``found`` a provider ``--model`` may name; :class:`PluginError` for a bad name or
    a second provider under one name."""
    if not PLUGIN_NAME.match(found.name) or "/" in found.name:
        raise PluginError(f"invalid provider name {found.name!r}")
    module, sep, function = found.loader.partition(":")
    if not (module and sep and function):
        raise PluginError(f"provider {found.name!r}: loader must be 'module:function'")
    current = _registry.get(found.name)
    if current is not None and current != found:
        raise PluginError(f"provider {found.name!r} is registered twice")
    _registry[found.name] = found


def registered_providers() -> list[str]:
    """Names of the registered providers."""
    return sorted(_registry)


def provider(name: str) -> Provider:
    """The provider registered as ``name``; :class:`InputError` (one line, listing the
    registered ones) otherwise."""
    found = _registry.get(name)
    if found is None:
        listed = ", ".join(f"{p}/" for p in registered_providers())
        raise InputError(f"unknown provider {name!r} (registered: {listed})")
    return found


def load_model(
    spec: ModelSpec, device: str, services: Services | None, cache: bool = False
) -> LanguageModel:
    """The model ``spec`` names, loaded by its provider's loader (imported on first use)."""
    return _loader(provider(spec.provider))(spec, device, services, cache)


def _loader(found: Provider) -> Loader:
    if found.name not in _loaders:
        module, _, function = found.loader.partition(":")
        try:
            _loaders[found.name] = getattr(importlib.import_module(module), function)
        except (ImportError, AttributeError) as exc:
            raise PluginError(
                f"provider {found.name!r}: cannot load {found.loader}: {exc}"
            ) from exc
    return _loaders[found.name]


LOCAL_ARGS = frozenset({"dtype", "batch_size", "max_length"})
"""Arguments of a local (``hf``) model."""
ENDPOINT_ARGS = frozenset(
    {"base_url", "api_key_env", "concurrency", "timeout", "max_retries", "tokenizer"}
)
"""Arguments of an endpoint (``openai``) model."""

register_provider(
    Provider("hf", "evalq.shared.lm.hf:load", LOCAL_ARGS, endpoint=False, loglikelihoods=True)
)
register_provider(
    Provider("openai", "evalq.shared.evals.endpoints:load", ENDPOINT_ARGS, endpoint=True)
)
