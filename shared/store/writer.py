"""The writes workers make to a run's per-sample results, each one Lua script: attempts counted
before a sample runs (``attempt.lua``), outputs stored once (``record_outputs.lua``), scores
and errors settled once, electing the one finalizer (``settle.lua``), the run ended with its
aggregate (``finish.lua``), and samples the janitor sent again counted (``recover.lua``).

Every write skips a spilled sample and writes nothing once the run has ended, so counters move
only with real writes and no per-sample key comes back after a seal.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import redis
from redis.commands.core import Script

from evalq.shared.evaluation import Evaluation
from evalq.shared.keys import LIVE_BYTES, UNSENT, RunKeys
from evalq.shared.models import ErrorRecord, Grade, Stage, to_json
from evalq.shared.store.aggregate import Clusters, Finished, conclude
from evalq.shared.store.reader import ResultReader
from evalq.shared.store.runs import RunStore
from evalq.shared.store.scripts import flatten, register
from evalq.shared.store.wire import consecutive, span_of

__all__ = ["Delivery", "ResultWriter", "Settled"]

_SIZES = 4096
"""Runs whose sample count a :class:`ResultWriter` keeps (oldest dropped first)."""


@dataclass(frozen=True)
class Delivery:
    """The samples one message brought to be attempted."""

    key: str
    """Names the message, the same on each delivery of it (its Celery task id)."""
    solo: bool
    """It carries one sample sent alone (tried before; may kill its worker)."""
    sample_ids: list[int]


@dataclass(frozen=True)
class Settled:
    """What one settling write did."""

    finalize: bool
    """This caller must finalize the run."""
    written: int
    """Samples it settled."""
    settled: int
    """The run's samples settled so far."""

    def filled(self, rows: int) -> bool:
        """This write took the run's settled samples past a multiple of ``rows``: a segment
        may be complete (see ``EVALQ_SPILL_ROWS``)."""
        before = self.settled - self.written
        return rows > 0 and self.written > 0 and before // rows < self.settled // rows


def _messages(deliveries: list[Delivery]) -> list[str | int]:
    """The messages as ``attempt.lua`` takes them (those that bring no sample left out; the
    samples lo, lo + 1, ... of a message as ``-n, lo``)."""
    args: list[str | int] = []
    for delivery in deliveries:
        ids = delivery.sample_ids
        if len(ids) > 1 and consecutive(ids):
            args += [delivery.key, int(delivery.solo), -len(ids), ids[0]]
        elif ids:
            args += [delivery.key, int(delivery.solo), len(ids), *ids]
    return args


def _messages_of(deliveries: list[Delivery], ids: list[int]) -> list[str | int]:
    """The messages as ``record_outputs.lua`` takes them after outputs of ``ids``: when they
    bring exactly those samples, in that order, each without its ids (``'='`` first), else as
    :func:`_messages`."""
    brought = [i for delivery in deliveries for i in delivery.sample_ids]
    if brought != ids:
        return _messages(deliveries)
    args: list[str | int] = ["="]
    for delivery in deliveries:
        if delivery.sample_ids:
            args += [delivery.key, int(delivery.solo), len(delivery.sample_ids)]
    return args


def _span_or_each(
    script: Script, keys: list[str], as_span: list[Any] | None, each: list[Any]
) -> list[Any]:
    """``script``'s reply to the samples as one span (``as_span``), or, when they are not one
    or some of them has its result already (the script answers -1 and writes nothing), one by
    one (``each``)."""
    if as_span is not None:
        reply = script(keys=keys, args=as_span)
        if int(reply[0]) >= 0:
            return list(reply)
    return list(script(keys=keys, args=each))


def _given(values: dict[int, str], extra: Mapping[int, str]) -> list[str | int]:
    """Samples' texts as the scripts take them: ``id, text`` each, or, when ``extra`` (their
    usages, their grades) is not empty, ``id, text, extra text`` (``''`` for none) each."""
    if not extra:
        return flatten(values)
    return [x for i, text in values.items() for x in (i, text, extra.get(i, ""))]


def _counts(deliveries: list[Delivery], counts: list[int]) -> dict[int, int]:
    """``attempt.lua``'s counts by sample id."""
    ids = [i for delivery in deliveries for i in delivery.sample_ids]
    return dict(zip(ids, (int(c) for c in counts), strict=True))


