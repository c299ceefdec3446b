"""The task registry: language-model tasks (:class:`evalq.shared.lm.task.TaskSpec`, written as YAML)
registered by an admin under a name, in ``evalq:tasks``.

A caller names a registered task and never sends one: a task's scorer, template and few-shot
split are the admin's choice, so no caller can make a worker run code or read a split through
a task. A task's name cannot be a Python evaluation's (one name, one meaning). A run keeps the
task as it was at submission (in its record), so replacing a task changes no run.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import redis

from evalq.shared.access.task import RegisteredTask
from evalq.shared.errors import InputError
from evalq.shared.evaluation import registered
from evalq.shared.keys import AUDIT, TASKS
from evalq.shared.lm.harness import HarnessSpec
from evalq.shared.lm.task import TaskSpec
from evalq.shared.names import PLUGIN_NAME
from evalq.shared.store.scripts import register

__all__ = ["TaskRegistry"]


class TaskRegistry:
    """Registered tasks in ``evalq:tasks``; owns ``add_task.lua``."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._add = register(client, "evalq.shared.access", "add_task", confirmed=True)

    def add(
        self,
        name: str,
        text: str,
        *,
        who: str,
        check: Callable[[TaskSpec], None] | None = None,
    ) -> tuple[RegisteredTask, RegisteredTask | None]:
        """Register the task file ``text`` (YAML) as ``name`` (or replace it), audited; return
        the record and the one it replaced. :class:`InputError` (exit 2), one line, for a bad
        name, a Python evaluation's name or a bad file (its scorer checked against this
        process's: :meth:`TaskSpec.check_scorer`), or what ``check`` refuses of the task
        (a split it is checked against), before anything is stored."""
        _check_name(name)
        spec = TaskSpec.from_yaml(text)
        if check is not None:
            check(spec)
        return self._store(name, spec, spec.digest, who)

    def add_harness(
        self, name: str, resolve: Callable[[], HarnessSpec], *, who: str
    ) -> tuple[RegisteredTask, RegisteredTask | None]:
        """Register the lm-eval task ``resolve`` gives (lm-eval's ``TaskManager``, its files
        pinned: :func:`evalq.shared.lm.lmeval.resolve`) as ``name`` (or replace it), audited
        like :meth:`add`; the name is checked before lm-eval is asked."""
        _check_name(name)
        spec = resolve()
        return self._store(name, spec, spec.digest, who)

    def _store(
        self, name: str, spec: TaskSpec | HarnessSpec, digest: str, who: str
    ) -> tuple[RegisteredTask, RegisteredTask | None]:
        record = RegisteredTask(name=name, spec=spec, digest=digest, who=who, added=time.time())
        before = self._add(
            keys=[TASKS, AUDIT], args=[name, record.model_dump_json(), who, time.time()]
        )
        return record, RegisteredTask.model_validate_json(before) if before else None

    def get(self, name: str) -> RegisteredTask | None:
        """The record of ``name``, or None when no task of that name is registered."""
        raw = self._client.hget(TASKS, name)
        return None if raw is None else RegisteredTask.model_validate_json(raw)

    def all(self) -> list[RegisteredTask]:
        """Every registered task, by name."""
        raw = self._client.hgetall(TASKS)
        return [RegisteredTask.model_validate_json(raw[name]) for name in sorted(raw)]


def _check_name(name: str) -> None:
    """:class:`InputError` for a name a task may not have: not a plugin-like name, or a Python
    evaluation's (one name, one meaning)."""
    if not PLUGIN_NAME.match(name):
        raise InputError(
            f"invalid task name {name!r}: 1-128 lower-case letters, digits, '_', '-' or "
            "'.', starting with a letter or digit"
        )
    if name in registered():
        raise InputError(f"'{name}' is a Python evaluation's name: choose another task name")
