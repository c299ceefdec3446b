"""What the service (:class:`evalq.producer.service.client.Client`) and the gateway's routes answer
besides the stores' own models: a run as a reader may see it (:class:`RunView`, ``status
--json``), and what ``cancel`` and ``resume`` did. Light on purpose: the HTTP client
(:mod:`evalq.producer.clients.remote`) reads these without loading Redis, Celery or pyarrow.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, computed_field

from evalq.shared.access.ladder import Released
from evalq.shared.choices import Tier
from evalq.shared.errors import RunNotCompletedError
from evalq.shared.models import Progress, RunMeta, RunProvenance, RunStatus, SampleResult
from evalq.shared.queue.standing import Standing
from evalq.shared.stats import Stat

__all__ = [
    "LINE_ROWS",
    "MAX_PAGE",
    "READ_BYTES",
    "Cancellation",
    "Resumption",
    "RunView",
    "SamplePage",
    "SampleQuery",
    "check_ended",
    "rows_per_read",
]

LINE_ROWS = 10_000
"""Samples read at a time for ``result_tables``, and at most for ``result_lines``."""
READ_BYTES = 4 * 2**20
"""Bytes of results a results stream reads and holds at a time, at most about: as many samples
as hold that many at the largest output a worker stores. The attack review's 8 unread streams
of one user, reading 10,000 outputs of 4 MB at a time, took the gateway from 247 MB to
9,728 MB."""


def rows_per_read(max_output_bytes: int) -> int:
    """Samples a results stream reads at a time when one sample's output may take up to
    ``max_output_bytes`` (``EVALQ_MAX_OUTPUT_BYTES``): about :data:`READ_BYTES` in all."""
    return max(1, min(LINE_ROWS, READ_BYTES // max_output_bytes))


MAX_PAGE = 500
"""Samples one page holds at most."""


class EndpointCounts(BaseModel):
    """An endpoint's traffic from the whole fleet over the last minute (every run on it)."""

    url: str
    requests: int = 0
    """Requests sent (each try counts)."""
    rate_limited: int = 0
    """Of them, answered 429."""
    retries: int = 0
    """Tries made again after a 429, a 5xx, a timeout or a lost connection."""
    tokens: int = 0
    """Prompt and completion tokens the answers reported."""
    failed: int = 0
    """Samples whose tries ran out."""
    cached: int = 0
    """Answers the response cache gave instead."""


class RunView(BaseModel):
    """A run as a reader may see it."""

    meta: RunMeta
    """The run's record."""
    progress: Progress
    """Its counters."""
    tier: Tier
    """Its split's tier."""
    aggregate: dict[str, float] | None
    """The aggregate, when the run has one and the reader may see it: exact, or as the split's
    release rule releases it (see ``release``)."""
    withheld: str | None
    """Why the aggregate is not shown, when it is not."""
    release: Released | None = None
    """How the aggregate was released when not exactly (a non_viewable split, not an admin)."""
    stats: dict[str, Stat] | None = None
    """Each metric's mean, standard error, 95% interval and count, with the aggregate (as the
    release releases them: no exact error bar under a rounded release)."""
    provenance: RunProvenance | None = None
    """The dataset spec fingerprint and what each worker that stored outputs ran with."""
    errors: dict[str, int]
    """Terminal errors by ``stage/kind`` (by ``stage`` only for a reader without per-sample
    access: an exception's class name is whatever the code that raised it chose)."""
    stalled: str | None = None
    """Why nothing moves the run, while it is going and nothing does (no live worker serves
    it, or no progress for ``EVALQ_STALL_AFTER`` seconds); None otherwise."""
    waiting: Standing | None = None
    """Where the run stands in the fair dispatcher while samples of it wait in its backlog."""
    stale_code: str | None = None
    """While the run is going: why it would not run its evaluation's file as it is now (a live
    worker serving it loaded the file before it was edited); None otherwise."""
    endpoint: EndpointCounts | None = None
    """An endpoint model's server and its traffic over the last minute, from every run on it:
    for admins and operators only (:meth:`Disclosure.sees_fleet`)."""
    timed: bool = True
    """The reader sees the run's timing (:attr:`evalq.shared.access.policy.Reader.sees_timing`):
    else ``meta`` and ``progress`` are coarse and there is no throughput nor ETA."""
    now: float = Field(default_factory=time.time, exclude=True)
    """When it was read (Redis's clock)."""

    @computed_field  # type: ignore[prop-decorator]
    @property
    def throughput(self) -> float | None:
        """Samples settled per second since submission (until it finished); None for a
        reader who does not see the run's timing."""
        if not self.timed:
            return None
        elapsed = (self.meta.finished or self.now) - self.meta.created
        return round(self.progress.done / elapsed, 3) if elapsed > 0 else 0.0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def eta_seconds(self) -> float | None:
        """Seconds left at the current throughput, while the run is going."""
        if not self.meta.status.active or not self.throughput or self.stalled:
            return None
        return round(max(0, self.meta.n - self.progress.done) / self.throughput, 1)

    def as_dict(self) -> dict[str, object]:
        """The run's record fields with the view's beside them (``status --json``)."""
        return {
            **self.meta.model_dump(mode="json"),
            **self.model_dump(mode="json", exclude={"meta"}),
        }