class ResultWriter:
    """Per-sample writes for runs; see the module."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._runs = RunStore(client)
        self._reader = ResultReader(client)
        self._attempt = register(client, "evalq.shared.store", "attempt")
        self._record_outputs = register(client, "evalq.shared.store", "record_outputs")
        self._settle_script = register(client, "evalq.shared.store", "settle", confirmed=True)
        self._finish = register(client, "evalq.shared.store", "finish", confirmed=True)
        self._recover = register(client, "evalq.shared.store", "recover")
        self._sizes: dict[str, int] = {}

    def _size(self, run_id: str) -> int:
        """The run's sample count (:meth:`RunStore.size`), read once per run: facts never
        change (a run not found is asked again)."""
        size = self._sizes.get(run_id)
        if size is None:
            size = self._runs.size(run_id)
            if size < 0:
                return size
            self._sizes[run_id] = size
            if len(self._sizes) > _SIZES:
                del self._sizes[next(iter(self._sizes))]
        return size

    def attempt(
        self, run_id: str, deliveries: list[Delivery], stage: Stage = Stage.INFER
    ) -> dict[int, int]:
        """Count attempts at ``stage`` (infer or score) of the samples the messages brought (no
        sample in two of them); a negative count marks a sample tried before that arrived with
        others and must be sent on alone. A message of several samples is counted once on its
        first delivery (``attempt.lua``)."""
        args = _messages(deliveries)
        if not args:
            return {}
        keys = RunKeys(run_id)
        counts = self._attempt(keys=self._attempt_keys(keys, stage), args=args)
        return _counts(deliveries, counts)

    def carry_attempts(self, run_id: str, counts: dict[int, int], stage: Stage) -> None:
        """Samples counted with their message (see :meth:`attempt`) go on alone: give each its
        count at ``stage``, so that its attempts alone count on from there."""
        if counts:
            keys = RunKeys(run_id)
            self._attempt(keys=self._attempt_keys(keys, stage), args=["carry", *flatten(counts)])

    @staticmethod
    def _attempt_keys(keys: RunKeys, stage: Stage) -> list[str]:
        return [keys.attempts_of(stage), keys.meta, keys.spilled, keys.deliveries_of(stage)]

    def reset_attempts(self, run_id: str, sample_ids: list[int]) -> None:
        """Forget the attempt counts of samples at both stages (``evalq resume`` gives them a
        fresh start)."""
        if sample_ids:
            keys = RunKeys(run_id)
            fields = [str(i) for i in sample_ids]
            with self._client.pipeline(transaction=False) as pipe:
                pipe.hdel(keys.attempts_of(Stage.INFER), *fields)
                pipe.hdel(keys.attempts_of(Stage.SCORE), *fields)
                pipe.execute()

    def record_outputs(
        self, run_id: str, outputs: dict[int, str], usages: Mapping[int, str] | None = None
    ) -> int:
        """Write each output (JSON text, see :func:`to_json`) unless one exists, with its
        usage (:meth:`evalq.shared.models.Usage.stored`) when ``usages`` has one, counting
        those tokens; return how many were new."""
        return self.record_outputs_scoring(run_id, outputs, [], usages)[0]

    def live_bytes(self, run_id: str, change: int) -> int:
        """Add ``change`` to the bytes of outputs the run holds in Redis (what workers stored,
        less what spilled: ``live_bytes`` in its progress hash, which the archive removes with
        it) and return the new count."""
        return int(self._client.hincrby(RunKeys(run_id).progress, LIVE_BYTES, change))

    def record_outputs_scoring(
        self,
        run_id: str,
        outputs: dict[int, str],
        scoring: list[Delivery],
        usages: Mapping[int, str] | None = None,
    ) -> tuple[int, dict[int, int] | None]:
        """:meth:`record_outputs`, and in the same call, once every output was new, the
        attempt at scoring of the samples the messages ``scoring`` bring (see :meth:`attempt`):
        (outputs new, the attempt counts, or None when not counted: some output was not new,
        or ``scoring`` brings no sample)."""
        if not outputs:
            return 0, None
        keys = RunKeys(run_id)
        used = usages or {}
        span = None if used else span_of(outputs)
        head = [3 if used else 2, len(outputs)]
        script_keys = [
            keys.out,
            keys.progress,
            keys.meta,
            keys.spilled,
            keys.attempts_of(Stage.SCORE),
            keys.deliveries_of(Stage.SCORE),
            keys.inferred,
            keys.ranges_of("outputs"),
            keys.usage,
        ]
        attempt = _messages_of(scoring, list(outputs)) if scoring else []
        reply = _span_or_each(
            self._record_outputs,
            script_keys,
            None if span is None else [*head, "~", *span, *attempt],
            [*head, *_given(outputs, used), *attempt],
        )
        written, *counts = (int(c) for c in reply)
        if written != len(outputs) or not any(d.sample_ids for d in scoring):
            return written, None
        return written, _counts(scoring, counts)

    def record_scores(
        self,
        run_id: str,
        scores: dict[int, dict[str, float]],
        grades: Mapping[int, Grade] | None = None,
        counted_alone: bool = True,
    ) -> Settled:
        """Settle samples with their scores, each with the grade it came from when it has one
        (a ``model_graded`` task's, stored in a field of its own). ``counted_alone=False`` says
        none of them has an attempt count of its own to delete (see :meth:`attempt`)."""
        encoded = {i: to_json(s) for i, s in scores.items()}
        graded = {i: g.stored() for i, g in (grades or {}).items() if i in scores}
        return self._settle(run_id, "score", encoded, counted_alone=counted_alone, grades=graded)

    def record_errors(
        self, run_id: str, errors: dict[int, ErrorRecord], counted_alone: bool = True
    ) -> Settled:
        """Settle samples with terminal errors (``counted_alone``: see :meth:`record_scores`)."""
        encoded = {i: e.model_dump_json() for i, e in errors.items()}
        return self._settle(run_id, "err", encoded, counted_alone=counted_alone)

    def claim_finalize(self, run_id: str, stale_after: float) -> bool:
        """True if every sample is settled, the run is going, and nobody holds a claim to
        finalize it younger than ``stale_after`` seconds: the caller must finalize it."""
        return self._settle(run_id, "score", {}, stale_after).finalize

    def _settle(
        self,
        run_id: str,
        kind: str,
        values: dict[int, str],
        stale_after: float | None = None,
        *,
        counted_alone: bool = True,
        grades: Mapping[int, str] | None = None,
    ) -> Settled:
        if not values and stale_after is None:
            return Settled(False, 0, 0)
        keys = RunKeys(run_id)
        script_keys = [
            keys.score,
            keys.err,
            keys.progress,
            keys.meta,
            keys.settled,
            keys.attempts_of(Stage.INFER),
            keys.attempts_of(Stage.SCORE),
            keys.spilled,
            keys.done,
            keys.ranges_of("scores"),
            keys.grade,
        ]
        graded = grades or {}
        head = [
            kind,
            "" if stale_after is None else stale_after,
            self._size(run_id),
            3 if graded else 2,
            int(counted_alone),
        ]
        span = span_of(values) if kind == "score" and not graded else None
        written, finalize, settled = _span_or_each(
            self._settle_script,
            script_keys,
            None if span is None else [*head, "~", span[0], len(values), span[1]],
            [*head, *_given(values, graded)],
        )
        return Settled(bool(finalize), int(written), int(settled))

    def finalize(
        self, run_id: str, evaluation: Evaluation, clusters: Clusters | None = None
    ) -> Finished | None:
        """End the run as :func:`evalq.shared.store.aggregate.conclude` decides from every stored
        score and failure (:meth:`ResultReader.counted`), with its aggregate and stats. None if
        the run had ended already (cancelled meanwhile, or finished by another finalizer)."""
        counted = self._reader.counted(run_id, evaluation.failure_rule())
        finished, aggregate, stats = conclude(run_id, counted, evaluation, clusters)
        keys = RunKeys(run_id)
        unsent = run_id if counted.unsent else ""
        ended = self._finish(
            keys=[
                keys.meta,
                keys.aggregate,
                keys.stats,
                UNSENT,
                keys.attempts_of(Stage.INFER),
                keys.attempts_of(Stage.SCORE),
                keys.deliveries_of(Stage.INFER),
                keys.deliveries_of(Stage.SCORE),
            ],
            args=[finished.status.value, aggregate, finished.reason or "", stats, unsent],
        )
        return finished if ended else None

    def recovered(self, run_id: str, samples: int) -> int:
        """Count ``samples`` sent again by the janitor and stamp the run as touched; return
        the run's total."""
        return int(self._recover(keys=[RunKeys(run_id).progress], args=[samples]))
