"""Runs as a reader sees them: ``status``, ``runs`` and the counters ``follow`` polls.

What the reader may see of a run (its tier, its timing, its released aggregate) is answered in
one call, :meth:`evalq.shared.access.disclosure.Disclosure.status`; this module adds what the
operation of the queue says of the run: whether anything moves it, where it waits in the fair
dispatcher, and whether the workers serving it run its evaluation's file as it is now.
"""

from __future__ import annotations

from evalq.producer.service.direct import Direct
from evalq.producer.service.views import EndpointCounts, RunView, check_ended
from evalq.shared.access.disclosure import Stall
from evalq.shared.connection import server_time
from evalq.shared.evals.language import language_run
from evalq.shared.evaluation import source
from evalq.shared.models import Progress, RunFilter, RunMeta
from evalq.shared.queue.celery_app import INFER_QUEUE, SCORE_QUEUE
from evalq.shared.queue.standing import Standing
from evalq.shared.store.presence import WorkerBeat, absence, stale_code
from evalq.shared.store.rate import minute_counts

__all__ = ["Viewer"]


class Viewer:
    """One reader's views of runs."""

    def __init__(self, direct: Direct) -> None:
        self._direct = direct

    def status(self, run_id: str) -> RunView:
        """The run's record and counters, and its aggregate where the policy allows it."""
        return self._view(self._direct.runs.get(run_id), self._direct.presence.live())

    def recent(
        self, limit: int = 20, owner: str | None = None, only: RunFilter | None = None
    ) -> list[RunView]:
        """The newest runs first (only ``owner``'s, and those ``only`` matches, when given),
        as :meth:`status` shows them; viewed oldest first, so that runs first read here take
        their Ladder rounds in the order they were submitted."""
        direct = self._direct
        workers = direct.presence.live()
        now = server_time(direct.redis)
        metas = direct.runs.recent(limit, owner, only, lambda m: direct.disclosure.listed(m, now))
        return [self._view(meta, workers) for meta in reversed(metas)][::-1]

    def progress(self, run_id: str) -> tuple[RunMeta, Progress]:
        """The run's record and counters (counts only; coarse, as
        :func:`evalq.shared.access.policy.coarse_timing` makes them, for a reader who does not see
        the run's timing)."""
        direct = self._direct
        meta = direct.runs.get(run_id)
        progress, now = direct.results.progress(run_id), server_time(direct.redis)
        direct.runs.saw_end(meta)
        meta, progress, _ = direct.disclosure.as_read(meta, progress, now)
        return direct.outward(meta), progress

    def ended(self, run_id: str) -> RunMeta:
        """The record of a run that has ended; :class:`RunNotCompletedError` (exit code 4)
        if it ended ``failed`` or ``cancelled``."""
        return self._direct.outward(check_ended(self._direct.runs.get(run_id)))

    def stalled(self, meta: RunMeta, progress: Progress) -> str | None:
        """Why nothing moves a going run, as this reader may be told
        (:meth:`evalq.shared.access.disclosure.Disclosure.stalled`): no live worker serves its
        evaluation (or consumes the queue its samples wait in), or it made no progress for
        ``stall_after`` seconds; None when it is moving or has ended."""
        direct = self._direct
        waiting = direct.backlog.standing(meta.run_id) if meta.status.active else None
        stall = self._stall(meta, progress, direct.presence.live(), waiting)
        return direct.disclosure.stalled(direct.disclosure.reader(meta), meta, stall)

    def _stall(
        self,
        meta: RunMeta,
        progress: Progress,
        workers: list[WorkerBeat],
        waiting: Standing | None,
    ) -> Stall:
        provider = None if meta.model is None else meta.model.split("/", 1)[0]
        unserved = absence(workers, meta.eval, [], provider)
        if not meta.status.active or unserved:
            return Stall(unserved=unserved)
        queues = []
        if progress.inferred + progress.failed < meta.n:
            queues.append(INFER_QUEUE)
        if progress.inferred > progress.scored:
            queues.append(SCORE_QUEUE)
        missing = absence(workers, meta.eval, queues, provider)
        if missing or waiting is not None or any(meta.run_id in w.runs for w in workers):
            # waiting its turn in the dispatcher, which says why, or in a live worker's hands
            # (a model generating a batch writes nothing until it ends): not stalled
            return Stall(queue=missing)
        idle = server_time(self._direct.redis) - (progress.touched or meta.created)
        return Stall(idle=idle if idle >= self._direct.settings.stall_after else None)

    def _view(self, meta: RunMeta, workers: list[WorkerBeat]) -> RunView:
        direct = self._direct
        progress = direct.results.progress(meta.run_id)
        now = server_time(direct.redis)
        waiting = direct.backlog.standing(meta.run_id) if meta.status.active else None
        stall = self._stall(meta, progress, workers, waiting)
        direct.runs.saw_end(meta)
        seen = direct.disclosure.status(meta, progress, now, stall=stall, waiting=waiting)
        return RunView(
            meta=seen.meta,
            progress=seen.progress,
            tier=seen.reader.tier,
            aggregate=seen.aggregate,
            withheld=seen.withheld,
            release=seen.release,
            stats=seen.stats,
            provenance=seen.provenance,
            errors=seen.errors,
            stalled=seen.stalled,
            waiting=seen.waiting,
            stale_code=_stale_code(seen.meta, workers),
            endpoint=self._endpoint(meta) if direct.disclosure.sees_fleet() else None,
            timed=seen.reader.sees_timing,
            now=now,
        )

    def _endpoint(self, meta: RunMeta) -> EndpointCounts | None:
        run = language_run(meta)
        url = None if run is None else run.model.endpoint
        if url is None:
            return None
        counts = minute_counts(self._direct.redis, [url])[url]
        return EndpointCounts(url=url, **counts)


def _stale_code(meta: RunMeta, workers: list[WorkerBeat]) -> str | None:
    """While the run is going, whether live workers serving its evaluation run other code than
    its file holds now, as this process reads the file (the gateway's, or the CLI's after a
    submit loaded the plugins; this process's own staleness is logged once per change)."""
    found = source(meta.eval) if meta.status.active else None
    if found is None:
        return None
    found.stale()
    return stale_code(workers, meta.eval, found.now())
