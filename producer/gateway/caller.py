"""Who a request's token stands for (:data:`Who`), held to its limits: a caller without a known
token to the anonymous rate of its address and then refused; a known one to its principal's
rate and its requests in flight. All on the event loop, before the request takes a thread: a
refused request never does."""

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import Scope

from evalq.producer.gateway.context import Context, Shared
from evalq.producer.gateway.errors import error, throttled
from evalq.shared.access.roles import Caller, Role, sees_sources
from evalq.shared.errors import ThrottledError, UnauthorizedError
from evalq.shared.store.audit import audit_refusal

__all__ = ["Who", "caller", "token_first"]

bearer = HTTPBearer(auto_error=False, description="An API token: evalq tokens create")


def _admit(context: Context, key: tuple[str, str], rate: float, who: str) -> None:
    """Take one request from ``key``'s rate limit (:class:`ThrottledError` when it is spent)."""
    wait = context.limiter.admit(key, rate)
    if wait is not None:
        raise ThrottledError(
            f"rate limited: {who} sent more than {rate:g} requests a second (at most "
            f"{context.limiter.size(rate):g} at once); try again in {wait:.1f} s",
            retry_after=wait,
        )


async def _identify(context: Context, token: str | None, address: str) -> tuple[Caller, str]:
    """Who ``token`` stands for, and its digest; a caller without a known token is held
    to the anonymous rate of its ``address`` (:class:`ThrottledError`), then refused
    (:class:`UnauthorizedError`)."""
    found = None if token is None else await context.lookup.caller(token)
    if found is None:
        rate = context.settings.gateway_rate
        _admit(context, ("anonymous", address), rate, f"anonymous caller {address}")
        if token is None:
            raise UnauthorizedError("unauthorized: no token (set EVALQ_TOKEN)")
        raise UnauthorizedError("unauthorized: unknown or revoked token")
    return found


async def token_first(context: Context, scope: Scope) -> Response | None:
    """A request with a body: its caller first (a 401, or the anonymous rate limit's 429,
    before the body is read: :class:`evalq.producer.gateway.limits.TokenFirst`); a known one is kept
    for :func:`caller`."""
    scheme, _, token = Headers(scope=scope).get("authorization", "").partition(" ")
    given = token.strip() if scheme.lower() == "bearer" and token.strip() else None
    client = scope.get("client")
    try:
        found = await _identify(context, given, client[0] if client else "unknown")
    except ThrottledError as exc:
        return throttled(exc)
    except UnauthorizedError as exc:
        audit_refusal(context.store, "anonymous", f"{scope['method']} {scope['path']}", str(exc))
        return error(str(exc), exc.exit_code, 401)
    scope.setdefault("state", {})["identified"] = found
    return None


async def caller(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    context: Shared,
) -> AsyncIterator[Caller]:
    """The request's caller, admitted by its principal's rate and holding one of its requests
    in flight while its route works (``request.state.working()`` gives it back sooner: a
    results stream holds a stream slot instead). The request's state keeps the principal,
    whether it sees data sources and its token's digest, for the error answers and streams.
    In direct mode's app the caller is the operator, held to no limit."""
    if context.operator is not None:
        request.state.principal = context.operator.principal
        request.state.sees_sources = sees_sources(context.operator)
        request.state.token = None
        request.state.working = _nothing
        yield context.operator
        return
    found = getattr(request.state, "identified", None)  # token_first's, for a body's
    if found is None:
        token = None if credentials is None else credentials.credentials
        address = request.client.host if request.client else "unknown"
        found = await _identify(context, token, address)
    who, digest = found
    request.state.principal = who.principal
    request.state.sees_sources = sees_sources(who)
    request.state.token = digest
    settings = context.settings
    rate = settings.gateway_admin_rate if who.role is Role.ADMIN else settings.gateway_rate
    _admit(context, ("principal", who.principal), rate, who.principal)
    give_back = context.working.take(who.principal)
    request.state.working = give_back
    try:
        yield who
    finally:
        give_back()


def _nothing() -> None:
    """The operator holds no request slot: there is nothing to give back."""


Who = Annotated[Caller, Depends(caller, scope="function")]
"""A route's or dependency's parameter receiving the request's caller (held to its limits
until the route returns)."""
