"""How the gateway answers an error: ``{"error": "<one line>", "exit_code": N}`` with the status
its kind stands for, the exit code the CLI would have exited with in direct mode, and no data
source's path unless the caller may see sources. Policy refusals are audited."""

import logging
import math
import re

import redis
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from evalq.producer.gateway.context import Context, context_of
from evalq.shared.errors import (
    EvalqError,
    InputError,
    PolicyRefusedError,
    StoreError,
    ThrottledError,
    UnauthorizedError,
    UnknownEvalError,
    UnknownRunError,
)
from evalq.shared.store.audit import audit_refusal

__all__ = ["RESPONSES", "ErrorBody", "error", "handle_errors", "throttled", "too_large"]

log = logging.getLogger("evalq.gateway")

_PATH = re.compile(r"(?<![\w.:-])/[^\s'\"]*[^\s'\"),.;:]")
"""An absolute path in an error message: a data source's, which only admins see (the gateway
logs the message whole); the punctuation after it is the message's."""


class ErrorBody(BaseModel):
    error: str
    """One line for a person."""
    exit_code: int
    """What the CLI exits with."""
    retry_after: float | None = None
    """429 only: seconds after which the same request would be admitted (the ``Retry-After``
    header rounds it up to whole seconds); absent when a stream cap refused."""


RESPONSES: dict[int | str, dict[str, object]] = {
    401: {"model": ErrorBody, "description": "No token, or an unknown one"},
    403: {"model": ErrorBody, "description": "Refused by role, tier or budget"},
    413: {"model": ErrorBody, "description": "A request body over the gateway's limit"},
    422: {"model": ErrorBody, "description": "Invalid request"},
    429: {"model": ErrorBody, "description": "Too many requests or open streams"},
}
"""The error answers every route may give (in the OpenAPI schema)."""


def error(message: str, code: int, status: int) -> JSONResponse:
    """An error answer (a 401 says which scheme would do)."""
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse({"error": message, "exit_code": code}, status_code=status, headers=headers)


def throttled(exc: ThrottledError) -> JSONResponse:
    """A 429, with when to try again where a rate limit (not a stream cap) refused."""
    body: dict[str, object] = {"error": str(exc), "exit_code": exc.exit_code}
    headers = None
    if exc.retry_after is not None:
        body["retry_after"] = round(exc.retry_after, 3)
        headers = {"Retry-After": str(max(1, math.ceil(exc.retry_after)))}
    return JSONResponse(body, status_code=429, headers=headers)


def too_large(limit: int) -> JSONResponse:
    """A 413 for a body over ``limit`` bytes."""
    message = f"request body too large: the gateway takes at most {limit} bytes"
    return error(message, InputError.exit_code, 413)


def handle_errors(api: FastAPI) -> None:
    """Answer evalq's errors, rate limits, invalid requests and an unreachable Redis as
    :func:`error` does."""
    api.add_exception_handler(EvalqError, _evalq_error)
    api.add_exception_handler(ThrottledError, _too_many)
    api.add_exception_handler(RequestValidationError, _invalid)
    api.add_exception_handler(redis.RedisError, _redis_down)
    api.add_exception_handler(HTTPException, _http)


def _status_of(exc: EvalqError) -> int:
    if isinstance(exc, UnauthorizedError):
        return 401
    if isinstance(exc, PolicyRefusedError):
        return 403
    if isinstance(exc, UnknownRunError):
        return 404
    if isinstance(exc, InputError):
        return 400
    if isinstance(exc, StoreError):
        return 503
    return 409


def _evalq_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, EvalqError)
    context = context_of(request)
    _raise_in_direct_mode(context, exc)
    if isinstance(exc, PolicyRefusedError):
        who = getattr(request.state, "principal", "anonymous")
        audit_refusal(context.store, who, f"{request.method} {request.url.path}", str(exc))
    message = exc.on("the gateway") if isinstance(exc, UnknownEvalError) else str(exc)
    if not getattr(request.state, "sees_sources", False):
        hidden = _PATH.sub("<path>", message)
        if hidden != message:
            log.warning("%s %s: %s", request.method, request.url.path, message)
        message = hidden
    return error(message, exc.exit_code, _status_of(exc))


async def _too_many(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ThrottledError)
    _raise_in_direct_mode(context_of(request), exc)
    return throttled(exc)  # not audited: a flood of them would grow the audit stream


def _invalid(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    unknown = _unknown_run(exc)
    if unknown is not None:
        return error(unknown, UnknownRunError.exit_code, 404)
    return error(_validation_message(exc), InputError.exit_code, 422)


def _http(request: Request, exc: Exception) -> JSONResponse:
    """Starlette's own refusals (an unknown route, a wrong method, a body it cannot parse,
    such as a compressed one) in the same shape as every other error."""
    assert isinstance(exc, HTTPException)
    code = InputError.exit_code if exc.status_code < 500 else 1
    answer = error(str(exc.detail), code, exc.status_code)
    answer.headers.update(exc.headers or {})
    return answer


def _raise_in_direct_mode(context: Context, exc: Exception) -> None:
    """In direct mode's app (the operator's, in its own process) an error is not answered but
    goes on: :class:`evalq.producer.clients.inprocess.AppTransport` raises it in the command, which
    says and exits what direct mode always did (the same exception: no refusal audited, an
    unknown evaluation named as this process's, Redis unreachable as such)."""
    if context.operator is not None:
        raise exc


def _redis_down(request: Request, exc: Exception) -> JSONResponse:
    _raise_in_direct_mode(context_of(request), exc)
    log.warning("redis error on %s %s: %s", request.method, request.url.path, exc)
    return error("the gateway cannot reach its Redis; try again", 1, 503)


def _unknown_run(exc: RequestValidationError) -> str | None:
    """``no run 'X'`` when the request names a run by something that cannot be a run id (a
    path's ``run_id``, a ``run`` query or body field): no run has it, whatever its shape."""
    first = exc.errors()[0]
    named = [part for part in first.get("loc", ()) if isinstance(part, str)]
    if first.get("type") == "string_pattern_mismatch" and named[-1:] in (["run_id"], ["run"]):
        return str(UnknownRunError.named(first.get("input")))
    return None


def _validation_message(exc: RequestValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first.get("loc", ()))
    message = str(first.get("msg", "invalid")).removeprefix("Value error, ")
    return f"invalid request: {where}: {message}"
