"""Run records in Redis: creation, lookup, listing and cancellation."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import redis
from redis.typing import EncodableT, FieldT

from evalq.shared.errors import UnknownRunError
from evalq.shared.keys import ACTIVE, RUNS, RunKeys
from evalq.shared.models import RunFilter, RunMeta
from evalq.shared.store.archive import run_folder
from evalq.shared.store.scripts import register

__all__ = ["RunStore"]


STATE = ("status", "finished", "reason", "archived")
"""The fields of a run's record that workers write (``evalq:{run}:meta``); every other field is
a fact (``evalq:facts:{run}``), written only by a producer."""

PENDING_SECONDS = 3600
"""How long a run recorded but not yet opened by :meth:`evalq.shared.access.ledger.Ledger.reserve`
lives: a producer killed between the two leaves nothing that outlasts this."""


def _encode(
    meta: RunMeta, archive: str
) -> tuple[dict[FieldT, EncodableT], dict[FieldT, EncodableT]]:
    """The run's facts (with its ``archive`` location) and its initial state."""
    fields = meta.model_dump(mode="json", exclude_none=True)
    fields["params"] = json.dumps(meta.params, sort_keys=True)
    fields["tags"] = json.dumps(list(meta.tags))
    fields["archive"] = archive
    state: dict[FieldT, EncodableT] = {k: str(fields.pop(k)) for k in STATE if k in fields}
    fields.pop("run_id")
    return {k: str(v) for k, v in fields.items()}, state


_PAGE = 1000
"""Runs read per round trip by :meth:`RunStore.recent`: a count of every run (``limit`` of
2**31) reads them a page at a time, not in one pipeline."""


def _decode(run_id: str, facts: dict[Any, Any], state: dict[Any, Any]) -> RunMeta:
    """A run's record: its facts, and of its state only the fields workers may write."""
    tags = json.loads(facts.get("tags", "[]"))
    written = {k: v for k, v in state.items() if k in STATE}
    return RunMeta.model_validate(
        {
            **facts,
            **written,
            "run_id": run_id,
            "params": json.loads(facts["params"]),
            "tags": tags,
            "charged": facts.get("charged") == "True",
            "ended_seen": "ended" in facts,
        }
    )


