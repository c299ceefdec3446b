"""``evalq api``: any route of the gateway from the command line, as ``gh api`` calls GitHub's
(through the gateway with ``EVALQ_API_URL``, else in this process as the operator), so an
operation the gateway answers with JSON needs no command of its own."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from evalq.producer.clients.api import open_api
from evalq.shared.cli import AdminFlag, print_json
from evalq.shared.errors import InputError

__all__ = ["api"]

METHODS = ("GET", "POST", "PUT", "DELETE")


def _query(fields: list[str]) -> dict[str, list[str]]:
    """``KEY=VALUE`` fields as the query (a key given twice is sent twice)."""
    query: dict[str, list[str]] = {}
    for field in fields:
        key, sep, value = field.partition("=")
        if not sep or not key:
            raise InputError(f"--field {field!r}: expected KEY=VALUE")
        query.setdefault(key, []).append(value)
    return query


def _body(text: str | None) -> Any:
    """The request's JSON body, parsed (None without one)."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise InputError(f"--body is not JSON: {exc}") from None


def api(
    path: Annotated[
        str,
        typer.Argument(help="A route of the gateway, e.g. /v1/runs/counts (the gateway's /docs)."),
    ],
    field: Annotated[
        list[str] | None,
        typer.Option("--field", "-f", help="A query parameter, KEY=VALUE (repeatable)."),
    ] = None,
    method: Annotated[
        str, typer.Option("--method", "-X", help="GET, POST, PUT or DELETE.")
    ] = "GET",
    body: Annotated[str | None, typer.Option(help="The request's body, JSON.")] = None,
    admin: AdminFlag = False,
) -> None:
    """Call any route of the gateway and print its JSON answer (errors exit as their commands'
    do)."""
    verb = method.upper()
    if verb not in METHODS:
        raise InputError(f"--method {method!r}: one of {', '.join(METHODS)}")
    if not path.startswith("/v1/"):
        raise InputError(f"{path!r} is not a route of the gateway (they begin /v1/)")
    client = open_api(admin=admin)
    try:
        answer = client.call(verb, path, _body(body), **_query(field or []), **client.flag())
    except ValueError as exc:  # a stream of JSON lines, or HTML: not one JSON value
        raise InputError(f"{path} answers no single JSON value ({exc})") from None
    print_json(answer)
