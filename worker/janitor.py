"""The janitor: heals runs that nothing moves any more, without waiting for the broker's
visibility timeout and without anyone typing ``evalq resume``.

One worker at a time runs it (the holder of the ``evalq:janitor`` lease; see
:mod:`evalq.worker.heartbeat`). Each sweep counts, for the fair dispatcher, the messages of one
batch per live worker process that consumes ``infer``, and likewise for ``score``
(:meth:`evalq.shared.queue.backlog.Backlog.set_depth`), and:

1. puts back in their queue the unacknowledged messages that no live worker holds (their
   worker's main process was killed, or lost Redis and gave up on them) once they are older
   than a heartbeat's lifetime;
2. for each run that has made no progress for ``EVALQ_STALL_AFTER`` seconds: if every sample is
   settled, its finalizer died, so it sends one score message that makes a worker serving the
   evaluation take over the dead claim and finish the run; otherwise it sends again the
   unsettled samples that no queued, unacknowledged or backlogged message carries (lost with a
   killed process, a Redis outage or a dropped batch): to scoring when their output is stored,
   else to the run's backlog for inference. A message counts as carrying a sample only if it
   names the run's own evaluation and spec (a worker would drop any other). Nothing is charged;
   every write stays once-only, so a duplicate is harmless.

It lets go of the token holds (:mod:`evalq.shared.store.spend`) that outlived their try: their
worker died, or lost Redis, mid-request, and the tokens they held are free again.

It also looks after what has ended (:mod:`evalq.worker.archiver`): a run that completed or was
cancelled ``EVALQ_ARCHIVE_AFTER`` seconds ago, or failed ``EVALQ_ARCHIVE_FAILED_AFTER`` seconds
ago, that is not archived yet is sent to be archived (again when an attempt sent
``4 * EVALQ_STALL_AFTER`` seconds ago has not sealed it); an archived run leaves the worklist.
The retention policy (purging old runs, trimming the audit stream) is not the janitor's: it
needs rights the ``worker`` ACL user does not have, and runs on the operator's side
(:func:`evalq.shared.store.retention.retain`, by the gateway or ``evalq retention``).

A run whose record cannot be read is logged and skipped; it never stops the sweep of the others.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import redis
from celery import Celery

from evalq.shared.connection import server_time
from evalq.shared.errors import UnknownRunError, first_line
from evalq.shared.models import RunMeta, SampleTask
from evalq.shared.queue.backlog import LANES, Backlog
from evalq.shared.queue.broker import Broker, carried
from evalq.shared.queue.celery_app import SCORE_TASK, send_archive
from evalq.shared.queue.sizing import enqueue
from evalq.shared.settings import Settings
from evalq.shared.store.presence import HEARTBEAT_MISSES, Presence
from evalq.shared.store.reader import ResultReader
from evalq.shared.store.retention import archive_due
from evalq.shared.store.runs import RunStore
from evalq.shared.store.spend import TokenSpend
from evalq.shared.store.spill import Spill
from evalq.shared.store.writer import ResultWriter

__all__ = ["Janitor", "Sweep"]

log = logging.getLogger(__name__)


@dataclass
class Sweep:
    """What one sweep did."""

    restored: int = 0
    """Unacknowledged messages of gone workers put back in their queue."""
    tokens_freed: int = 0
    """Tokens let go from holds that outlived their try."""
    resent: dict[str, int] = field(default_factory=dict)
    """Run id -> samples sent again because no message carried them."""
    nudged: list[str] = field(default_factory=list)
    """Runs, all settled, whose finalizer died: asked to finish again."""
    retired: list[str] = field(default_factory=list)
    """Ended runs taken off the worklist (archived, or gone)."""
    archiving: list[str] = field(default_factory=list)
    """Ended runs sent to be archived."""
    spilling: list[str] = field(default_factory=list)
    """Going runs sent to have their complete segments spilled."""


class Janitor:
    """Sweeps the broker and the active runs; see the module's description."""

    def __init__(
        self, client: redis.Redis, broker: Broker, app: Celery, settings: Settings
    ) -> None:
        self._client = client
        self._runs = RunStore(client)
        self._results = ResultReader(client)
        self._writer = ResultWriter(client)
        self._presence = Presence(client)
        self._backlog = Backlog(client)
        self._spend = TokenSpend(client)
        self._broker = broker
        self._app = app
        self._settings = settings
        self._waiting: dict[str, list[SampleTask]] | None = None
        self._backlogged: dict[str, list[SampleTask | None]] = {}
        self._spill_sent: dict[str, float] = {}
        """Run -> when this janitor last asked for it to be spilled."""

    def sweep(self) -> Sweep:
        """One pass over the broker's unacknowledged messages and the active runs."""
        done = Sweep()
        now = server_time(self._client)
        live = self._presence.live()
        held = {tag for beat in live for tag in beat.held}
        for lane in LANES:
            batches = sum(beat.prefetch // 2 for beat in live if lane.queue in beat.queues)
            self._backlog.set_depth(batches, ttl=4 * self._settings.stall_after, lane=lane)
        gone_after = self._settings.heartbeat_interval * HEARTBEAT_MISSES
        for tag in self._broker.delivered_before(now - gone_after):
            if tag not in held:
                self._broker.restore(tag)
                done.restored += 1
        done.tokens_freed = self._spend.expire()
        if done.tokens_freed:
            log.warning("janitor: let go of %d tokens held by requests gone", done.tokens_freed)
        self._waiting = None
        self._backlogged = {}
        for run_id in self._runs.active():
            try:
                self._heal(run_id, now, done)
            except redis.RedisError:
                raise
            except Exception as exc:
                log.error("janitor: cannot look after run %s: %s", run_id, first_line(exc))
        if done.restored:
            log.warning("janitor: put back %d messages of workers that are gone", done.restored)
        return done

    def _heal(self, run_id: str, now: float, done: Sweep) -> None:
        try:
            meta = self._runs.get(run_id)
        except UnknownRunError:
            meta = None
        if meta is None or self._results.archive_url(run_id) is not None:
            self._spill_sent.pop(run_id, None)
            self._runs.retire(run_id)
            done.retired.append(run_id)
            return
        if not meta.status.active:
            self._archive(meta, now, done)
            return
        progress = self._results.progress(run_id)
        self._spill(meta, progress.done, now, done)
        idle = now - (progress.touched or meta.created)
        if idle < self._settings.stall_after:
            return
        if progress.done >= meta.n:
            self._nudge(meta)
            done.nudged.append(run_id)
            return
        if self._waiting is None:
            # the stalled runs' backlogs first, the broker after: a message the dispatcher
            # moves in between is then seen in the broker, never in neither
            self._backlogged = self._backlogs(now)
            self._waiting = self._broker.waiting()
        backlogged = self._backlogged.get(run_id, [])
        carrying = {
            sample_id
            for task in [*self._waiting.get(run_id, []), *backlogged]
            if task is not None and task.eval == meta.eval and task.spec == meta.spec
            for sample_id in task.sample_ids
        }
        resent = self._resend(meta, carrying)
        if resent:
            done.resent[run_id] = resent
            log.warning(
                "janitor: run %s made no progress for %.0fs; sent %d samples again whose "
                "messages were lost",
                run_id,
                idle,
                resent,
            )

    def _backlogs(self, now: float) -> dict[str, list[SampleTask | None]]:
        """The payloads in the backlogs of the active runs that made no progress lately."""
        found: dict[str, list[SampleTask | None]] = {}
        for run_id in self._runs.active():
            touched = self._results.progress(run_id).touched
            if touched is None or now - touched >= self._settings.stall_after:
                found[run_id] = [carried(raw) for raw in self._backlog.messages(run_id)]
        return found

    def _archive(self, meta: RunMeta, now: float, done: Sweep) -> None:
        """Send an ended run to be archived once it is due, unless an attempt was sent
        lately."""
        if not archive_due(meta, now, self._settings):
            return
        if self._runs.claim_archive(meta.run_id, 4 * self._settings.stall_after):
            send_archive(self._app, meta.run_id)
            done.archiving.append(meta.run_id)

    def _spill(self, meta: RunMeta, settled: int, now: float, done: Sweep) -> None:
        """Ask for a spill of a going run holding a segment's worth of settled samples not
        spilled, at most once per ``EVALQ_STALL_AFTER``: workers ask only when a write takes
        the settled count past a multiple of a segment, which misses the segments whose last
        sample settles late (a retry)."""
        rows = self._settings.spill_rows
        if not rows or now - self._spill_sent.get(meta.run_id, 0.0) < self._settings.stall_after:
            return
        if settled - Spill.read(self._client, meta.run_id).samples < rows:
            return
        self._spill_sent[meta.run_id] = now
        send_archive(self._app, meta.run_id)
        done.spilling.append(meta.run_id)

    def _nudge(self, meta: RunMeta) -> None:
        first = self._runs.sample_ids(meta.run_id)[:1]
        enqueue(self._app, SCORE_TASK, meta, first)
        self._writer.recovered(meta.run_id, 0)
        log.warning(
            "janitor: run %s is settled but unfinished; asked a worker to finish it", meta.run_id
        )

    def _resend(self, meta: RunMeta, carrying: set[int]) -> int:
        ids = self._runs.sample_ids(meta.run_id)
        settled = self._results.settled(meta.run_id, ids)
        lost = [i for i in ids if i not in settled and i not in carrying]
        if not lost:
            return 0
        inferred = self._results.inferred(meta.run_id, lost)
        enqueue(self._app, SCORE_TASK, meta, [i for i in lost if i in inferred])
        self._backlog.enqueue(self._app, meta, [i for i in lost if i not in inferred])
        self._writer.recovered(meta.run_id, len(lost))
        return len(lost)
