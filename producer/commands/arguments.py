"""The arguments several of the producer's commands take: runs named by their ids."""

from __future__ import annotations

from typing import Annotated

import typer

from evalq.shared.names import check_run_id

__all__ = ["RunArg", "check_run_ids"]

RunArg = Annotated[str, typer.Argument(metavar="RUN", callback=check_run_id)]
"""One RUN argument, checked to be a run id (a usage error, exit code 2, when not)."""


def check_run_ids(values: list[str] | None) -> list[str] | None:
    """Each of several RUN arguments checked as :data:`RunArg` checks one (a callback)."""
    return None if values is None else [check_run_id(value) for value in values]
