"""The requests an lm-eval task's run was built with (:mod:`evalq.shared.lm.lmeval`), kept per
run in Redis (``RunKeys.requests``: sample id -> its requests' JSON), written once by the
producer that built them and read by the workers, a batch's samples in one ``HMGET``.

Why Redis and not a file in the data store: every process that builds or answers them already
holds a client of this Redis (a gateway may have no write access to the data store, and a
worker's data cache reads registered sources only); they are the run's own, so they go with
its other per-sample keys when it is archived or purged (``RunKeys.per_sample``); and a
redelivered or resumed sample finds the very requests its run was built with.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

import redis
from pydantic import TypeAdapter

from evalq.shared.errors import PermanentError
from evalq.shared.keys import RunKeys
from evalq.shared.lm.harness import HarnessRequest

__all__ = ["RequestStore"]

_REQUESTS = TypeAdapter(list[HarnessRequest])
_CHUNK = 1000


class RequestStore:
    """Each sample's lm-eval requests, per run."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client

    @staticmethod
    def encoded(built: Mapping[int, Sequence[HarnessRequest]]) -> tuple[dict[str, bytes], str]:
        """``built`` as stored (sample id -> JSON), and the sha256 of it all (in sample
        order), which the run's record keeps."""
        fields = {str(i): _REQUESTS.dump_json(list(built[i])) for i in sorted(built)}
        digest = hashlib.sha256()
        for key, value in fields.items():
            digest.update(key.encode() + b"\0" + value + b"\0")
        return fields, digest.hexdigest()

    def put(self, run_id: str, fields: Mapping[str, bytes]) -> None:
        """Store a run's encoded requests (:meth:`encoded`)."""
        key = RunKeys(run_id).requests
        items = list(fields.items())
        with self._client.pipeline(transaction=False) as pipe:
            for start in range(0, len(items), _CHUNK):
                pipe.hset(key, mapping=dict(items[start : start + _CHUNK]))
            pipe.execute()

    def get(self, run_id: str, sample_ids: Sequence[int]) -> list[list[HarnessRequest]]:
        """The requests of ``sample_ids``; :class:`PermanentError` for a sample the run has
        none for (its run was archived or purged)."""
        if not sample_ids:
            return []
        raw = self._client.hmget(RunKeys(run_id).requests, [str(i) for i in sample_ids])
        found = []
        for sample_id, value in zip(sample_ids, raw, strict=True):
            if value is None:
                raise PermanentError(f"run {run_id}: no lm-eval requests for sample {sample_id}")
            found.append(_REQUESTS.validate_json(value))
        return found
