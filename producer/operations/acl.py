"""``evalq acl``: a Redis ACL file with one user per role, so that no credential but the
gateway's can change what the policy rests on.

- ``gateway``: every evalq key and the broker (it is the operator's credential too: direct-mode
  commands such as ``evalq tokens create`` bootstrap with it).
- ``worker``: the broker's queues, run state, results and backlogs, the fair dispatcher's
  state, heartbeats and the janitor's lease, spec reads (and the shard digests it records),
  runs' facts read only (``evalq:facts:{run}``: what the gateway decides by), the listed
  endpoints read only, their rate limiters (``evalq:rate:*``) and the response cache, the
  budgets read only (a token budget's total) and the token ledger beside them
  (``evalq:spend:*``, the holds, the runs whose unsent samples are owed back: only workers see
  an endpoint's usage), the task registry read only (``evalq:tasks``: every registered task's
  label fields are scrubbed from rows before inference, whichever task runs); no tier, token,
  dataset registry, priority or audit key, and no budget or task write.
- ``monitor``: what Flower and ``evalq metrics`` read (queues, run records and counters,
  budgets and tokens spent, heartbeats, the dispatcher's state, the endpoints' counts), the
  broker's control
  replies, and kombu's
  ``unacked_mutex`` (a lock that every kombu consumer, Flower's inspection replies included,
  takes before it looks for messages to put back: without it each ``celery inspect`` is
  refused); never a per-sample result hash, and no queue it could write to.

Every user is denied the ``@dangerous`` commands (``FLUSHALL``, ``CONFIG``, ``KEYS``, ...), the
worker and the monitor also ``FUNCTION`` and ``SCRIPT FLUSH``/``KILL``; the monitor only reads
the work queues.

``default`` stays on, with every right, behind a random password that is thrown away once its
digest is written: a connection that does not authenticate is refused (``NOAUTH``), and nobody
can authenticate as ``default``. It cannot simply be switched off: Redis replays the AOF's
``MULTI``/``EXEC`` blocks (every transaction and every Lua script's effects) as ``default`` and,
before the fix of redis/redis#14541, checks its rights, so with ``default off`` a restart
silently drops them (seen on Redis 7.0.15; ``tests/test_gateway.py`` restarts Redis to check).

Passwords come from ``EVALQ_ACL_GATEWAY_PASSWORD``, ``EVALQ_ACL_WORKER_PASSWORD`` and
``EVALQ_ACL_MONITOR_PASSWORD`` and are written as sha256 digests (``#<hex>``), so the file
holds no password and is world-readable (mode 644), as Redis's own ``ACL SAVE`` writes it: the
Redis server runs as another user than its writer.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Mapping
from pathlib import Path

from evalq.shared.errors import InputError
from evalq.shared.keys import (
    ACTIVE,
    ANY,
    CACHE,
    ENDPOINTS,
    FAIR,
    HOLD_DEADLINES,
    HOLDS,
    JANITOR,
    RATE,
    RUN_KEYS,
    RUNS,
    SPEND,
    TASKS,
    UNSENT,
    RunKeys,
    budget_key,
    shard_digests_key,
    spec_key,
    worker_key,
)
from evalq.shared.queue.broker import CONTROL_PATTERNS, QUEUE_PATTERNS, UNACKED_MUTEX

__all__ = ["ROLES", "acl_text", "password_variable", "write_acl"]

_CONTROL = tuple(f"~{pattern}" for pattern in CONTROL_PATTERNS)

_LOCKED = ("-@dangerous", "-function", "-script|flush", "-script|kill")
"""No server administration, no server-side functions, no flushing another user's scripts."""

_BROKER = (
    *(f"~{q}" for q in QUEUE_PATTERNS),
    *_CONTROL,
)

_ANY_RUN = RunKeys(ANY)
"""Every run's keys, as glob patterns (the key names come from :mod:`evalq.shared.keys`)."""


def _read(*patterns: str) -> tuple[str, ...]:
    return tuple(f"%R~{pattern}" for pattern in patterns)


def _write(*patterns: str) -> tuple[str, ...]:
    return tuple(f"~{pattern}" for pattern in patterns)