MAX_ID = 2**63 - 1
"""The largest sample id or offset a page is asked for (a larger one was a 500: the attack
review's ``ids=9223372036854775808``)."""


class SampleQuery(BaseModel):
    """Which page of a run's samples to read (``GET /v1/runs/{run}/samples``): unfiltered and
    unsorted, the run's samples in submission order."""

    model_config = ConfigDict(frozen=True)

    offset: int = Field(default=0, ge=0, le=MAX_ID)
    limit: int = Field(default=50, ge=1, le=MAX_PAGE)
    failed: bool = False
    """Only the samples that failed (a terminal error)."""
    q: str | None = Field(default=None, min_length=1, max_length=200)
    """Only the samples whose output, scores or error holds this text (any case)."""
    sort: str | None = Field(default=None, pattern=r"^-?[A-Za-z0-9_.:-]{1,100}$")
    """A metric to order by, lowest first (``-metric``: highest first); samples without it
    (failed, pending) last."""
    ids: list[Annotated[int, Field(ge=0, le=MAX_ID)]] | None = Field(
        default=None, max_length=MAX_PAGE
    )
    """Only these samples."""
    with_input: bool = False
    """Each sample's row, labels included (the reader's data is read for this page only)."""


class SamplePage(BaseModel):
    """One page of a run's per-sample results and how many match in all."""

    run_id: str
    total: int
    """Samples that match the query (the page is ``offset`` to ``offset + len(samples)``)."""
    offset: int
    samples: list[SampleResult]


@dataclass(frozen=True)
class Resumption:
    """What ``resume`` re-enqueued."""

    run_id: str
    inference: int | None
    """Samples sent back to inference (no output stored); None for a reader who does not see
    the run's timing while it reads as running (a count would show its progress)."""
    scoring: int | None
    """Samples sent back to scoring (output stored, no score or error); None as ``inference``."""
    finalized: bool
    """Every sample was settled and the aggregate was (re)computed."""


@dataclass(frozen=True)
class Cancellation:
    """What ``cancel`` did."""

    run_id: str
    cancelled_now: bool
    refunded_samples: int


def check_ended(meta: RunMeta) -> RunMeta:
    """``meta`` if its run did not end ``failed`` or ``cancelled``; :class:`RunNotCompletedError`
    (exit code 4) if it did."""
    if meta.status in (RunStatus.FAILED, RunStatus.CANCELLED):
        why = f": {meta.reason}" if meta.reason else ""
        raise RunNotCompletedError(f"run {meta.run_id} ended {meta.status}{why}")
    return meta
