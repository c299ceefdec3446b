"""The worker's command: ``evalq worker`` (registered through the ``evalq.commands`` entry
point) and ``python -m evalq.worker``, which is the same command on its own."""

from __future__ import annotations

from typing import Annotated

import typer

from evalq.shared.cli import run

__all__ = ["main", "register"]


def worker(
    queues: Annotated[str, typer.Option(help="Comma-separated queues: infer, score.")] = (
        "infer,score"
    ),
    concurrency: Annotated[int, typer.Option(min=1, help="Worker processes (one per GPU).")] = 1,
    loglevel: Annotated[str, typer.Option(help="Celery log level.")] = "INFO",
) -> None:
    """Run a Celery worker (what `celery -A evalq.worker.celery worker` runs, with evalq's
    options)."""
    from evalq.shared.settings import get_settings
    from evalq.worker.bootstrap import run_worker

    run_worker(get_settings(), queues=queues, concurrency=concurrency, loglevel=loglevel)


def register(app: typer.Typer) -> None:
    """Add ``worker`` to the ``evalq`` app."""
    app.command()(worker)


def main() -> None:
    """``python -m evalq.worker``."""
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    register(app)
    run(app)
