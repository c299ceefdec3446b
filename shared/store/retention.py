"""Retention: purging ended runs, wholly, from Redis and from the archive.

``evalq purge`` (admins) and the retention policy (:func:`retain`: runs older than
``EVALQ_KEEP_RUNS_DAYS``, audit entries older than ``EVALQ_AUDIT_DAYS``; applied by the
gateway's retainer, :mod:`evalq.producer.gateway.retainer`, or once by ``evalq retention``) come
here. Both need the operator's rights (the ``gateway`` ACL user): the ``worker`` user may touch
neither the audit stream nor a run's facts. A purge removes a run's record, counters,
aggregate, stats, provenance, release record, per-sample keys and archive folder (every
attempt's), and its entry in the run index; a going run is never purged. What stays: the
audit stream's entries about the run (their own rule, ``EVALQ_AUDIT_DAYS``) and the budget it
was charged.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

import redis

from evalq.shared.connection import server_time
from evalq.shared.errors import InputError, UnknownRunError
from evalq.shared.keys import ACTIVE, RUNS, RunKeys, release_run_key
from evalq.shared.models import RunMeta, RunStatus
from evalq.shared.settings import Settings
from evalq.shared.store.archive import remove_run, run_folder
from evalq.shared.store.audit import record, trim_audit
from evalq.shared.store.runs import RunStore

__all__ = ["PURGE_PER_PASS", "Retained", "archive_due", "expired", "parse_age", "purge", "retain"]

log = logging.getLogger(__name__)

_PAGE = 100
"""Runs looked at per call of :func:`expired`."""

PURGE_PER_PASS = 100
"""Most runs one pass of :func:`retain` purges for their age (the rest wait for the next)."""


@dataclass
class Retained:
    """What one pass of :func:`retain` did."""

    trimmed: int = 0
    """Audit entries dropped for their age."""
    purged: list[str] = field(default_factory=list)
    """Runs purged for their age."""


def retain(client: redis.Redis, settings: Settings, who: str = "retention") -> Retained:
    """One pass of the retention policy: trim the audit entries older than
    ``EVALQ_AUDIT_DAYS``, then purge (wholly, audited as ``purge`` by ``who``) at most
    :data:`PURGE_PER_PASS` ended runs submitted more than ``EVALQ_KEEP_RUNS_DAYS`` ago."""
    now = server_time(client)
    done = Retained(trimmed=trim_audit(client, settings.audit_days, now))
    keep = settings.keep_runs_days
    if keep is None:
        return done
    for run_id in expired(client, now - keep * 86400):
        if purge(client, run_id, settings.archive_url):
            record(client, "purge", who, run=run_id, after={"keep_days": keep})
            done.purged.append(run_id)
        if len(done.purged) >= PURGE_PER_PASS:
            break
    if done.purged:
        log.warning("retention: purged %d runs older than %g days", len(done.purged), keep)
    return done


def expired(client: redis.Redis, before: float) -> Iterator[str]:
    """The ids of the runs submitted before Unix time ``before``, oldest first (read a page at
    a time; going ones too: :func:`purge` leaves those)."""
    start = 0
    while page := client.zrangebyscore(RUNS, "-inf", f"({before}", start=start, num=_PAGE):
        yield from (str(r) for r in page)
        start += len(page)


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}


def parse_age(text: str) -> float:
    """Seconds in an age such as ``30d``, ``12h``, ``45m``, ``90s`` or ``2w``."""
    number, unit = text.strip()[:-1], text.strip()[-1:].lower()
    try:
        seconds = float(number) * _UNITS[unit]
    except (KeyError, ValueError):
        raise InputError(
            f"'{text}' is not an age: a number and s, m, h, d or w (e.g. 30d)"
        ) from None
    if not seconds > 0:
        raise InputError(f"'{text}' is not an age: it must be more than zero")
    return seconds


def purge(client: redis.Redis, run_id: str, archive_url: str) -> bool:
    """Remove the ended run ``run_id`` everywhere (see the module); False if it is going, or
    unknown. Its archive is the one folder derived from the archive location its facts name
    (``archive_url`` when it has none): nothing a worker wrote names what is deleted."""
    runs = RunStore(client)
    try:
        meta = runs.get(run_id)
    except UnknownRunError:
        meta = None
    if meta is not None and meta.status.active:
        return False
    keys = RunKeys(run_id)
    try:
        folder = runs.folder(run_id)
    except UnknownRunError:
        folder = run_folder(archive_url, run_id)
    per_run = [
        keys.facts,
        keys.meta,
        keys.progress,
        keys.aggregate,
        keys.stats,
        keys.provenance,
        keys.errors,
        *keys.per_sample,
    ]
    with client.pipeline(transaction=True) as pipe:  # the record first: an archiver that
        pipe.zrem(RUNS, run_id)  # seals after this finds no run and removes its own folder
        pipe.srem(ACTIVE, run_id)
        pipe.unlink(*per_run)
        pipe.unlink(release_run_key(run_id))
        removed = pipe.execute()
    remove_run(folder)
    return meta is not None or bool(removed[0])


def archive_due(meta: RunMeta, now: float, settings: Settings) -> bool:
    """Whether an ended run is due to be archived: ``EVALQ_ARCHIVE_AFTER`` seconds after it
    completed or was cancelled, ``EVALQ_ARCHIVE_FAILED_AFTER`` after it failed."""
    if meta.status.active:
        return False
    failed = meta.status is RunStatus.FAILED
    wait = settings.archive_failed_after if failed else settings.archive_after
    return now - (meta.finished or now) >= wait
