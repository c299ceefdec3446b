"""The producer's commands of ``evalq``, added to the app of :mod:`evalq.shared.cli` through the
``evalq.commands`` entry point (:func:`register`), by group: :mod:`~evalq.producer.commands.submit`;
:mod:`~evalq.producer.commands.runs` (status, watch, runs, results, cancel, resume);
:mod:`~evalq.producer.commands.analysis` (compare, rescore, report);
:mod:`~evalq.producer.commands.tasks` (language tasks);
:mod:`~evalq.producer.commands.operations` (demo, metrics, serve, acl, purge, retention, up);
:mod:`~evalq.producer.commands.route` (api: any route of the gateway); and
:mod:`~evalq.producer.commands.policy` (the admin groups: datasets, tiers, budget, policy, tokens,
and audit). Commands that only talk to Redis import neither torch nor any model.
"""

from __future__ import annotations

from collections.abc import Callable

import typer

from evalq.producer.commands import policy
from evalq.producer.commands.analysis import compare, report, rescore
from evalq.producer.commands.operations import acl, demo, metrics, purge, retention, serve, up
from evalq.producer.commands.route import api
from evalq.producer.commands.runs import cancel, results, resume, runs, status, watch
from evalq.producer.commands.submit import submit_command
from evalq.producer.commands.tasks import tasks_app

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    """Add the producer's commands to the ``evalq`` app (in the order ``evalq --help`` lists
    them)."""
    commands: tuple[Callable[..., None], ...] = (
        demo,
        status,
        watch,
        runs,
        results,
        compare,
        rescore,
        report,
        metrics,
        serve,
        acl,
        cancel,
        resume,
        purge,
        retention,
        up,
        api,
    )
    for command in commands:
        app.command()(command)
    app.command("submit")(submit_command)
    app.add_typer(tasks_app, name="tasks")
    policy.register(app)
