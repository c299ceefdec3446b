"""Priorities: the default priorities, per principal and per split, set by ``evalq policy apply``
(audited), and the rule of which priority a run gets and who may ask for more
(:func:`admit_priority`)."""

from __future__ import annotations

from dataclasses import dataclass

import redis

from evalq.shared.connection import confirmed
from evalq.shared.errors import ForbiddenError
from evalq.shared.keys import PRIORITIES
from evalq.shared.models import Priority
from evalq.shared.names import check_name
from evalq.shared.store.audit import record

__all__ = ["Defaults", "PriorityStore", "admit_priority"]


@dataclass(frozen=True, slots=True)
class Defaults:
    """The default priorities that apply to one submission (None: not set)."""

    principal: Priority | None
    split: Priority | None


def admit_priority(
    requested: Priority | None,
    *,
    principal_default: Priority | None,
    split_default: Priority | None,
    admin: bool,
) -> Priority:
    """A run's priority: the one asked for, else the principal's default, else the split's,
    else ``normal``. A non-admin may ask for less than that default but not for more: the
    priority weights a principal's share against the others', so only the policy grants
    ``high``."""
    default = principal_default or split_default or Priority.NORMAL
    if requested is None:
        return default
    if not admin and requested.rank > default.rank:
        raise ForbiddenError(
            f"forbidden: priority '{requested}' is above this caller's '{default}' (an admin "
            "grants more with a priority in the policy file)"
        )
    return requested


def _field(kind: str, name: str) -> str:
    return f"{kind}:{name}"


def _read(raw: object) -> Priority | None:
    try:
        return None if raw is None else Priority(str(raw))
    except ValueError:
        return None  # an unreadable entry is no default (normal applies): it grants nothing


class PriorityStore:
    """Default priorities in ``evalq:priorities`` (``principal:<name>`` and
    ``split:<dataset>/<split>`` -> priority)."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client

    def defaults(self, principal: str, dataset: str, split: str) -> Defaults:
        """The defaults of ``principal`` and of ``dataset/split``."""
        mine, theirs = self._client.hmget(
            PRIORITIES, [_field("principal", principal), _field("split", f"{dataset}/{split}")]
        )
        return Defaults(_read(mine), _read(theirs))

    def set_principal(self, principal: str, priority: Priority, *, who: str) -> None:
        """Set ``principal``'s default priority (audited)."""
        check_name("principal", principal)
        self._set(_field("principal", principal), priority, who, principal=principal)

    def set_split(self, dataset: str, split: str, priority: Priority, *, who: str) -> None:
        """Set ``dataset/split``'s default priority (audited)."""
        check_name("dataset name", dataset)
        check_name("split", split)
        where = f"{dataset}/{split}"
        self._set(_field("split", where), priority, who, dataset=dataset, split=split)

    def _set(self, field: str, priority: Priority, who: str, **where: str) -> None:
        def write(one: redis.Redis) -> None:
            with one.pipeline(transaction=True) as pipe:
                pipe.hset(PRIORITIES, field, priority.value)
                record(pipe, "priority_set", who, after=priority.value, **where)
                pipe.execute()

        confirmed(self._client, write)

    def listed(self) -> dict[str, Priority]:
        """Every default: ``principal:<name>`` / ``split:<dataset>/<split>`` -> priority."""
        found = {str(k): _read(v) for k, v in self._client.hgetall(PRIORITIES).items()}
        return {k: v for k, v in sorted(found.items()) if v is not None}
