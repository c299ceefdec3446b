"""What one gateway holds for all its requests: its Redis clients, its Celery app, the token
look-up and its limits, built once by :func:`evalq.producer.gateway.app.create_gateway` and handed
to routes and dependencies by :func:`context_of`."""

from dataclasses import dataclass
from typing import Annotated, Self, cast

import redis
import redis.asyncio
from celery import Celery
from fastapi import Depends, Request

from evalq.producer.gateway.limits import RateLimiter, StreamSlots
from evalq.producer.gateway.streams import Streams
from evalq.producer.service.direct import CLI_RETRIES
from evalq.shared.access.roles import Caller
from evalq.shared.access.tokens import TokenLookup
from evalq.shared.connection import connect, connect_async
from evalq.shared.evaluation import load_plugins
from evalq.shared.queue.celery_app import create_app
from evalq.shared.settings import Settings

__all__ = ["Context", "Shared", "context_of"]


@dataclass(frozen=True)
class Context:
    """The gateway's shared state (its limits count in this process only:
    :mod:`evalq.producer.gateway.limits`)."""

    settings: Settings
    store: redis.Redis
    """The routes' Redis client (on the request threads)."""
    waits: redis.asyncio.Redis
    """The event loop's Redis client: token look-ups and the results streams' waits."""
    celery: Celery
    lookup: TokenLookup
    limiter: RateLimiter
    """Requests a second per principal, and per address for callers without a known token."""
    streams: Streams
    working: StreamSlots
    """Requests in flight per principal."""
    operator: Caller | None = None
    """Direct mode's app (:mod:`evalq.producer.clients.inprocess`): every request is this
    operator's, with no token, no rate limit and no refusal audited; None for ``evalq serve``."""

    @classmethod
    def open(cls, settings: Settings, operator: Caller | None = None) -> Self:
        """Connect to ``settings.redis_url`` and load the evaluation plugins (the operator's
        app, as direct mode did: retrying as a command does, and loading the plugins where an
        operation needs them)."""
        retries = {} if operator is None else {"retries": CLI_RETRIES}
        store = connect(settings.redis, **retries)
        # a connection per open stream (its XREAD BLOCK), and some for the token look-ups
        waits = connect_async(
            settings.redis, max_connections=settings.gateway_streams + 64, **retries
        )
        if operator is None:
            load_plugins(settings.plugins)
        slots = StreamSlots(settings.gateway_streams_per_principal, settings.gateway_streams)
        return cls(
            settings=settings,
            store=store,
            waits=waits,
            celery=create_app(settings),
            lookup=TokenLookup(waits),
            limiter=RateLimiter(settings.gateway_burst),
            streams=Streams(slots, waits),
            working=StreamSlots(
                settings.gateway_inflight,
                2**31,
                ("too many requests", "requests in flight", "wait for one to finish"),
            ),
            operator=operator,
        )

    def close(self) -> None:
        """Close the routes' Redis client and the broker connections submits opened (the
        event loop's client is closed on its loop: ``waits.aclose()``)."""
        self.store.close()
        self.celery.close()

    async def live(self, digest: str | None) -> bool:
        """Whether the token of ``digest`` is still live (the operator holds none: always)."""
        return self.operator is not None or (digest is not None and await self.lookup.live(digest))


def context_of(request: Request) -> Context:
    """The context of the gateway serving ``request`` (``create_gateway`` puts it on the
    app's state)."""
    return cast(Context, request.app.state.context)


Shared = Annotated[Context, Depends(context_of)]
"""A route's or dependency's parameter receiving the gateway's context."""
