"""The gateway's results streams (``GET /v1/runs/{run}/results``, followed or not).

Each stream is an async generator on the event loop. Its reads of Redis run on the gateway's
stream threads (:data:`STREAM_THREADS`, apart from the thread pool the request routes share),
a batch of lines at a time, never one thread per stream; a followed run's stream waits for
new results with ``XREAD BLOCK`` on :mod:`redis.asyncio`, holding no thread while nothing
settles. Streams are counted (:class:`evalq.producer.gateway.limits.StreamSlots`) from before their
first read until they end, however they end: the run ends, the caller hangs up, or its token is
revoked (its last line is then :data:`REVOKED`, an error in the shape of every other: a
stream that simply stopped would read as the run's end).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from itertools import islice
from typing import TypeVar

import anyio
import redis.asyncio
from anyio import to_thread
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from evalq.producer.gateway.limits import StreamSlots
from evalq.producer.service.follower import Follower
from evalq.producer.service.views import READ_BYTES
from evalq.shared.errors import UnauthorizedError
from evalq.shared.models import to_json
from evalq.shared.store.wire import result_line

__all__ = ["REVOKED", "STREAM_THREADS", "ResultStream", "Streams"]

T = TypeVar("T")

REVOKED = (
    to_json(
        {
            "error": "unauthorized: unknown or revoked token",
            "exit_code": UnauthorizedError.exit_code,
        }
    )
    + "\n"
)
"""The last line of a followed stream whose token was revoked while it was open."""

STREAM_THREADS = 8
"""Threads the streams' reads share (the request routes keep Starlette's own 40)."""
WAIT_MS = 1000
"""How long a followed stream waits on the settled stream before it looks again whether the
run ended (a cancelled run writes nothing there) and its token is still live..."""
IDLE_WAIT_MS = 4000
"""...doubling while nothing settles, up to this: an idle follow (a queued or stalled run) costs
one look every 4 s, not every second (400 idle follows took 35% of a core at 1 s)."""
LINES = 1000
"""Lines read and sent at a time, at most..."""


class ResultStream(StreamingResponse):
    """A results stream (or a run's events) that gives its slot back when it ends, however it
    ends."""

    def __init__(
        self,
        lines: AsyncIterator[str],
        give_back: Callable[[], None],
        media_type: str = "application/x-ndjson",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(lines, media_type=media_type, headers=headers)
        self._give_back = give_back

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._give_back()


class Streams:
    """The gateway's open results streams: their slots, their threads and their waits."""

    def __init__(self, slots: StreamSlots, client: redis.asyncio.Redis) -> None:
        self.slots = slots
        self._client = client
        self._threads: anyio.CapacityLimiter | None = None

    async def run(self, read: Callable[[], T]) -> T:
        """``read()`` on a stream thread."""
        if self._threads is None:  # made on the event loop that uses it
            self._threads = anyio.CapacityLimiter(STREAM_THREADS)
        return await to_thread.run_sync(read, limiter=self._threads)

    async def lines(self, lines: Iterator[str]) -> AsyncIterator[str]:
        """``lines``, read on the stream threads :data:`LINES` at a time, or fewer once they
        take :data:`evalq.producer.service.views.READ_BYTES`: an unread stream holds one such
        chunk."""

        def batch() -> str:
            taken, size = [], 0
            for line in islice(lines, LINES):
                taken.append(line)
                size += len(line)
                if size >= READ_BYTES:
                    break
            return "".join(taken)

        while chunk := await self.run(batch):
            yield chunk

    async def follow(
        self, follower: Follower, live: Callable[[], Awaitable[bool]]
    ) -> AsyncIterator[str]:
        """The run's results as they settle, until it ends or ``live()`` (asked at every
        wait, and at least every :data:`WAIT_MS` while results come) says the caller's token
        was revoked."""

        def step() -> str | None:
            found = follower.step()
            return None if found is None else "".join(map(result_line, found))

        asked, wait = time.monotonic(), WAIT_MS
        while (chunk := await self.run(step)) is not None:
            if chunk:
                yield chunk
                wait = WAIT_MS
            if not chunk or time.monotonic() - asked >= WAIT_MS / 1000:
                if not await live():
                    yield REVOKED
                    return
                asked = time.monotonic()
            if not chunk:
                found = await self._client.xread(
                    {follower.stream: follower.cursor}, count=1, block=wait
                )
                wait = WAIT_MS if found else min(2 * wait, IDLE_WAIT_MS)