ROLES: dict[str, tuple[str, ...]] = {
    "gateway": ("~*", "&*", "+@all", "-@dangerous"),
    "worker": (
        *_BROKER,
        *_write(RUN_KEYS),
        *_read(_ANY_RUN.facts),
        *_write(worker_key(ANY), JANITOR, ACTIVE, f"{FAIR.prefix}{ANY}"),
        *_read(spec_key(ANY), ENDPOINTS, budget_key(ANY, ANY), TASKS),
        *_write(shard_digests_key(ANY), f"{RATE}{ANY}", f"{CACHE}{ANY}"),
        *_write(f"{SPEND}{ANY}", HOLDS, HOLD_DEADLINES, UNSENT),
        "&*",
        "+@all",
        *_LOCKED,
    ),
    "monitor": (
        *_read(*QUEUE_PATTERNS),
        f"~{UNACKED_MUTEX}",
        *_CONTROL,
        *_read(RUNS, _ANY_RUN.facts, _ANY_RUN.meta, _ANY_RUN.progress),
        *_read(budget_key(ANY, ANY), worker_key(ANY), ACTIVE, f"{FAIR.prefix}{ANY}"),
        *_read(ENDPOINTS, f"{RATE}{ANY}", f"{SPEND}{ANY}"),
        "&*",
        "+@all",
        *_LOCKED,
    ),
}
"""Each user's ACL rules after its password: key patterns (``%R~``: read only), channels, and
command categories."""


SERVICE_ROLES: dict[str, tuple[str, ...]] = {
    "replica": ("+psync", "+replconf", "+ping"),
    "sentinel": (
        "&__sentinel__:hello",
        "+multi",
        "+slaveof",
        "+ping",
        "+exec",
        "+subscribe",
        "+config|rewrite",
        "+role",
        "+publish",
        "+info",
        "+client|setname",
        "+client|kill",
        "+script|kill",
    ),
}
"""Users of a Sentinel group's own processes, written only when their password is given:
``replica`` (``masteruser`` of a replica: replication and nothing else) and ``sentinel``
(``sentinel auth-user``: what Redis's documentation lists for a sentinel). Every data node
loads the same file, so every user exists on whichever node is the master."""


def password_variable(role: str) -> str:
    """The environment variable holding ``role``'s password (``EVALQ_ACL_<ROLE>_PASSWORD``)."""
    return f"EVALQ_ACL_{role.upper()}_PASSWORD"


def _password(role: str, passwords: Mapping[str, str]) -> str:
    variable = password_variable(role)
    value = passwords.get(variable, "")
    if len(value) < 12:
        raise InputError(f"{variable} must be set to a password of at least 12 characters")
    return value


def acl_text(passwords: Mapping[str, str] | None = None) -> str:
    """The ACL file's text (one ``user`` line per role; ``default`` behind a thrown-away
    password); the roles' passwords from ``passwords`` (``EVALQ_ACL_<ROLE>_PASSWORD`` ->
    password; default: the environment)."""
    given = os.environ if passwords is None else passwords
    unknown = hashlib.sha256(secrets.token_bytes(32)).hexdigest()
    lines = [f"user default on resetkeys resetchannels #{unknown} ~* &* +@all"]
    for role, rules in ROLES.items():
        digest = hashlib.sha256(_password(role, given).encode()).hexdigest()
        head = ["user", role, "on", "resetkeys", "resetchannels", f"#{digest}"]
        lines.append(" ".join([*head, *rules]))
    for role, rules in SERVICE_ROLES.items():
        if given.get(password_variable(role)):
            digest = hashlib.sha256(_password(role, given).encode()).hexdigest()
            lines.append(" ".join(["user", role, "on", "resetkeys", f"#{digest}", *rules]))
    return "\n".join(lines) + "\n"


def write_acl(path: Path, passwords: Mapping[str, str] | None = None) -> None:
    """Write the ACL file to ``path`` (mode 644: digests only); see :func:`acl_text`."""
    text = acl_text(passwords)
    path.write_text(text, encoding="utf-8")
    path.chmod(0o644)
