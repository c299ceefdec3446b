"""The per-sample result store: outputs, scores and errors written once each, progress counters
bumped only by real writes, and the run's aggregate computed once from what is stored.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import redis

from shared.errors import first_line
from shared.evaluation import Evaluation
from shared.keys import RunKeys
from shared.lua import register
from shared.models import ErrorRecord, Progress, RunStatus, SampleResult, Stage
from shared.stats import Stat, describe

log = logging.getLogger(__name__)

Clusters = Callable[[list[int]], Mapping[int, str] | None]
"""Sample ids -> each one's cluster (read from the rows when the finalizer asks)."""

__all__ = ["Finished", "ResultStore", "to_json"]

_SCAN_COUNT = 1000


def to_json(value: Any) -> str:
    """Compact, strict JSON (no NaN): how every stored value is encoded."""
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


def _flatten(values: Mapping[int, str | int]) -> list[str | int]:
    """``{id: value}`` as the flat ``id1, value1, id2, value2, ...`` the scripts take."""
    return [item for pair in values.items() for item in pair]


@dataclass(frozen=True)
class Finished:
    """How :meth:`ResultStore.finalize` ended a run."""

    status: RunStatus
    aggregate: dict[str, float]
    reason: str | None


def _settled_ids(fields: Any) -> list[int]:
    """The sample ids of one entry of a run's settled stream (written by ``settle.lua``)."""
    return [int(i) for i in str(fields["ids"]).split(",")]


