"""evalq workers: Celery tasks, warm runtimes, shard cache and batching."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from evalq.worker.bootstrap import create_worker_app, run_worker

__all__ = [
    "create_worker_app",
    "run_worker",
]

# Each name is imported where it lives the first time it is read (PEP 562): importing this
# package, which every ``evalq.*`` import does, loads none of them (``evalq --help`` and a read
# through the gateway need neither numpy nor Celery).
_WHERE = {
    "create_worker_app": "evalq.worker.bootstrap",
    "run_worker": "evalq.worker.bootstrap",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
