"""The ``openai`` provider's loader: an endpoint model wired to the fleet's stores in the
worker's Redis (its rate limit, response cache and runs' token budgets), from the services the
worker hands in (:class:`evalq.shared.services.Services`); and the question a submit asks of a
server before a run needs its log-likelihoods (:func:`loglikelihoods_refused`)."""

from __future__ import annotations

import os

import redis

from evalq.shared.errors import PermanentError, first_line
from evalq.shared.lm.endpoint import ENVELOPE_BYTES, EndpointModel
from evalq.shared.lm.limits import EndpointLimits
from evalq.shared.lm.request import LoglikelihoodRequest
from evalq.shared.lm.spec import ModelSpec
from evalq.shared.services import Services
from evalq.shared.store.rate import RateLimit
from evalq.shared.store.responses import ResponseCache
from evalq.shared.store.runs import RunStore
from evalq.shared.store.spend import RunMeter, TokenSpend

__all__ = ["endpoint_model", "load", "loglikelihoods_refused"]

_METERS = 1024
"""Runs whose token meter an endpoint model keeps (oldest dropped first)."""
PROBE_TIMEOUT = 10.0
"""Seconds at most the submit's one question to a server may take."""
PROBE = LoglikelihoodRequest((0, 0), 1)
"""What it asks: the log-likelihood of token 0 after token 0 (an id every vocabulary has)."""


def load(spec: ModelSpec, device: str, services: Services | None, cache: bool) -> EndpointModel:
    """The ``openai`` provider's loader (:mod:`evalq.shared.lm.providers`): the device is the
    server's business."""
    if services is None:
        raise PermanentError(f"model {spec}: an endpoint model is loaded by a worker only")
    return endpoint_model(spec, services, cache)


def endpoint_model(spec: ModelSpec, services: Services, cache: bool = False) -> EndpointModel:
    """The endpoint model ``spec`` names, on this worker: its server must be listed in the
    policy, with the key variable the spec names when it names one (checked again here: the
    listing may have changed since the run was submitted); the key is this process's value of
    the variable the entry names, and nothing when the entry names none or the variable is
    unset (no ``Authorization`` header; never a default variable: a key goes only where the
    operator said). The rate limit is the fleet's, in the worker's Redis, and so is the
    response cache when the run asked for it (``cache``)."""
    url = spec.endpoint
    if url is None:
        raise PermanentError(f"model {spec}: not an endpoint model")
    settings, client = services.settings, services.client
    rate = RateLimit(client, url, EndpointLimits())
    refused = rate.refresh(spec.args)
    if refused is not None:
        raise PermanentError(refused)
    key = _key(rate)
    responses = ResponseCache(client, settings.cache_ttl, settings.cache_max_bytes)
    spend, runs = TokenSpend(client), RunStore(client)
    known: dict[str, tuple[RunMeter | None, str]] = {}

    def of(run_id: str) -> tuple[RunMeter | None, str]:
        if run_id not in known:  # what a run is charged to, and whose it is, never change
            if len(known) >= _METERS:
                del known[next(iter(known))]
            meta = runs.get(run_id)
            known[run_id] = (spend.meter(meta), meta.principal)
        return known[run_id]

    return EndpointModel(
        spec,
        rate,
        key,
        responses if cache else None,
        meters=lambda r: of(r)[0],
        owners=lambda r: of(r)[1],
        max_body=settings.max_output_bytes + ENVELOPE_BYTES,
    )


def _key(rate: RateLimit) -> str | None:
    """This process's value of the variable the endpoint's policy entry names (None: it names
    none, or the variable is unset)."""
    variable = rate.limits.api_key_env
    return (os.environ.get(variable) or None) if variable is not None else None


def loglikelihoods_refused(spec: ModelSpec, client: redis.Redis) -> str | None:
    """Why the server ``spec`` names cannot answer log-likelihoods, in one line (None: it
    answered one): one request of two tokens with ``echo`` and ``logprobs``, as the workers
    will send them, under the fleet's rate limit, with the key this process holds for it (the
    policy's variable), untried again and within :data:`PROBE_TIMEOUT` seconds, the wait for
    the rate limit included."""
    if spec.endpoint is None:
        raise PermanentError(f"model {spec}: not an endpoint model")
    quick = spec.args.model_copy(
        update={"max_retries": 0, "timeout": min(spec.args.timeout, PROBE_TIMEOUT)}
    )
    rate = RateLimit(client, spec.endpoint, EndpointLimits())
    refused = rate.refresh(quick)
    if refused is not None:
        return refused
    model = EndpointModel(spec.model_copy(update={"args": quick}), rate, _key(rate))
    (made,) = model.loglikelihoods([PROBE], within=PROBE_TIMEOUT)
    return first_line(made) if isinstance(made, Exception) else None
