"""Run records in Redis: creation, lookup, listing and cancellation."""

from __future__ import annotations

import json
import time
from typing import Any

import redis
from pydantic import BaseModel, ConfigDict
from redis.typing import EncodableT, FieldT

from shared.errors import UnknownRunError
from shared.keys import ACTIVE, RUNS, RunKeys
from shared.lua import register
from shared.models import RunMeta, RunStatus

__all__ = ["RunFilter", "RunStore"]


def _encode(meta: RunMeta) -> dict[FieldT, EncodableT]:
    fields = meta.model_dump(mode="json", exclude_none=True)
    fields["params"] = json.dumps(meta.params, sort_keys=True)
    fields["tags"] = json.dumps(list(meta.tags))
    return {k: str(v) for k, v in fields.items()}


def _decode(run_id: str, raw: dict[Any, Any]) -> RunMeta:
    tags = json.loads(raw.get("tags", "[]"))
    return RunMeta.model_validate(
        {**raw, "run_id": run_id, "params": json.loads(raw["params"]), "tags": tags}
    )


class RunFilter(BaseModel):
    """Which runs ``runs`` lists: every condition given must hold."""

    model_config = ConfigDict(frozen=True)

    eval: str | None = None
    dataset: str | None = None
    sweep: str | None = None
    tag: str | None = None
    status: RunStatus | None = None

    def matches(self, meta: RunMeta) -> bool:
        """Whether ``meta`` passes every condition given."""
        return (
            (self.eval is None or meta.eval == self.eval)
            and (self.dataset is None or meta.dataset_id == self.dataset)
            and (self.sweep is None or meta.sweep == self.sweep)
            and (self.tag is None or self.tag in meta.tags)
            and (self.status is None or meta.status is self.status)
        )


class RunStore:
    """Reads and writes ``evalq:{run}:meta`` / ``:ids`` and the ``evalq:runs`` index; owns
    ``cancel.lua`` and ``claim_archive.lua``."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._cancel = register(client, "cancel")
        self._claim_archive = register(client, "claim_archive")

    def create(self, meta: RunMeta, sample_ids: list[int]) -> None:
        """Record a new run and its sample ids in one transaction."""
        keys = RunKeys(meta.run_id)
        with self._client.pipeline(transaction=True) as pipe:
            pipe.hset(keys.meta, mapping=_encode(meta))
            pipe.set(keys.ids, json.dumps(sample_ids, separators=(",", ":")))
            pipe.zadd(RUNS, {meta.run_id: meta.created})
            pipe.sadd(ACTIVE, meta.run_id)
            pipe.execute()

    def get(self, run_id: str) -> RunMeta:
        """The run's record; :class:`UnknownRunError` if there is none."""
        raw = self._client.hgetall(RunKeys(run_id).meta)
        if not raw:
            raise UnknownRunError(f"no run '{run_id}'")
        return _decode(run_id, raw)

    def sample_ids(self, run_id: str) -> list[int]:
        """The run's sample ids in submission order."""
        raw = self._client.get(RunKeys(run_id).ids)
        if raw is None:
            raise UnknownRunError(f"no run '{run_id}'")
        return [int(i) for i in json.loads(raw)]

    def recent(
        self, limit: int = 20, owner: str | None = None, only: RunFilter | None = None
    ) -> list[RunMeta]:
        """The newest runs first (only those ``owner`` submitted and ``only`` matches, when
        given)."""
        found: list[RunMeta] = []
        start = 0
        while len(found) < limit:
            page = max(limit, 100) if owner or only else limit
            run_ids = [str(r) for r in self._client.zrevrange(RUNS, start, start + page - 1)]
            if not run_ids:
                break
            start += len(run_ids)
            with self._client.pipeline(transaction=False) as pipe:
                for run_id in run_ids:
                    pipe.hgetall(RunKeys(run_id).meta)
                records = pipe.execute()
            metas = [_decode(r, raw) for r, raw in zip(run_ids, records, strict=True) if raw]
            found += [
                m
                for m in metas
                if (owner is None or m.principal == owner) and (only is None or only.matches(m))
            ]
        return found[:limit]

    def active(self) -> list[str]:
        """Ids of the runs not yet retired (queued or running, or ended since the janitor's
        last look)."""
        return sorted(str(r) for r in self._client.smembers(ACTIVE))

    def claim_archive(self, run_id: str, now: float, retry_after: float | None = None) -> bool:
        """True if the caller must send the run to be archived: nobody did, or (with
        ``retry_after``: the janitor, the one caller that retries) the last one sent was
        ``retry_after`` seconds ago or more (``claim_archive.lua``)."""
        again = "" if retry_after is None else retry_after
        return bool(self._claim_archive(keys=[RunKeys(run_id).meta], args=[repr(now), again]))

    def retire(self, run_id: str) -> None:
        """Take an ended run off the janitor's worklist."""
        self._client.srem(ACTIVE, run_id)

    def cancel(self, run_id: str) -> tuple[int, int]:
        """Stop a run: no result is written after this (the janitor archives it). Return (1
        cancelled now, 0 cancelled before, or -1 already finished; samples with neither an
        output nor an error)."""
        keys = RunKeys(run_id)
        state, unproduced = self._cancel(
            keys=[keys.meta, keys.out, keys.err, keys.backlog, keys.spilled], args=[time.time()]
        )
        return int(state), int(unproduced)
