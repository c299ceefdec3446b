"""The ``evalq`` command line's frame (typer + rich): one app, output helpers, exit codes.

The frame owns no command. ``producer/`` and ``worker/`` each add theirs through the
``evalq.commands`` entry-point group declared in ``pyproject.toml`` (a ``register(app)``
function each), the way Celery's own CLI loads its ``celery.commands`` group; so the contract
package never imports either side, and the worker never imports the producer.

Exit codes: 0 ok, 1 error, 2 bad input or usage, 3 refused by policy, 4 a followed run ended
failed or cancelled, 130 a person stopped following a run (Ctrl-C: the run goes on). Errors
print one line on stderr, never a traceback.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.text import Text

from evalq.shared.errors import DetachedError, EvalqError

if TYPE_CHECKING:
    from pydantic import ValidationError

__all__ = [
    "COMMANDS_GROUP",
    "AdminFlag",
    "JsonFlag",
    "create_cli",
    "err",
    "main",
    "out",
    "python",
    "redis_unreachable",
    "run",
]

COMMANDS_GROUP = "evalq.commands"
"""Entry-point group of ``register(app: typer.Typer) -> None`` functions."""

# Markup off: user text (paths, split names, error messages) is printed as given, never parsed
# as rich markup; styled parts are passed as Text.
out = Console(markup=False)
err = Console(stderr=True, markup=False)

JsonFlag = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]
AdminFlag = Annotated[
    bool, typer.Option("--admin", help="Bypass tier and budget (recorded in the audit stream).")
]


def print_json(value: Any) -> None:
    """One line of JSON on stdout, keys sorted."""
    typer.echo(json.dumps(value, sort_keys=True, default=str))


def python(*args: str) -> list[str]:
    """This interpreter with ``args``, the way evalq starts its own processes: ``-P`` keeps the
    working directory off ``sys.path`` (``-m`` and ``-c`` would put it first), so a user's own
    ``evalq.py`` where they run evalq never stands in for evalq. (evalq installs one top-level
    name, ``evalq``: its packages are ``evalq.shared``, ``evalq.producer`` and ``evalq.worker``,
    so a user's ``worker.py`` or ``shared.py`` is never in the way at all.)"""
    return [sys.executable, "-P", *args]


def create_cli() -> typer.Typer:
    """The ``evalq`` app with every installed side's commands."""
    app = typer.Typer(
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        help="evalq: metered, label-safe model evaluation on Celery + Redis.",
    )
    found = sorted(entry_points(group=COMMANDS_GROUP), key=lambda e: e.name)
    if not found:
        raise EvalqError("evalq is not installed (no evalq.commands entry points): pip install .")
    for entry in found:
        entry.load()(app)
    return app


def _fail(message: str, code: int) -> NoReturn:
    err.print(Text.assemble(("error:", "red"), " ", message), highlight=False, soft_wrap=True)
    raise SystemExit(code)


def _setting_problem(exc: ValidationError) -> str:
    first = exc.errors()[0]
    name = "_".join(str(part) for part in first["loc"]).upper()
    return f"invalid setting EVALQ_{name}: {first['msg']}"


def _input_problem(exc: ValidationError) -> str:
    """A request (``SubmitRequest``, ``RescoreRequest``, …) the CLI built from bad options."""
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or exc.title
    return f"invalid {exc.title} {where}: {first['msg']}"


def run(app: typer.Typer, argv: Sequence[str] | None = None) -> None:
    """Run ``app``; evalq's errors, a bad setting and an unreachable Redis become one line on
    stderr and an exit code."""
    try:
        app(args=list(argv) if argv is not None else sys.argv[1:], prog_name="evalq")
    except DetachedError as exc:
        err.print(str(exc), highlight=False, soft_wrap=True)
        raise SystemExit(exc.exit_code) from None
    except EvalqError as exc:
        _fail(str(exc), exc.exit_code)
    except Exception as exc:
        problem = _invalid_input(exc)
        if problem is not None:
            _fail(problem, 2)
        if not redis_unreachable(exc):
            raise
        from evalq.shared.connection import redact
        from evalq.shared.settings import get_settings

        url = redact(get_settings().redis_url)
        _fail(f"cannot reach Redis at {url} (set EVALQ_REDIS_URL): {exc}", 1)


def _invalid_input(exc: BaseException) -> str | None:
    """The one line for pydantic's validation error (a bad setting, or a request the CLI built
    from bad options), None for any other error. pydantic is imported by the settings and the
    models a command uses, never here (``--help`` and a usage error load none of it): an error
    cannot be pydantic's when pydantic_core was never imported."""
    found = sys.modules.get("pydantic_core")
    if found is None or not isinstance(exc, found.ValidationError):
        return None
    return _setting_problem(exc) if exc.title == "Settings" else _input_problem(exc)


def redis_unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` is redis-py's connection error or timeout. redis is imported by the
    commands that talk to it, never here (a command through the gateway, ``--help`` and a usage
    error load none of it): an error cannot be redis's when redis was never imported."""
    found = sys.modules.get("redis")
    return found is not None and isinstance(exc, (found.ConnectionError, found.TimeoutError))


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point of ``evalq``."""
    try:
        app = create_cli()
    except EvalqError as exc:
        _fail(str(exc), exc.exit_code)
    run(app, argv)
