"""Remote control that cannot change a worker: unless ``EVALQ_REMOTE_CONTROL`` is on, every
Celery control command that changes worker-local settings or stops a worker (``time_limit``,
``rate_limit``, ``shutdown``, ``pool_restart``, ``revoke``, ``add_consumer``, ...) is answered
with a refusal. Inspection (``ping``, ``stats``, ``active``, ``registered``, ``active_queues``,
... : what Flower lists) and ``enable_events`` / ``heartbeat`` (what monitors need) still work.

Anyone who can publish on the broker can send a control command; the broker's ACLs decide who
can publish at all, this decides what a command may do.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery.worker.control import Panel

__all__ = ["ANSWERED", "lock_down"]

log = logging.getLogger(__name__)

ANSWERED = frozenset({"enable_events", "heartbeat"})
"""Control commands still answered when remote control is off: monitoring switches."""


def _refusal(name: str) -> Callable[..., dict[str, str]]:
    def refuse(_state: Any, **_arguments: Any) -> dict[str, str]:
        log.warning("refused remote control command %r (EVALQ_REMOTE_CONTROL is off)", name)
        return {"error": f"refused: remote control command {name!r} is off on evalq workers"}

    return refuse


def lock_down() -> list[str]:
    """Replace this process's handlers of every control command but :data:`ANSWERED` with a
    refusal; return the names refused."""
    refused: list[str] = []
    for name, meta in list(Panel.meta.items()):
        if meta.type != "control" or name in ANSWERED:
            continue
        for alias in filter(None, (name, meta.alias)):
            Panel.data[alias] = _refusal(name)
        refused.append(name)
    return sorted(refused)
