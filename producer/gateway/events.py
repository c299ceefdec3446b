"""A run's live view (``GET /v1/runs/{run}/events``): server-sent events carrying the run as
``GET /v1/runs/{run}`` shows it, each time it changes, until the run ends.

The gateway looks at the run every :data:`EVENT_PERIOD` seconds on its stream threads (one
status read, the same the API answers; a reader who does not see the run's timing gets the
same coarse view it would get by asking) and sends it only when it differs from the last one
sent: ``event: run``. A run that has ended is sent once as ``event: end`` and the stream
closes; a stream also ends after :data:`EVENT_LIFETIME` seconds (``event: timeout``: the
viewer opens another), when the caller's token is revoked (``event: error``, the one-line
error every refusal carries) or when the run can no longer be read (purged). Each stream holds
one of its principal's results-stream slots (:class:`evalq.producer.gateway.limits.StreamSlots`)
from before its first read until it ends. Browsers read it with ``fetch()``: ``EventSource``
cannot send the ``Authorization`` header.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from evalq.producer.gateway.acting import Act
from evalq.producer.gateway.context import Shared
from evalq.producer.gateway.params import AdminQuery, RunId
from evalq.producer.gateway.streams import REVOKED, ResultStream, Streams
from evalq.producer.service.views import RunView
from evalq.shared.errors import EvalqError, PolicyRefusedError, UnknownRunError
from evalq.shared.models import to_json

__all__ = ["EVENT_LIFETIME", "EVENT_PERIOD", "router"]

router = APIRouter(tags=["runs"])

EVENT_PERIOD = 1.0
"""Seconds between two looks at the run."""
EVENT_LIFETIME = 600.0
"""Seconds a stream lasts at most."""
KEEPALIVE = 15.0
"""Seconds without an event after which a comment line is sent (proxies close quiet streams)."""
HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}


def event(name: str, data: str) -> str:
    """One server-sent event."""
    return f"event: {name}\ndata: {data}\n\n"


@router.get(
    "/v1/runs/{run_id}/events",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}}},
)
async def events(
    run_id: RunId, act: Act, context: Shared, request: Request, admin: AdminQuery = False
) -> StreamingResponse:
    """The run as ``GET /v1/runs/{run_id}`` shows it, as server-sent events: ``run`` each time
    it changes, ``end`` once it has ended (then the stream closes). A refusal answers before
    the stream starts, as the run's status does. Counts as one of the principal's results
    streams (429 beyond ``EVALQ_GATEWAY_STREAMS_PER_PRINCIPAL``)."""
    request.state.working()
    streams = context.streams
    give_back = streams.slots.take(act.who.principal)
    try:
        acting = await streams.run(lambda: act.owned(run_id, admin=admin))
        first = await streams.run(lambda: acting.status(run_id))
    except BaseException:
        give_back()
        raise
    live = partial(context.live, request.state.token)
    sent = _events(streams, partial(acting.status, run_id), first, live)
    return ResultStream(sent, give_back, "text/event-stream", HEADERS)


async def _events(
    streams: Streams,
    read: Callable[[], RunView],
    view: RunView,
    live: Callable[[], Awaitable[bool]],
) -> AsyncIterator[str]:
    """The run's events from ``view`` on; see the module."""
    started = quiet = time.monotonic()
    last = None
    while True:
        text = view.model_dump_json()
        if not view.meta.status.active:
            yield event("end", text)
            return
        now = time.monotonic()
        if text != last:
            yield event("run", text)
            last, quiet = text, now
        elif now - quiet >= KEEPALIVE:
            yield ": still here\n\n"
            quiet = now
        if now - started >= EVENT_LIFETIME:
            yield event("timeout", "{}")
            return
        await anyio.sleep(EVENT_PERIOD)
        if not await live():
            yield event("error", REVOKED.strip())
            return
        try:
            view = await streams.run(read)
        except EvalqError as exc:  # purged, or its tier changed: one line naming no path
            known = isinstance(exc, UnknownRunError | PolicyRefusedError)
            message = str(exc) if known else f"run can no longer be read ({type(exc).__name__})"
            yield event("error", to_json({"error": message, "exit_code": exc.exit_code}))
            return
