"""evalq workers: Celery tasks, warm runtimes, shard cache and batching."""

from evalq.worker.bootstrap import create_worker_app, run_worker

__all__ = ["create_worker_app", "run_worker"]
