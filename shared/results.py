"""The per-sample result store: outputs, scores and errors written once each, progress counters
bumped only by real writes, and the run's aggregate computed once from what is stored.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import redis

from shared.evaluation import Evaluation
from shared.keys import RunKeys
from shared.lua import register
from shared.models import ErrorRecord, Progress, RunStatus, SampleResult

__all__ = ["ResultStore", "to_json"]

_SCAN_COUNT = 1000


def to_json(value: Any) -> str:
    """Compact, strict JSON (no NaN): how every stored value is encoded."""
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


def _flatten(values: Mapping[int, str | int]) -> list[str | int]:
    """``{id: value}`` as the flat ``id1, value1, id2, value2, ...`` the scripts take."""
    return [item for pair in values.items() for item in pair]


def _settled_ids(fields: Any) -> list[int]:
    """The sample ids of one entry of a run's settled stream (written by ``settle.lua``)."""
    return [int(i) for i in str(fields["ids"]).split(",")]


class ResultStore:
    """Per-sample writes (through Lua) and reads (through pipelines and scans) for runs; owns
    ``attempt.lua``, ``record_outputs.lua`` and ``settle.lua``."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._attempt = register(client, "attempt")
        self._record_outputs = register(client, "record_outputs")
        self._settle_script = register(client, "settle")

    def outputs(self, run_id: str, sample_ids: list[int]) -> dict[int, Any]:
        """The stored outputs of those samples that have one."""
        if not sample_ids:
            return {}
        raw = self._client.hmget(RunKeys(run_id).out, sample_ids)
        return {i: json.loads(v) for i, v in zip(sample_ids, raw, strict=True) if v is not None}

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

    def attempt(self, run_id: str, samples: dict[int, bool]) -> dict[int, int]:
        """Count inference attempts (sample id -> arrived alone); a negative count marks a
        sample tried before that arrived with others and must be sent on alone."""
        if not samples:
            return {}
        flat = _flatten({sample_id: int(solo) for sample_id, solo in samples.items()})
        counts = self._attempt(keys=[RunKeys(run_id).attempts], args=flat)
        return dict(zip(samples, (int(c) for c in counts), strict=True))

    def reset_attempts(self, run_id: str, sample_ids: list[int]) -> None:
        """Forget the attempt counts of samples (``evalq resume`` gives them a fresh start)."""
        if sample_ids:
            self._client.hdel(RunKeys(run_id).attempts, *[str(i) for i in sample_ids])

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

    def _settle(self, run_id: str, kind: str, values: dict[int, str]) -> bool:
        if not values:
            return False
        keys = RunKeys(run_id)
        _, finalize = self._settle_script(
            keys=[keys.score, keys.err, keys.progress, keys.meta, keys.settled],
            args=[kind, *_flatten(values)],
        )
        return bool(finalize)

    def finalize(self, run_id: str, evaluation: Evaluation) -> dict[str, float]:
        """Compute the aggregate from every stored score; the run is then completed (or failed,
        when no sample could be scored)."""
        scores = [json.loads(v) for _, v in self._scan(RunKeys(run_id).score)]
        aggregate = evaluation.aggregate(scores) if scores else {}
        status = RunStatus.COMPLETED if scores else RunStatus.FAILED
        keys = RunKeys(run_id)
        with self._client.pipeline(transaction=True) as pipe:
            pipe.set(keys.aggregate, to_json(aggregate))
            pipe.hset(keys.meta, mapping={"status": status.value, "finished": str(time.time())})
            pipe.execute()
        return aggregate

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
