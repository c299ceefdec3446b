"""The gateway's limits on its callers: requests a second per principal (a token bucket each),
open results streams (per principal and in all) and the size of a request body.

Both are kept in the gateway's own process, not in Redis. What they protect is that process —
its event loop, its threads, its memory, its Redis connections — so each replica counts what
it carries. A check is a dictionary look-up on the event loop: it costs no Redis round trip, so
the limiter can neither stall on a slow Redis nor load the Redis the whole fleet shares, and a
refused request costs the gateway almost nothing. The price is that behind R replicas a
principal may send R times the rate; what must hold fleet-wide (what a caller is charged) is
the budget ledger's, atomic in Redis. The limiter and the slots are used from the event loop
only (they take no lock).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from evalq.shared.errors import ThrottledError

__all__ = ["BodyLimit", "RateLimiter", "StreamSlots"]

MAX_BUCKETS = 10_000
"""Buckets kept before the full ones (those of keys quiet for a while) are dropped: a full
bucket is the same as none."""


@dataclass
class _Bucket:
    tokens: float
    at: float
    rate: float
    size: float

    def now(self, at: float) -> float:
        """The tokens in the bucket at ``at``."""
        return min(self.size, self.tokens + (at - self.at) * self.rate)


class RateLimiter:
    """Token buckets by key: each holds up to ``rate * burst`` requests (at least one) and
    refills at ``rate`` a second, so a key may send ``rate`` requests a second on average and
    ``rate * burst`` at once."""

    def __init__(self, burst: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._burst = burst
        self._clock = clock
        self._buckets: dict[tuple[str, str], _Bucket] = {}
        self._pruned = 0.0

    def size(self, rate: float) -> float:
        """The requests a key with ``rate`` may send at once."""
        return max(1.0, rate * self._burst)

    def admit(self, key: tuple[str, str], rate: float) -> float | None:
        """Take one request from ``key``'s bucket: None when admitted, else the seconds until
        it would be. A rate of 0 admits everything."""
        if rate <= 0:
            return None
        at = self._clock()
        bucket = self._buckets.get(key)
        if bucket is None or bucket.rate != rate:
            bucket = _Bucket(self.size(rate), at, rate, self.size(rate))
            self._buckets[key] = bucket
            self._prune(at)
        bucket.tokens, bucket.at = bucket.now(at), at
        if bucket.tokens >= 1:
            bucket.tokens -= 1
            return None
        return (1 - bucket.tokens) / rate

    def _prune(self, at: float) -> None:
        """Drop the full buckets once there are many, at most once a second."""
        if len(self._buckets) <= MAX_BUCKETS or at - self._pruned < 1:
            return
        self._pruned = at
        for key in [k for k, b in self._buckets.items() if b.now(at) >= b.size]:
            del self._buckets[key]


class StreamSlots:
    """Open results streams (or, with another ``what``, requests in flight), counted per
    principal and in all."""

    def __init__(
        self,
        per_principal: int,
        total: int,
        what: tuple[str, str, str] = ("too many streams", "results streams open", "close one"),
    ) -> None:
        self.per_principal = per_principal
        self.total = total
        self._refusal, self._held, self._advice = what
        self._open: dict[str, int] = {}
        self._count = 0

    @property
    def count(self) -> int:
        """Streams open now."""
        return self._count

    def take(self, principal: str) -> Callable[[], None]:
        """A slot for one more stream of ``principal``, and what gives it back (once, however
        often it is called); :class:`ThrottledError` when a cap is reached."""
        held = self._open.get(principal, 0)
        if held >= self.per_principal:
            raise ThrottledError(
                f"{self._refusal}: {principal} has {held} {self._held} on this gateway (at "
                f"most {self.per_principal}); {self._advice} first"
            )
        if self._count >= self.total:
            raise ThrottledError(
                f"{self._refusal}: the gateway has {self._count} {self._held} (at most that "
                "many); try again later"
            )
        self._open[principal] = held + 1
        self._count += 1
        given_back = False

        def give_back() -> None:
            nonlocal given_back
            if given_back:
                return
            given_back = True
            self._count -= 1
            left = self._open[principal] - 1
            if left:
                self._open[principal] = left
            else:
                del self._open[principal]

        return give_back


class _TooLarge(Exception):
    """The body read so far passed the limit (stops the app's read; never leaves BodyLimit)."""


class BodyLimit:
    """ASGI middleware: a request body of more than ``limit`` bytes is answered with
    ``refusal`` (a 413) and never read whole: at once when its ``Content-Length`` says so,
    else as soon as the bytes read pass the limit (whatever the app answered to its failed
    read is dropped). FastAPI's own ``max_body_size`` answers a declared-too-large body with a
    plain-text 413 in place of any response, where the gateway answers its one-line JSON."""

    def __init__(self, app: ASGIApp, limit: int, refusal: Callable[[], Response]) -> None:
        self.app = app
        self.limit = limit
        self.refusal = refusal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > self.limit:
            await self.refusal()(scope, receive, send)
            return
        read, over, started = 0, False, False

        async def counted() -> Message:
            nonlocal read, over
            message = await receive()
            if message["type"] == "http.request":
                read += len(message.get("body", b""))
                if read > self.limit:
                    over = True
                    raise _TooLarge
            return message

        async def sent(message: Message) -> None:
            nonlocal started
            if over:
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, sent)
        except Exception:
            if not over:
                raise
        if over and not started:
            await self.refusal()(scope, receive, send)


class TokenFirst:
    """ASGI middleware: a request that carries a body is let in only once ``check`` (given
    the request's scope, before any byte of the body is read) answers None; else ``check``'s
    response is sent and the body never read. FastAPI reads and parses a JSON body before it
    resolves the route's dependencies (the token among them): without this, anyone could make
    the gateway parse megabytes on its event loop (the attack review: 32 unauthenticated 1 MiB
    bodies at a time held another user's request for 1.8-2.4 s)."""

    def __init__(self, app: ASGIApp, check: Callable[[Scope], Awaitable[Response | None]]) -> None:
        self.app = app
        self.check = check

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = Headers(scope=scope)
            sized = headers.get("content-length", "0") not in ("", "0")
            if sized or "transfer-encoding" in headers:
                refusal = await self.check(scope)
                if refusal is not None:
                    await refusal(scope, receive, send)
                    return
        await self.app(scope, receive, send)
