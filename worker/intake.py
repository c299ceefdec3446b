"""The gate every task message passes in a worker's main process, before anything builds a
request from it: a message is a valid evalq payload, or it is dropped.

An exception while a message is handled is raised inside Celery's consumer, where it would stop
the worker, so everything about the message is checked here first, without Redis, and the batch
tasks (:mod:`evalq.worker.batches`) build their requests from what this returns.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from evalq.shared.errors import PayloadError, first_line
from evalq.shared.models import SampleTask

__all__ = ["MAX_BODY_BYTES", "admit"]

JSON = "application/json"
MAX_BODY_BYTES = 64 * 1024
"""Largest body accepted; an evalq payload of the most ids a message may carry, each as large
as an id may be, is about 37 KiB."""
REFUSED_HEADERS = ("eta", "expires", "compression")
"""Headers evalq never sends: a delayed, expiring or compressed message is not one of ours."""
WORKFLOW = ("callbacks", "errbacks", "chain", "chord")
"""Parts of a body's ``embed`` that would make a worker send other tasks after this one."""


def _validation(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"]) or "payload"
    return f"{where}: {error['msg']}"


def admit(message: Any) -> SampleTask:
    """The evalq payload a task message carries, or :class:`PayloadError` saying, in one
    line, why it is not one."""
    if message.content_type != JSON:
        raise PayloadError(f"content type {message.content_type!r} is not {JSON}")
    headers = message.headers
    if not isinstance(headers, dict) or not isinstance(headers.get("id"), str):
        raise PayloadError("no task id header")
    for name in REFUSED_HEADERS:
        if headers.get(name) is not None:
            raise PayloadError(f"header {name!r} is not accepted")
    body = message.body
    if body is None or len(body) > MAX_BODY_BYTES:
        raise PayloadError(f"body is empty or larger than {MAX_BODY_BYTES} bytes")
    try:
        decoded = message.decode()
    except Exception as exc:
        raise PayloadError(f"body cannot be decoded: {first_line(exc)}") from None
    if not isinstance(decoded, list) or len(decoded) != 3:
        raise PayloadError("body is not [args, kwargs, embed]")
    args, kwargs, embed = decoded
    if args != []:
        raise PayloadError("positional arguments are not accepted")
    if not isinstance(embed, dict) or any(embed.get(part) for part in WORKFLOW):
        raise PayloadError("callbacks and workflows are not accepted")
    try:
        return SampleTask.parse(kwargs)
    except ValidationError as exc:
        raise PayloadError(f"not an evalq payload: {_validation(exc)}") from None
