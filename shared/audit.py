"""Audit entries written from Python (admin bypasses); entries that must be atomic with a
ledger or tier change are written by the same Lua script instead. Every entry has the same
fields: action, who, dataset, split, run, at, before, after (JSON)."""

from __future__ import annotations

import json
import time

import redis

from shared.keys import AUDIT
from shared.models import RunMeta

__all__ = ["audit_admin"]


def audit_admin(client: redis.Redis, action: str, who: str, meta: RunMeta, after: object) -> None:
    """Record that ``who`` bypassed the policy on ``meta``'s run (``admin_submit``,
    ``admin_read``)."""
    client.xadd(
        AUDIT,
        {
            "action": action,
            "who": who,
            "dataset": meta.dataset_id,
            "split": meta.split,
            "run": meta.run_id,
            "samples": str(meta.n),
            "at": str(time.time()),
            "before": json.dumps(None),
            "after": json.dumps(after),
        },
    )
