"""The gateway's FastAPI app (:func:`create_gateway`, what ``evalq serve`` runs): its context,
middleware (the body limit, the token before the body), error answers and routers."""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

import redis.asyncio
from fastapi import FastAPI

from evalq.producer.gateway import datasets, events, policy, results, runs, site, tasks, tokens
from evalq.producer.gateway.caller import token_first
from evalq.producer.gateway.context import Context
from evalq.producer.gateway.errors import RESPONSES, handle_errors, too_large
from evalq.producer.gateway.limits import BodyLimit, TokenFirst
from evalq.producer.gateway.retainer import Retainer
from evalq.shared.access.roles import Caller
from evalq.shared.settings import Settings

__all__ = ["create_gateway"]


def create_gateway(settings: Settings, operator: Caller | None = None) -> FastAPI:
    """The gateway's FastAPI app, talking to Redis with ``settings.redis_url``. With
    ``operator``, direct mode's app (:mod:`evalq.producer.clients.inprocess`, never served on a
    socket): every request is the operator's, so no token is read, no body limit or rate
    limit applies and its lifespan (the retention thread) is not run."""
    context = Context.open(settings, operator)
    api = FastAPI(
        title="evalq gateway",
        summary="Submit, watch and read evaluation runs within the split tiers.",
        version="1",
        responses=RESPONSES,
        # no Swagger UI nor ReDoc: they load scripts from a CDN onto the viewer's origin, where
        # they could read the signed-in token (the viewer's attack review); /openapi.json stays
        docs_url=None,
        redoc_url=None,
        lifespan=partial(_serving, Retainer(context.store, settings), context.waits),
    )
    api.state.context = context
    if operator is None:
        api.add_middleware(TokenFirst, check=partial(token_first, context))
        limit = settings.gateway_max_body
        api.add_middleware(BodyLimit, limit=limit, refusal=partial(too_large, limit))  # outer
    handle_errors(api)
    routers = (runs, events, results, datasets, tasks, policy, tokens, site)
    for router in (module.router for module in routers):
        api.include_router(router)
    return api


@asynccontextmanager
async def _serving(
    retainer: Retainer, waits: redis.asyncio.Redis, _: FastAPI
) -> AsyncIterator[None]:
    """While the gateway serves: its retention thread runs; after, its event loop's Redis
    client is closed."""
    retainer.start()
    yield
    retainer.stop()
    await waits.aclose()
