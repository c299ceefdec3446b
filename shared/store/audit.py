"""The audit stream ``evalq:audit``: entries written from Python, and reading them back.

Entries that must be atomic with a ledger, tier or registry change are written by the same Lua
script instead. Every entry has the same fields: action, who, dataset, split, run, at, before,
after (JSON); some add their own (``samples``, ``principal``).
"""

from __future__ import annotations

import json
import time
from typing import Any

import redis

from evalq.shared.keys import AUDIT
from evalq.shared.models import RunMeta

__all__ = ["audit_admin", "audit_refusal", "recent", "record", "trim_audit"]


def record(
    target: redis.Redis | redis.client.Pipeline,
    action: str,
    who: str,
    *,
    dataset: str = "",
    split: str = "",
    run: str = "",
    before: object = None,
    after: object = None,
    **extra: str,
) -> None:
    """Append one entry (on a pipeline: as part of its transaction)."""
    fields: dict[Any, Any] = {
        "action": action,
        "who": who,
        "dataset": dataset,
        "split": split,
        "run": run,
        **extra,
        "at": str(time.time()),
        "before": json.dumps(before),
        "after": json.dumps(after),
    }
    target.xadd(AUDIT, fields)


def audit_admin(client: redis.Redis, action: str, who: str, meta: RunMeta, after: object) -> None:
    """Record that ``who`` bypassed the policy on ``meta``'s run (``admin_submit``,
    ``admin_read``)."""
    record(
        client,
        action,
        who,
        dataset=meta.dataset_id,
        split=meta.split,
        run=meta.run_id,
        after=after,
        samples=str(meta.n),
    )


def audit_refusal(client: redis.Redis, who: str, request: str, reason: str) -> None:
    """Record that the gateway refused ``request`` (``METHOD /path``) to ``who`` (the token's
    principal, or ``anonymous``)."""
    record(client, "refused", who, after={"request": request[:300], "reason": reason[:500]})


def recent(client: redis.Redis, limit: int) -> list[dict[str, str]]:
    """The newest ``limit`` entries, oldest first, each with its stream ``id``."""
    entries: Any = client.xrevrange(AUDIT, count=limit)
    return [{"id": str(i), **{str(k): str(v) for k, v in f.items()}} for i, f in reversed(entries)]


def trim_audit(client: redis.Redis, days: float, now: float) -> int:
    """Drop the audit entries older than ``days`` (by their stream id, the time Redis wrote
    them), never a younger one; return how many went."""
    oldest_kept = int((now - days * 86400) * 1000)
    return int(client.xtrim(AUDIT, minid=f"{max(0, oldest_kept)}-0", approximate=False))