class RunStore:
    """Reads and writes ``evalq:facts:{run}``, ``evalq:{run}:meta`` / ``:ids`` and the
    ``evalq:runs`` index; owns ``cancel.lua`` and ``claim_archive.lua``."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._cancel = register(client, "evalq.shared.store", "cancel", confirmed=True)
        self._claim_archive = register(client, "evalq.shared.store", "claim_archive")

    def create(self, meta: RunMeta, sample_ids: list[int], archive: str) -> None:
        """Record a new run (its facts, with ``archive`` as the location its results go under,
        and its sample ids) in one transaction, pending: nobody sees it, and it expires after
        :data:`PENDING_SECONDS`, until :meth:`evalq.shared.access.ledger.Ledger.reserve` charges
        and opens it in one script (so a producer killed between the two leaves no charge without a
        run, nor a run without its charge)."""
        keys = RunKeys(meta.run_id)
        facts, state = _encode(meta, archive)
        facts["charged"] = "False"
        with self._client.pipeline(transaction=True) as pipe:
            pipe.hset(keys.facts, mapping=facts)
            pipe.hset(keys.meta, mapping=state)
            pipe.set(keys.ids, json.dumps(sample_ids, separators=(",", ":")))
            for key in (keys.facts, keys.meta, keys.ids):
                pipe.expire(key, PENDING_SECONDS)
            pipe.execute()

    def discard(self, run_id: str) -> None:
        """Remove a run recorded but never opened (its charge was refused)."""
        keys = RunKeys(run_id)
        self._client.unlink(keys.facts, keys.meta, keys.ids)

    def get(self, run_id: str) -> RunMeta:
        """The run's record; :class:`UnknownRunError` if there is none."""
        keys = RunKeys(run_id)
        with self._client.pipeline(transaction=False) as pipe:
            pipe.hgetall(keys.facts)
            pipe.hgetall(keys.meta)
            facts, state = pipe.execute()
        if not facts or not state:
            raise UnknownRunError.named(run_id)
        return _decode(run_id, facts, state)

    def saw_end(self, meta: RunMeta) -> None:
        """Write in an ended run's facts that a producer saw it end (once; producers only: the
        ``worker`` user cannot), so that no later cancel refunds it, whatever its state says
        by then (a record rewritten with the worker credential, its results archived)."""
        if not meta.status.active and not meta.ended_seen:
            keys = RunKeys(meta.run_id)
            with self._client.pipeline(transaction=True) as pipe:
                pipe.exists(keys.facts)
                pipe.hsetnx(keys.facts, "ended", meta.status.value)
                exists, _ = pipe.execute()
            if not exists:
                self._client.delete(keys.facts)  # purged meanwhile: no record comes back

    def folder(self, run_id: str) -> str:
        """The run's folder under the archive location its facts name (the gateway's choice,
        not a worker's): where its parts and archive go, and all a purge deletes;
        :class:`UnknownRunError` when it has no facts."""
        found = self._client.hget(RunKeys(run_id).facts, "archive")
        if found is None:
            raise UnknownRunError.named(run_id)
        return run_folder(str(found), run_id)

    def size(self, run_id: str) -> int:
        """The run's sample count, from its facts (-1: no such run). The scripts that need it
        take it as an argument: a key the caller may only read (workers never write a run's
        facts) cannot be a script's key, since Redis's ACL asks for write access to every key
        of ``EVALSHA``."""
        found = self._client.hget(RunKeys(run_id).facts, "n")
        return -1 if found is None else int(found)

    def sample_ids(self, run_id: str) -> list[int]:
        """The run's sample ids in submission order."""
        raw = self._client.get(RunKeys(run_id).ids)
        if raw is None:
            raise UnknownRunError.named(run_id)
        return [int(i) for i in json.loads(raw)]

    def recent(
        self,
        limit: int = 20,
        owner: str | None = None,
        only: RunFilter | None = None,
        shown: Callable[[RunMeta], RunMeta] | None = None,
    ) -> list[RunMeta]:
        """The newest runs first (only those ``owner`` submitted and ``only`` matches, when
        given; ``only`` is matched against each record as ``shown`` makes it for the reader,
        so that a filter tells nothing the record it shows does not)."""
        found: list[RunMeta] = []
        start = 0
        while len(found) < limit:
            page = min(max(limit, 100) if owner or only else limit, _PAGE)
            run_ids = [str(r) for r in self._client.zrevrange(RUNS, start, start + page - 1)]
            if not run_ids:
                break
            start += len(run_ids)
            with self._client.pipeline(transaction=False) as pipe:
                for run_id in run_ids:
                    pipe.hgetall(RunKeys(run_id).facts)
                    pipe.hgetall(RunKeys(run_id).meta)
                records = pipe.execute()
            pairs = zip(run_ids, records[::2], records[1::2], strict=True)
            metas = [_decode(r, facts, state) for r, facts, state in pairs if facts and state]
            found += [
                m
                for m in metas
                if (owner is None or m.principal == owner)
                and (only is None or only.matches(m if shown is None else shown(m)))
            ]
        return found[:limit]

    def active(self) -> list[str]:
        """Ids of the runs not yet retired (queued or running, or ended since the janitor's
        last look)."""
        return sorted(str(r) for r in self._client.smembers(ACTIVE))

    def claim_archive(self, run_id: str, retry_after: float | None = None) -> bool:
        """True if the caller must send the run to be archived: nobody did, or (with
        ``retry_after``: the janitor, the one caller that retries) the last one sent was
        ``retry_after`` seconds ago or more (``claim_archive.lua``)."""
        again = "" if retry_after is None else retry_after
        return bool(self._claim_archive(keys=[RunKeys(run_id).meta], args=[again]))

    def retire(self, run_id: str) -> None:
        """Take an ended run off the janitor's worklist."""
        self._client.srem(ACTIVE, run_id)

    def cancel(self, run_id: str) -> tuple[int, int]:
        """Stop a run: no result is written after this (the janitor archives it). Return (1
        cancelled now, 0 cancelled before, or -1 already finished; samples with neither an
        output nor an error)."""
        keys = RunKeys(run_id)
        state, unproduced = self._cancel(
            keys=[keys.meta, keys.inferred, keys.done, keys.backlog, keys.scratch, keys.facts]
        )
        return int(state), int(unproduced)
