"""evalq workers: Celery tasks, warm runtimes, shard cache and batching."""

from __future__ import annotations

from typing import TYPE_CHECKING

from evalq.shared.lazy import lazy_exports

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


__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
