"""What evalq reads of an endpoint's answer, and how an error line names what went wrong: the
status's standard phrase, an exception's class, a fixed reason, never the server's words (a
server can send a key back transformed, which no cutting-out of the key catches)."""

from __future__ import annotations

import json
from http import HTTPStatus

import httpx

__all__ = ["Unreadable", "error_kind", "read_body", "status_line", "unreadable"]


class Unreadable(ValueError):
    """An answer of the right shape whose values are not: its message is evalq's own."""


_UNREADABLE: dict[type[BaseException], str] = {
    json.JSONDecodeError: "not JSON",
    RecursionError: "nested too deep",
    UnicodeError: "text that is not UTF-8",
    KeyError: "not the API's shape",
    IndexError: "not the API's shape",
    TypeError: "not the API's shape",
}
"""Why an answer is unreadable, by what reading it raised (most specific first): the reason
an error line gives, never the exception's message (``TypeError`` and ``KeyError`` messages
quote the server's values)."""


def unreadable(exc: BaseException) -> str:
    """Why an answer that raised ``exc`` while it was read is unreadable, in evalq's words."""
    if isinstance(exc, Unreadable):
        return str(exc)
    for kind, reason in _UNREADABLE.items():
        if isinstance(exc, kind):
            return reason
    return f"not the API's JSON: {error_kind(exc)}"


def error_kind(exc: BaseException) -> str:
    """An exception as an error line may name it: its class's name, never its message."""
    return type(exc).__name__


def status_line(code: int) -> str:
    """A status code with its standard phrase (``401 Unauthorized``), never the server's."""
    try:
        return f"{code} {HTTPStatus(code).phrase}"
    except ValueError:
        return str(code)


async def read_body(answer: httpx.Response, limit: int) -> bytes:
    """An answer's body, read no further than ``limit`` bytes and one chunk (a longer one is
    never held whole: its caller sees it is over the bound)."""
    raw = b""
    async for chunk in answer.aiter_bytes():
        raw += chunk
        if len(raw) > limit:
            break
    return raw
