"""The seal: the one atomic step that makes an archive attempt's folder an ended run's archive
and frees the run's per-sample keys in Redis (``seal.lua``), and what an archive keeps of the
run's timeline.

Writing the attempt's folder is :mod:`evalq.shared.store.archive`'s, deciding when is
:func:`evalq.worker.archiver.archive_run`'s; reading a sealed run back is
:class:`evalq.shared.store.reader.ResultReader`'s.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from enum import IntEnum

import redis

from evalq.shared.keys import RunKeys
from evalq.shared.store.runs import RunStore
from evalq.shared.store.scripts import flatten, register

__all__ = ["TIMELINE_STEP", "SealOutcome", "Sealer", "bucketed"]

TIMELINE_STEP = 0.01
"""Seconds: the settled timeline an archive keeps is summed by this step."""


def bucketed(timeline: Iterable[tuple[float, int]]) -> list[tuple[float, int]]:
    """A timeline summed by :data:`TIMELINE_STEP` (how an archive keeps it)."""
    steps: Counter[int] = Counter()
    for at, count in timeline:
        steps[int(at / TIMELINE_STEP)] += count
    return [(step * TIMELINE_STEP, count) for step, count in sorted(steps.items())]


class SealOutcome(IntEnum):
    """What ``seal.lua`` answered for an attempt's folder (the numbers it returns)."""

    SEALED = 1
    """The folder is the run's archive now; its per-sample keys were freed."""
    SEALED_ON_RETRY = 2
    """The folder was the run's archive already: a retried call whose first reply was lost."""
    SEALED_ELSEWHERE = 0
    """The run was sealed before, with another attempt's folder."""
    NOT_ENDED = -1
    """The run is going, or has no record: nothing is sealed."""
    COUNTS_DIFFER = -2
    """The attempt's counts are not the run's (it read the store while another attempt was
    freeing it): it must not win."""

    @property
    def ours(self) -> bool:
        """The folder is the run's archive (sealed now, or on a retried call)."""
        return self in (SealOutcome.SEALED, SealOutcome.SEALED_ON_RETRY)


class Sealer:
    """Seals ended runs (owns ``seal.lua``)."""

    def __init__(self, client: redis.Redis) -> None:
        self._runs = RunStore(client)
        self._seal = register(client, "evalq.shared.store", "seal")

    def seal(
        self,
        run_id: str,
        url: str,
        chunk_counts: tuple[int, int, int, int],
        errors: Mapping[str, int] | None = None,
    ) -> SealOutcome:
        """Make the archive attempt at ``url`` the run's archive and free the run's per-sample
        keys, unless it is sealed already; ``chunk_counts`` = (rows, scores, errors, outputs)
        the attempt wrote, ``errors`` its error counts by kind (kept in Redis)."""
        keys = RunKeys(run_id)
        return SealOutcome(
            self._seal(
                keys=[keys.meta, keys.progress, keys.errors, *keys.per_sample],
                args=[url, self._runs.size(run_id), *chunk_counts, *flatten(errors or {})],
            )
        )
