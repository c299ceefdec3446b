"""Each model's pace: the seconds per sample its calls took on the workers lately, by which
the messages of its next runs are sized (:func:`evalq.shared.queue.sizing.message_size`).

A message is the unit of everything a worker does per message (the broker's pop and
acknowledgement, a pool job, evalq's own Redis calls), of what a newly dispatched run waits
behind (the messages a worker reserved) and of what a killed worker does again. Sized by
samples alone, one size serves no model well: 256 samples are 10 ms of a null model (its
per-message costs are then a third of its time) and minutes of a generative one. Sized by
its model's pace, a message holds about :data:`evalq.shared.queue.sizing.MESSAGE_SECONDS` of
work, within the sizes a message may have.

Workers write it (:class:`PaceMeter`, at most every :data:`PACE_EVERY` seconds per model and
process) into one hash of the fair dispatcher's state, ``evalq:fair:pace``; ``submit`` reads
its model's once. A model no worker has measured yet gets the default size.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping

import redis

from evalq.shared.errors import first_line
from evalq.shared.keys import FAIR

__all__ = ["PACE_EVERY", "Pace", "PaceMeter"]

log = logging.getLogger(__name__)

PACE_EVERY = 5.0
"""Seconds between a worker process's writes of one model's pace."""


class Pace:
    """The models' paces in Redis (``FAIR.pace``: model -> seconds per sample)."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client

    def of(self, model: str) -> float | None:
        """Seconds per sample ``model`` took lately; None when not measured (or not a
        positive number: a pace is a hint, never trusted to be one)."""
        raw = self._client.hget(FAIR.pace, model)
        try:
            value = float(raw)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return None
        return value if math.isfinite(value) and value > 0 else None

    def set(self, model: str, seconds_per_sample: float) -> None:
        self._client.hset(FAIR.pace, model, repr(seconds_per_sample))


class PaceMeter:
    """A worker process's measure of its models' pace: the time of a batch's calls of the
    model (not its load, nor Redis) over the samples they gave an output, written at most
    every ``every`` seconds per model; a write Redis refuses is logged and left for the
    next."""

    def __init__(
        self, pace: Pace, every: float = PACE_EVERY, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._pace = pace
        self._every = every
        self._clock = clock
        self._window: dict[str, tuple[float, int, float]] = {}
        """model -> (seconds, samples) since its last write, and when that was."""

    def add(self, samples: Mapping[str, int], seconds: float) -> None:
        """Calls took ``seconds`` for ``samples`` (model -> samples of it), the time shared
        among the models by their samples."""
        total = sum(samples.values())
        if total <= 0:
            return
        now = self._clock()
        for model, count in samples.items():
            spent, counted, last = self._window.get(model, (0.0, 0, -math.inf))
            spent, counted = spent + seconds * count / total, counted + count
            if now - last < self._every or counted <= 0:
                self._window[model] = (spent, counted, last)
                continue
            self._window[model] = (0.0, 0, now)
            try:
                self._pace.set(model, spent / counted)
            except redis.RedisError as exc:
                log.warning("could not record the pace of %s: %s", model, first_line(exc))
