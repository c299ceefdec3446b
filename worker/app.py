"""The worker's Celery app: built by a factory from settings, with evalq's tasks and lifecycle
hooks, and the function behind ``evalq worker``."""

from __future__ import annotations

import os
from typing import Any

from celery import Celery
from celery.signals import worker_process_init, worker_process_shutdown

from shared.celery_app import create_app
from shared.evaluation import load_plugins
from shared.settings import Settings
from worker.state import WorkerState
from worker.tasks import register_tasks

__all__ = ["create_worker_app", "run_worker"]


def create_worker_app(settings: Settings) -> Celery:
    """A Celery app with plugins imported, tasks registered and per-process state hooked up.

    ``datasets`` is imported here, before the pool forks, so a pool process that replaces a
    dead one does not pay its import again; nothing is opened until after the fork.
    """
    import datasets  # noqa: F401

    load_plugins(settings.plugins)
    app = create_app(settings)
    state = WorkerState(app, settings)
    register_tasks(app, state, settings)

    def after_fork(**_: Any) -> None:
        state.reset()

    def on_exit(**_: Any) -> None:
        state.close()

    worker_process_init.connect(after_fork, weak=False)
    worker_process_shutdown.connect(on_exit, weak=False)
    return app


def run_worker(
    settings: Settings, queues: str = "infer,score", concurrency: int = 1, loglevel: str = "INFO"
) -> None:
    """Run a Celery worker in this process (what ``celery -A worker.main worker`` does).

    With several processes and no ``EVALQ_TORCH_THREADS``, each process gets an equal share of
    the CPU cores for torch instead of every process using them all.
    """
    if concurrency > 1 and settings.torch_threads is None:
        share = max(1, (os.cpu_count() or 1) // concurrency)
        settings = settings.model_copy(update={"torch_threads": share})
    app = create_worker_app(settings)
    app.worker_main(
        [
            "worker",
            f"--queues={queues}",
            f"--concurrency={concurrency}",
            "--pool=prefork",
            f"--loglevel={loglevel}",
            f"--hostname=evalq-{os.getpid()}@%h",
            *(["--task-events"] if settings.task_events else []),
        ]
    )
