"""Per-process worker state: the Redis client, stores, shard cache and runtime pool.

Nothing is opened at import or in the parent process: a prefork child opens its own on first
use after the fork, and frees models when it exits. The state is per thread too (a
``threading.local``): each thread of the endpoint lane (:mod:`evalq.worker.lane`), in the
worker's main process, opens and frees its own.
"""

from __future__ import annotations

import logging
import threading

import redis
from billiard.process import current_process
from celery import Celery

from evalq.shared.connection import connect
from evalq.shared.data.remote import DataCache
from evalq.shared.errors import first_line
from evalq.shared.models import RunMeta, SampleTask
from evalq.shared.queue.backlog import Backlog, Capturer
from evalq.shared.queue.celery_app import SCORE_QUEUE, send_archive
from evalq.shared.queue.pace import Pace, PaceMeter
from evalq.shared.queue.sizing import publish
from evalq.shared.services import Services
from evalq.shared.settings import Settings
from evalq.shared.store.labels import LabelFields
from evalq.shared.store.provenance import ProvenanceStore
from evalq.shared.store.reader import ResultReader
from evalq.shared.store.runs import RunStore
from evalq.shared.store.writer import ResultWriter
from evalq.worker.batch import Resources
from evalq.worker.runtime_pool import RuntimePool
from evalq.worker.shard_cache import ShardCache

__all__ = ["WorkerState"]

log = logging.getLogger(__name__)


class WorkerState(threading.local):
    """Lazily opened :class:`Resources` of the current process (and thread)."""

    def __init__(self, app: Celery, settings: Settings) -> None:
        self._app = app
        self._settings = settings
        self._resources: Resources | None = None
        self._client: redis.Redis | None = None
        self._backlog: Backlog | None = None
        self._capturer: Capturer | None = None

    def get(self) -> Resources:
        """This process's resources, opened on first use."""
        if self._resources is None:
            client = self.client()
            self._backlog = Backlog(client)
            self._capturer = Capturer(self._app)
            self._resources = Resources(
                runs=RunStore(client),
                reader=ResultReader(client),
                writer=ResultWriter(client),
                shards=ShardCache(
                    client,
                    capacity=self._settings.max_shards,
                    verify_routing=self._settings.verify_routing,
                    data_cache=DataCache.of(self._settings),
                ),
                runtimes=RuntimePool(
                    Services(self._settings, client),
                    # billiard numbers a prefork pool's processes 0..N-1: process k uses GPU k
                    process_index=getattr(current_process(), "index", 0),
                ),
                publish=self._publish,
                stage_scoring=self._stage_scoring,
                labels=LabelFields(client),
                archive=self._archive if self._settings.archive_after == 0 else None,
                spill=self._spill if self._settings.spill_rows else None,
                spill_rows=self._settings.spill_rows,
                max_batch=self._settings.max_batch,
                max_attempts=self._settings.max_attempts,
                max_output_bytes=self._settings.max_output_bytes,
                max_run_bytes=self._settings.max_run_bytes,
                stall_after=self._settings.stall_after,
                fuse=SCORE_QUEUE in self._consumed(),
                provenance=ProvenanceStore(client),
                pace=PaceMeter(Pace(client)),
            )
        return self._resources

    def client(self) -> redis.Redis:
        """This process's Redis client, opened on first use."""
        if self._client is None:
            self._client = connect(self._settings.redis)
        return self._client

    def _archive(self, run_id: str) -> None:
        """Send an ended run to be archived, unless someone did."""
        if RunStore(self.client()).claim_archive(run_id):
            send_archive(self._app, run_id)

    def _spill(self, run_id: str) -> None:
        """Send a going run to have its complete segments spilled."""
        send_archive(self._app, run_id)

    def _publish(self, task_name: str, tasks: list[SampleTask]) -> int:
        return publish(self._app, task_name, tasks)

    def _stage_scoring(self, meta: RunMeta, sample_ids: list[int]) -> int:
        assert self._backlog is not None
        assert self._capturer is not None
        return self._backlog.stage_scoring(self._capturer, meta, sample_ids)

    def _consumed(self) -> set[str]:
        return set(self._app.amqp.queues.consume_from or {})

    def refill(self) -> None:
        """Refill the stage queues this worker consumes (``infer``, ``score``) from the runs'
        backlogs, in one call, as a batch finishes; a Redis error is logged (the next batch or
        heartbeat refills)."""
        self.get()
        assert self._backlog is not None
        try:
            self._backlog.refill(self._app.conf.worker_prefetch_multiplier // 2, self._consumed())
        except redis.RedisError as exc:
            log.warning("could not refill the queues: %s", first_line(exc))

    def reset(self) -> None:
        """Forget what a parent process opened (called in a child right after fork)."""
        self._resources = None
        self._backlog = None
        self._capturer = None

    def close(self) -> None:
        """Free loaded models and the capturing connection (called when a worker process
        exits)."""
        if self._resources is not None:
            self._resources.runtimes.close()
            self._resources = None
            self._backlog = None
        if self._capturer is not None:
            self._capturer.close()
            self._capturer = None
