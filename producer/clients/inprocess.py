"""Direct mode's door: the gateway's own app (:func:`evalq.producer.gateway.app.create_gateway`)
built in the command's process for the operator, and the HTTP client
(:class:`evalq.producer.clients.remote.RemoteClient`) talking to it through :class:`AppTransport`,
which calls the app directly: no socket, so nothing another process could reach.

An operation is one route over one service call in both modes. The operator
(``EVALQ_PRINCIPAL``, holding the Redis URL) sends no token and is held to none of the
gateway's per-principal limits (:class:`evalq.producer.gateway.context.Context`'s ``operator``).

httpx's own ``ASGITransport`` reads a response whole before it returns it, so a followed run's
results would come at its end; :class:`AppTransport` hands each chunk over as the app sends it
(a few at most are queued: a slow reader holds the app back), runs the app on an event loop of
its own (a daemon thread), and raises in the command what the app raised (an unreachable
Redis reads as it always did in direct mode).
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Iterator
from concurrent.futures import Future
from concurrent.futures import wait as wait_for
from typing import TYPE_CHECKING
from urllib.parse import unquote

import httpx

from evalq.producer.clients.remote import RemoteClient
from evalq.shared.access.roles import Caller, Role
from evalq.shared.settings import Settings

if TYPE_CHECKING:
    from fastapi import FastAPI
    from starlette.types import Message, Scope

    from evalq.producer.gateway.context import Context

__all__ = ["AppTransport", "operator_client"]

URL = "http://direct.evalq.invalid"
"""The in-process app's base URL: only :class:`AppTransport` reads it; nothing resolves it."""
QUEUED = 16
"""Messages of one response the app may send before the reader takes them."""
HANG_UP_WAIT = 5.0
"""Seconds a response closed early waits for its route to stop (a stream's last read)."""


def operator_client(settings: Settings, admin: bool = False) -> RemoteClient:
    """The HTTP client of the gateway's app built here for ``settings.principal`` as an
    operator (the admin role: direct mode's operator trust; ``admin`` is ``--admin``)."""
    from evalq.producer.gateway.app import create_gateway

    app = create_gateway(settings, operator=Caller(settings.principal, Role.ADMIN))
    return RemoteClient(URL, None, admin, transport=AppTransport(app))


class _Exchange:
    """One request's messages, between the app (on the loop) and the reader (its thread)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, body: bytes) -> None:
        self._loop = loop
        self._body: bytes | None = body
        self._sent: asyncio.Queue[Message | None] = asyncio.Queue(QUEUED)
        self._hung_up = asyncio.Event()
        self.failure: BaseException | None = None

    async def run(self, app: FastAPI, scope: Scope) -> None:
        """The app's answer to ``scope``; whatever it raises is kept for the reader."""
        try:
            await app(scope, self._receive, self._send)
        except BaseException as exc:
            self.failure = _raised(exc)
        if not self._hung_up.is_set():
            await self._sent.put(None)

    async def _receive(self) -> Message:
        if self._body is not None:
            body, self._body = self._body, None
            return {"type": "http.request", "body": body, "more_body": False}
        await self._hung_up.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: Message) -> None:
        if not self._hung_up.is_set():
            await self._sent.put(message)

    def next(self) -> Message | None:
        """The app's next message (None: it has returned); on the reader's thread."""
        return asyncio.run_coroutine_threadsafe(self._sent.get(), self._loop).result()

    def hang_up(self) -> None:
        """The reader is gone: the app is told so, and what it had queued is dropped."""

        def gone() -> None:
            self._hung_up.set()
            while not self._sent.empty():
                self._sent.get_nowait()

        self._loop.call_soon_threadsafe(gone)


def _raised(exc: BaseException) -> BaseException:
    """What the route raised: an error the app has a handler for, raised once the response has
    started (a results stream's archive found unreadable), comes out of Starlette as a
    ``RuntimeError`` caused by it."""
    started = isinstance(exc, RuntimeError) and "response already started" in str(exc)
    return exc.__cause__ if started and exc.__cause__ is not None else exc


class _Body(httpx.SyncByteStream):
    """A response's body, each chunk as the app sends it."""

    def __init__(self, exchange: _Exchange, done: Future[None]) -> None:
        self._exchange = exchange
        self._done = done
        self._ended = False

    def __iter__(self) -> Iterator[bytes]:
        while (message := self._exchange.next()) is not None:
            if message["type"] == "http.response.body" and message.get("body"):
                yield bytes(message["body"])
        self._ended = True
        if self._exchange.failure is not None:
            raise self._exchange.failure

    def close(self) -> None:
        if not self._ended:
            self._ended = True
            self._exchange.hang_up()
            wait_for([self._done], timeout=HANG_UP_WAIT)


class AppTransport(httpx.BaseTransport):
    """An httpx transport that calls an ASGI app in this process, on an event loop of its
    own, and streams each response as the app sends it."""

    def __init__(self, app: FastAPI) -> None:
        self._app = app
        self._loop = asyncio.new_event_loop()
        thread = threading.Thread(target=_serve, args=(self._loop,), name="evalq-direct")
        thread.daemon = True
        thread.start()
        # a command drops its client without closing it: the app's Redis clients are closed
        # and its loop stopped when the transport goes
        self._stop = weakref.finalize(self, _shut, app.state.context, self._loop, thread)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        exchange = _Exchange(self._loop, request.read())
        scope: Scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": request.method,
            "headers": [(key.lower(), value) for key, value in request.headers.raw],
            "scheme": request.url.scheme,
            "path": unquote(request.url.path),
            "raw_path": request.url.raw_path.split(b"?")[0],
            "query_string": request.url.query,
            "server": (request.url.host, request.url.port),
            "client": None,
            "root_path": "",
        }
        done = asyncio.run_coroutine_threadsafe(exchange.run(self._app, scope), self._loop)
        start = exchange.next()
        while start is not None and start["type"] != "http.response.start":
            start = exchange.next()
        if start is None:  # the app returned without answering: what it raised, raised here
            raise exchange.failure or RuntimeError(
                f"{request.method} {request.url.path}: no answer"
            )
        return httpx.Response(
            start["status"], headers=start.get("headers", []), stream=_Body(exchange, done)
        )

    def close(self) -> None:
        """Close the app's Redis clients, then stop the loop."""
        self._stop()


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    """The app's event loop, until :func:`_stop`."""
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        loop.close()


def _shut(context: Context, loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    """Close the app's Redis clients (its event loop's on that loop), then stop the loop."""
    if loop.is_running():
        closing = asyncio.run_coroutine_threadsafe(context.waits.aclose(), loop)
        wait_for([closing], timeout=HANG_UP_WAIT)
    context.close()
    _stop(loop, thread)


def _stop(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    """Stop the app's loop (from any thread but its own: then it stops when the thread can)."""
    if not loop.is_closed():
        loop.call_soon_threadsafe(loop.stop)
    if thread is not threading.current_thread():
        thread.join()
