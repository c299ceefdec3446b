"""Worker presence in Redis: each worker's heartbeat (what it serves, what it holds), expiring
when the worker stops beating, and leases (the janitor's, the retainer's); owns ``lead.lua``."""

from __future__ import annotations

from collections.abc import Iterable

import redis
from pydantic import BaseModel, ValidationError

from evalq.shared.keys import JANITOR, WORKERS, worker_key
from evalq.shared.settings import Settings
from evalq.shared.store.scripts import register

__all__ = ["HEARTBEAT_MISSES", "Lease", "Presence", "WorkerBeat", "absence", "sweep_every"]

HEARTBEAT_MISSES = 5
"""Heartbeat intervals after which a silent worker counts as gone (its key expires)."""

MAX_SWEEP_EVERY = 15.0


def sweep_every(settings: Settings) -> float:
    """Seconds between two sweeps of the janitor (and passes of the retainer)."""
    return min(MAX_SWEEP_EVERY, settings.stall_after / 4)


class Lease:
    """A key with an expiry that one holder at a time takes and renews (``lead.lua``)."""

    def __init__(self, client: redis.Redis, key: str) -> None:
        self._key = key
        self._lead = register(client, "evalq.shared.store", "lead")

    def hold(self, holder: str, seconds: float, gone: str = "") -> bool:
        """Take the lease for ``seconds`` when it is free (or held by ``gone``), or renew it
        when ``holder`` holds it; True if ``holder`` holds it now."""
        ttl_ms = max(1, int(seconds * 1000))
        return bool(self._lead(keys=[self._key], args=[holder, ttl_ms, gone]))


class WorkerBeat(BaseModel):
    """One worker's heartbeat."""

    hostname: str
    """Celery node name, e.g. ``evalq-123@host``."""
    pid: int
    """Its main process."""
    evaluations: list[str]
    """Evaluations it serves (its plugins registered them)."""
    queues: list[str]
    """Queues it consumes."""
    held: list[str] = []
    """Delivery tags of the messages it holds unacknowledged."""
    runs: list[str] = []
    """The runs those messages are of: a run one of them is working on (a model generating
    for minutes) is moving, however long since its last write."""
    prefetch: int = 2
    """Messages it reserves at most (Celery's prefetch multiplier times its processes)."""
    code: dict[str, str] = {}
    """Evaluation -> sha256 of its source file as this worker loaded it (the code it runs)."""
    providers: list[str] = []
    """Model providers it runs registered language tasks on (``hf``): every task is served
    by every worker of its model's provider."""


def absence(
    workers: Iterable[WorkerBeat],
    evaluation: str,
    queues: Iterable[str],
    provider: str | None = None,
) -> str | None:
    """Why no live worker can move a run of ``evaluation`` (a language task on a model of
    ``provider``, when given) whose samples wait in ``queues``; None when some worker serves
    it on each of those queues."""
    live = list(workers)
    if not live:
        return "no live worker (start one: evalq worker)"
    if provider is not None:
        serving = [w for w in live if provider in w.providers]
        if not serving:
            return f"no live worker runs {provider!r} models"
    else:
        serving = [w for w in live if evaluation in w.evaluations]
    if not serving:
        return f"no live worker serves evaluation {evaluation!r} (check its EVALQ_PLUGINS)"
    for queue in queues:
        if not any(queue in w.queues for w in serving):
            return f"no live worker serving {evaluation!r} consumes queue {queue!r}"
    return None


class Presence:
    """Reads and writes ``evalq:workers:<hostname>`` heartbeats and the ``evalq:janitor``
    lease."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._lease = Lease(client, JANITOR)

    def beat(self, beat: WorkerBeat, interval: float) -> None:
        """Publish a heartbeat that lives ``HEARTBEAT_MISSES`` intervals."""
        ttl_ms = max(1, int(interval * HEARTBEAT_MISSES * 1000))
        self._client.set(worker_key(beat.hostname), beat.model_dump_json(), px=ttl_ms)

    def leave(self, hostname: str) -> None:
        """Remove a worker's heartbeat (it stops cleanly)."""
        self._client.delete(worker_key(hostname))

    def live(self) -> list[WorkerBeat]:
        """The heartbeats of the workers alive now."""
        keys = sorted(self._client.scan_iter(match=f"{WORKERS}*", count=1000))
        beats: list[WorkerBeat] = []
        for raw in self._client.mget(keys) if keys else []:
            if raw is None:
                continue
            try:
                beats.append(WorkerBeat.model_validate_json(raw))
            except ValidationError:
                continue
        return beats

    def lead(self, hostname: str, lease: float) -> bool:
        """Take or keep the janitor's lease for ``lease`` seconds; True if ``hostname`` leads.
        A lease held by a name with no live heartbeat (a worker that is gone, or a key written
        by hand without an expiry) is taken over."""
        holder = self._client.get(JANITOR)
        gone = "" if holder is None or holder in {b.hostname for b in self.live()} else holder
        return self._lease.hold(hostname, lease, str(gone))


def stale_code(workers: Iterable[WorkerBeat], evaluation: str, now: str | None) -> str | None:
    """Why a run of ``evaluation`` would not run its file as it is now (sha256 ``now``, as the
    producer reads it): some live worker serving it loaded other code; None otherwise."""
    if now is None:
        return None
    old = sorted({w.code[evaluation] for w in workers if w.code.get(evaluation, now) != now})
    if not old:
        return None
    codes = ", ".join(code[:12] for code in old)
    return (
        f"workers run evaluation '{evaluation}' as code {codes} but its file is now {now[:12]} "
        "(restart them to run the edit)"
    )