class ResultStore:
    """Per-sample writes (through Lua) and reads (through pipelines and scans) for runs; owns
    ``attempt.lua``, ``record_outputs.lua``, ``settle.lua``, ``finish.lua`` and
    ``recover.lua``."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._attempt = register(client, "attempt")
        self._record_outputs = register(client, "record_outputs")
        self._settle_script = register(client, "settle")
        self._finish = register(client, "finish")
        self._recover = register(client, "recover")

    def outputs(self, run_id: str, sample_ids: list[int]) -> dict[int, Any]:
        """The stored outputs of those samples that have one."""
        return {i: json.loads(v) for i, v in self.output_texts(run_id, sample_ids).items()}

    def output_texts(self, run_id: str, sample_ids: list[int]) -> dict[int, str]:
        """The stored outputs of those samples that have one, as stored (JSON text)."""
        if not sample_ids:
            return {}
        raw = self._client.hmget(RunKeys(run_id).out, sample_ids)
        return {i: str(v) for i, v in zip(sample_ids, raw, strict=True) if v is not None}

    def inferred(self, run_id: str, sample_ids: list[int]) -> set[int]:
        """Those samples that already have an output."""
        if not sample_ids:
            return set()
        flags = self._client.hmget(RunKeys(run_id).out, sample_ids)
        return {i for i, v in zip(sample_ids, flags, strict=True) if v is not None}

    def settled(self, run_id: str, sample_ids: list[int]) -> set[int]:
        """Those samples that already have a score or a terminal error."""
        if not sample_ids:
            return set()
        keys = RunKeys(run_id)
        with self._client.pipeline(transaction=False) as pipe:
            pipe.hmget(keys.score, sample_ids)
            pipe.hmget(keys.err, sample_ids)
            scores, errors = pipe.execute()
        return {i for i, s, e in zip(sample_ids, scores, errors, strict=True) if s or e}

    def attempt(
        self, run_id: str, samples: dict[int, bool], stage: Stage = Stage.INFER
    ) -> dict[int, int]:
        """Count attempts at ``stage`` (infer or score) of samples (sample id -> arrived alone);
        a negative count marks a sample tried before that arrived with others and must be sent
        on alone."""
        if not samples:
            return {}
        flat = _flatten({sample_id: int(solo) for sample_id, solo in samples.items()})
        counts = self._attempt(keys=[RunKeys(run_id).attempts_of(stage)], args=flat)
        return dict(zip(samples, (int(c) for c in counts), strict=True))

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

    def record_outputs(self, run_id: str, outputs: dict[int, str]) -> int:
        """Write each output (JSON text, see :func:`to_json`) unless one exists; return how many
        were new."""
        if not outputs:
            return 0
        keys = RunKeys(run_id)
        return int(
            self._record_outputs(keys=[keys.out, keys.progress, keys.meta], args=_flatten(outputs))
        )

    def record_scores(self, run_id: str, scores: dict[int, dict[str, float]]) -> bool:
        """Settle samples with their scores; True if this caller must finalize the run."""
        return self._settle(run_id, "score", {i: to_json(s) for i, s in scores.items()})

    def record_errors(self, run_id: str, errors: dict[int, ErrorRecord]) -> bool:
        """Settle samples with terminal errors; True if this caller must finalize the run."""
        encoded = {i: e.model_dump_json() for i, e in errors.items()}
        return self._settle(run_id, "err", encoded)

    def claim_finalize(self, run_id: str, stale_after: float) -> bool:
        """True if every sample is settled, the run is going, and nobody holds a claim to
        finalize it younger than ``stale_after`` seconds: the caller must finalize it."""
        return self._settle(run_id, "score", {}, stale_after)

    def _settle(
        self, run_id: str, kind: str, values: dict[int, str], stale_after: float | None = None
    ) -> bool:
        if not values and stale_after is None:
            return False
        keys = RunKeys(run_id)
        _, finalize = self._settle_script(
            keys=[keys.score, keys.err, keys.progress, keys.meta, keys.settled],
            args=[kind, "" if stale_after is None else stale_after, *_flatten(values)],
        )
        return bool(finalize)

    def finalize(
        self, run_id: str, evaluation: Evaluation, clusters: Clusters | None = None
    ) -> Finished | None:
        """Compute the aggregate, and each metric's uncertainty (:func:`shared.stats.describe`,
        clustered by what ``clusters`` gives for the scored ids, when the evaluation declares
        a cluster field), from every stored score and end the run:
        completed, or failed when no sample could be scored or ``aggregate()`` raised. None if
        the run had ended already (cancelled meanwhile, or finished by another finalizer)."""
        scores = self.scores(run_id)
        finished = Finished(RunStatus.FAILED, {}, "no sample could be scored")
        encoded, stats = to_json(finished.aggregate), ""
        if scores:
            try:
                values = list(scores.values())
                aggregate = {str(k): float(v) for k, v in evaluation.aggregate(values).items()}
                encoded = to_json(aggregate)  # refuses NaN: a failed aggregate like any other
                finished = Finished(RunStatus.COMPLETED, aggregate, None)
            except Exception as exc:
                reason = f"aggregate() failed: {type(exc).__name__}: {first_line(exc)}"
                finished = Finished(RunStatus.FAILED, {}, reason)
            else:
                stats = self._stats(run_id, scores, evaluation, clusters)
        keys = RunKeys(run_id)
        ended = self._finish(
            keys=[keys.meta, keys.aggregate, keys.stats],
            args=[finished.status.value, encoded, finished.reason or "", stats],
        )
        return finished if ended else None

    @staticmethod
    def _stats(
        run_id: str,
        scores: Mapping[int, Mapping[str, float]],
        evaluation: Evaluation,
        clusters: Clusters | None,
    ) -> str:
        """The stats JSON, or '' (logged) when they cannot be computed (the clusters' rows
        unreadable, say): the run still completes with its aggregate."""
        custom = evaluation.aggregate if evaluation.custom_aggregate() else None
        try:
            grouped = None
            if evaluation.cluster_field is not None:
                if clusters is None:
                    raise ValueError("its clusters were not given")
                grouped = clusters(sorted(scores))
            stats = describe(scores, custom, grouped)
            return json.dumps(
                {name: stat.model_dump(mode="json") for name, stat in stats.items()},
                allow_nan=False,
            )
        except Exception as exc:
            log.warning("run %s: no error bars: %s", run_id, first_line(exc))
            return ""

    def stats(self, run_id: str) -> dict[str, Stat] | None:
        """Each metric's uncertainty, written with the aggregate (None before, or when it
        could not be computed)."""
        raw = self._client.get(RunKeys(run_id).stats)
        if raw is None:
            return None
        return {str(k): Stat.model_validate(v) for k, v in json.loads(raw).items()}

    def recovered(self, run_id: str, samples: int) -> int:
        """Count ``samples`` sent again by the janitor and stamp the run as touched; return
        the run's total."""
        return int(self._recover(keys=[RunKeys(run_id).progress], args=[samples]))

    def scores(self, run_id: str) -> dict[int, dict[str, float]]:
        """Every scored sample's metrics, by sample id."""
        return {int(i): json.loads(v) for i, v in self._scan(RunKeys(run_id).score)}

    def progress(self, run_id: str) -> Progress:
        """The run's counters."""
        return Progress.model_validate(self._client.hgetall(RunKeys(run_id).progress))

    def aggregate(self, run_id: str) -> dict[str, float] | None:
        """The aggregate written at completion, if the run has completed."""
        raw = self._client.get(RunKeys(run_id).aggregate)
        return None if raw is None else dict(json.loads(raw))

    def fetch(self, run_id: str, sample_ids: list[int]) -> list[SampleResult]:
        """The stored results of ``sample_ids``, in that order."""
        if not sample_ids:
            return []
        keys = RunKeys(run_id)
        with self._client.pipeline(transaction=False) as pipe:
            for key in (keys.out, keys.score, keys.err):
                pipe.hmget(key, sample_ids)
            outputs, scores, errors = pipe.execute()
        return [
            SampleResult(
                sample_id=sample_id,
                output=None if output is None else json.loads(output),
                scores=None if score is None else json.loads(score),
                error=None if error is None else ErrorRecord.model_validate_json(error),
            )
            for sample_id, output, score, error in zip(
                sample_ids, outputs, scores, errors, strict=True
            )
        ]

    def results(self, run_id: str, sample_ids: Iterable[int]) -> Iterator[SampleResult]:
        """Every sample's stored result, in the order of ``sample_ids``."""
        ids = list(sample_ids)
        for start in range(0, len(ids), _SCAN_COUNT):
            yield from self.fetch(run_id, ids[start : start + _SCAN_COUNT])

    def settled_since(
        self, run_id: str, cursor: str, block_ms: int | None
    ) -> tuple[str, list[int]]:
        """Ids settled after ``cursor`` in the run's settled stream (waiting up to ``block_ms``,
        not at all when None), and the new cursor."""
        reply: Any = self._client.xread(
            {RunKeys(run_id).settled: cursor}, count=1000, block=block_ms
        )
        ids: list[int] = []
        for _, entries in reply or []:
            for entry_id, fields in entries:
                cursor = str(entry_id)
                ids.extend(_settled_ids(fields))
        return cursor, ids

    def timeline(self, run_id: str) -> list[tuple[float, int]]:
        """(Unix time, samples settled) of every write that settled samples, oldest first; the
        time is the settled stream's entry id."""
        entries: Any = self._client.xrange(RunKeys(run_id).settled)
        return [
            (int(str(entry_id).split("-")[0]) / 1000, len(_settled_ids(fields)))
            for entry_id, fields in entries or []
        ]

    def errors_by_kind(self, run_id: str) -> dict[str, int]:
        """Terminal errors counted by stage and exception class, e.g. ``infer/RuntimeError``."""
        counts: Counter[str] = Counter()
        for _, raw in self._scan(RunKeys(run_id).err):
            error = ErrorRecord.model_validate_json(raw)
            counts[f"{error.stage.value}/{error.kind}"] += 1
        return dict(counts.most_common())

    def _scan(self, key: str) -> Iterator[tuple[str, str]]:
        yield from self._client.hscan_iter(key, count=_SCAN_COUNT)
