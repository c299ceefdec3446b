"""Resuming a run: re-enqueue every sample without a terminal result, charging nothing.

Samples with an output go back to scoring, the rest to the run's backlog for inference with a
fresh attempt count; a sample a message still carries (in the run's backlog, a broker queue,
or held by a worker) is not sent again, so resuming a queued run adds nothing. If every sample
is settled but the run never finished, its aggregate is computed here.

A reader who does not see the run's timing (a user on a ``non_viewable`` split) is answered from
the run as ``status`` shows it to them (:meth:`Direct.seen`): while it reads as running, resume
does what it would do and answers no count and no outcome (each count would show how far the
run is, and an error would show its end before ``status`` does).
"""

from __future__ import annotations

from functools import partial

from evalq.producer.service.direct import Direct
from evalq.producer.service.views import Resumption
from evalq.shared.errors import EvalqError, InputError
from evalq.shared.evaluation import create, load_plugins
from evalq.shared.models import RunMeta, RunStatus
from evalq.shared.queue.broker import Broker, carried
from evalq.shared.queue.celery_app import SCORE_TASK
from evalq.shared.queue.sizing import enqueue

__all__ = ["resume"]


def resume(direct: Direct, run_id: str) -> Resumption:
    """Re-enqueue the run's unsettled samples, or finalize it when all are settled."""
    meta = direct.runs.get(run_id)
    shown, timed = direct.seen(meta)
    if timed or not shown.status.active:
        return _resume(direct, meta)
    if meta.status.active:
        _resume(direct, meta)
    return Resumption(run_id, None, None, False)


def _resume(direct: Direct, meta: RunMeta) -> Resumption:
    run_id = meta.run_id
    if meta.status is RunStatus.CANCELLED:
        raise EvalqError(f"run {run_id} was cancelled and refunded; submit it again instead")
    if meta.archived is not None:
        raise InputError(f"run {run_id} is archived; submit it again instead")
    ids = direct.runs.sample_ids(run_id)
    queued = _queued(direct, run_id)  # first: a message acknowledged after is settled then
    settled = direct.results.settled(run_id, ids) | queued
    missing = [i for i in ids if i not in settled]
    if not missing:
        # settled, but the finalizer never finished
        finalize = meta.status.active and not _queued(direct, run_id)
        if finalize:
            load_plugins(direct.settings.plugins)
            evaluation = create(meta.eval, meta.params)
            direct.writer.finalize(run_id, evaluation, partial(_clusters, direct, meta))
            direct.runs.retire(run_id)
        return Resumption(run_id, 0, 0, finalize)
    inferred = direct.results.inferred(run_id, missing)
    to_score = [i for i in missing if i in inferred]
    to_infer = [i for i in missing if i not in inferred]
    direct.writer.reset_attempts(run_id, to_infer)
    direct.backlog.enqueue(direct.app, meta, to_infer)
    enqueue(direct.app, SCORE_TASK, meta, to_score)
    return Resumption(run_id, len(to_infer), len(to_score), False)


def _queued(direct: Direct, run_id: str) -> set[int]:
    """The samples of ``run_id`` a message still carries: in its backlog, in a broker queue,
    or held (unacknowledged) by a live worker (a dead worker's are lost until the janitor puts
    them back)."""
    carried_now = [carried(raw) for raw in direct.backlog.messages(run_id)]
    held = {tag for beat in direct.presence.live() for tag in beat.held}
    broker = Broker(direct.app, direct.redis)
    try:
        carried_now += broker.waiting(held).get(run_id, [])
    finally:
        broker.close()
    return {i for task in carried_now if task is not None for i in task.sample_ids}


def _clusters(direct: Direct, meta: RunMeta, sample_ids: list[int]) -> dict[int, str] | None:
    """The clusters of a run's samples, read from its data where this client runs."""
    rows = direct.split_rows(direct.spec(meta.run_id))
    return create(meta.eval, meta.params).clusters({i: rows[i] for i in sample_ids})
