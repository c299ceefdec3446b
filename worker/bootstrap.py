"""Booting a worker: the Celery app built by a factory from settings, with evalq's tasks and
lifecycle hooks, and the function behind ``evalq worker``."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from typing import Any

from celery import Celery
from celery.signals import (
    celeryd_after_setup,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
)
from kombu import Queue

from evalq.shared.evaluation import load_plugins, registered
from evalq.shared.isolation.privilege import undumpable
from evalq.shared.queue.celery_app import STAGE_QUEUES, create_app, evaluation_queue
from evalq.shared.settings import Settings
from evalq.worker.batches import SampleBatches
from evalq.worker.heap import keep_freed_memory
from evalq.worker.heartbeat import PresenceThread
from evalq.worker.remote_control import lock_down
from evalq.worker.state import WorkerState
from evalq.worker.tasks import register_tasks

__all__ = ["create_worker_app", "run_worker"]

log = logging.getLogger(__name__)


def create_worker_app(settings: Settings) -> Celery:
    """A Celery app with plugins imported, tasks registered and per-process state hooked up.

    ``datasets`` is imported here, before the pool forks, so a pool process that replaces a
    dead one does not pay its import again; nothing is opened until after the fork.

    A worker with one pool process hands that process its next batch while it still runs the
    current one (Celery's ``fcfs`` scheduling), so the process never waits on the parent
    between batches. With several processes, or an explicit ``-O fair``, Celery's ``fair``
    scheduling stays: each batch goes to an idle process. A batch written to a process that
    dies before starting it goes to the replacement process, so crash safety is the same.

    httpx logs only warnings (not a line per request). Hugging Face progress bars are off
    (unless the operator set ``HF_HUB_DISABLE_PROGRESS_BARS`` himself): Celery logs a worker's
    stderr as WARNING lines, and a model's "Loading weights" bar would land there as a
    screenful of warnings.

    Remote-control commands that change or stop a worker are refused unless
    ``EVALQ_REMOTE_CONTROL`` is on (:mod:`evalq.worker.remote_control`). Once the worker is ready,
    its presence thread beats and, when it holds the lease, runs the janitor
    (:mod:`evalq.worker.heartbeat`). Worker processes are not dumpable
    (:mod:`evalq.shared.isolation.privilege`): an isolated model's subprocess cannot read their
    environment or memory through ``/proc``.
    """
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    # One INFO line per HTTP request is noise in a worker's log, and the endpoint lane's threads
    # would write one at any moment: a pool process forked to replace a dead one while a thread
    # holds the stream's lock would hang on its first line (the attack review: 23 of 30 forks).
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)
    import datasets  # noqa: F401

    undumpable()  # no process of this user reads the Redis password or rows from /proc
    load_plugins(settings.plugins)
    app = create_app(settings)
    state = WorkerState(app, settings)
    register_tasks(app, state, settings)
    app.conf.task_queues = (*app.conf.task_queues, *_evaluation_queues(STAGE_QUEUES.values()))
    # Only evalq's tasks are consumed: Celery's built-in ones (celery.map, celery.chord, ...)
    # could send other tasks on a message's say. The guarded consumer drops what it cannot take.
    for name in [name for name in app.tasks if not name.startswith("evalq.")]:
        app.tasks.unregister(name)
    app.conf.worker_consumer = "evalq.worker.consumer:GuardedConsumer"
    if not settings.remote_control:
        lock_down()
    presence: list[PresenceThread] = []

    def after_fork(**_: Any) -> None:
        undumpable()
        state.reset()
        keep_freed_memory()

    def on_exit(**_: Any) -> None:
        state.close()

    def before_pool(sender: Any, **_: Any) -> None:
        if sender.concurrency == 1 and sender.optimization in (None, "default"):
            sender.optimization = "fcfs"

    def announce(sender: str, instance: Any, **_: Any) -> None:
        queues = ", ".join(sorted(instance.app.amqp.queues.consume_from or ()))
        evaluations = ", ".join(registered()) or "none (set EVALQ_PLUGINS)"
        log.info("%s serves evaluations: %s; queues: %s", sender, evaluations, queues)

    def batches() -> list[SampleBatches]:
        return [t for t in app.tasks.values() if isinstance(t, SampleBatches)]

    def held() -> list[str]:
        return sorted(tag for task in batches() for tag in task.held.snapshot())

    def holding() -> list[str]:
        return sorted({run for task in batches() for run in task.held.runs()})

    def start_presence(sender: Any, **_: Any) -> None:
        queues = sorted(sender.app.amqp.queues.consume_from or ())
        thread = PresenceThread(
            app,
            settings,
            hostname=sender.hostname,
            queues=queues,
            held=held,
            holding=holding,
            prefetch=app.conf.worker_prefetch_multiplier
            * (getattr(getattr(sender, "controller", None), "concurrency", 1) or 1),
        )
        thread.start()
        presence.append(thread)

    def stop_presence(**_: Any) -> None:
        while presence:
            presence.pop().stop()

    worker_init.connect(before_pool, weak=False)
    worker_ready.connect(start_presence, weak=False)
    worker_shutdown.connect(stop_presence, weak=False)
    celeryd_after_setup.connect(announce, weak=False)
    worker_process_init.connect(after_fork, weak=False)
    worker_process_shutdown.connect(on_exit, weak=False)
    return app


def _evaluation_queues(stages: Iterable[str]) -> list[Queue]:
    """The queues of the evaluations this process serves, for each stage in ``stages``."""
    return [evaluation_queue(stage, name) for stage in stages for name in registered()]


def consumed_queues(queues: str) -> str:
    """``--queues`` as given, with each stage queue (``infer``, ``score``) followed by the
    queues of the evaluations this worker serves at that stage (``infer.<eval>``, ...)."""
    named = [q.strip() for q in queues.split(",") if q.strip()]
    stages = [q for q in named if q in STAGE_QUEUES.values()]
    return ",".join([*named, *(q.name for q in _evaluation_queues(stages))])


def run_worker(
    settings: Settings, queues: str = "infer,score", concurrency: int = 1, loglevel: str = "INFO"
) -> None:
    """Run a Celery worker in this process (what ``celery -A evalq.worker.celery worker`` does).

    With several processes and no ``EVALQ_TORCH_THREADS``, each process gets an equal share of
    the CPU cores for torch (:meth:`Settings.for_processes`). Task events follow
    ``EVALQ_TASK_EVENTS`` through the app's configuration. Without ``EVALQ_REMOTE_CONTROL`` the
    worker starts without Celery's mingle: it would wait a second for the other workers' revoked
    task ids, and no worker takes a revoke then (measured: 1.1 s of a worker's start).
    """
    app = create_worker_app(settings.for_processes(concurrency))
    app.worker_main(
        [
            "worker",
            f"--queues={consumed_queues(queues)}",
            f"--concurrency={concurrency}",
            "--pool=prefork",
            f"--loglevel={loglevel}",
            f"--hostname=evalq-{os.getpid()}@%h",
            *(() if settings.remote_control else ("--without-mingle",)),
        ]
    )
