"""The Lua scripts that make evalq's multi-key writes atomic, registered once per client.

Each script lives in ``shared/lua/<name>.lua`` with a header naming every key and argument; the
wrappers here are the only callers and turn replies into typed values.
"""

from __future__ import annotations

import time
from functools import cache
from importlib import resources

import redis

from shared.keys import AUDIT, RunKeys

__all__ = ["Scripts"]


@cache
def _source(name: str) -> str:
    return resources.files("shared").joinpath("lua", f"{name}.lua").read_text(encoding="utf-8")


def _flatten(values: dict[int, str]) -> list[str | int]:
    flat: list[str | int] = []
    for sample_id, value in values.items():
        flat += [sample_id, value]
    return flat


class Scripts:
    """evalq's Lua scripts bound to one Redis client (or pipeline)."""

    def __init__(self, client: redis.Redis) -> None:
        self._record_outputs = client.register_script(_source("record_outputs"))
        self._settle = client.register_script(_source("settle"))
        self._reserve = client.register_script(_source("reserve"))
        self._refund = client.register_script(_source("refund"))
        self._cancel = client.register_script(_source("cancel"))
        self._set_tier = client.register_script(_source("set_tier"))
        self._set_budget = client.register_script(_source("set_budget"))
        self._attempt = client.register_script(_source("attempt"))

    def record_outputs(
        self, keys: RunKeys, outputs: dict[int, str], client: redis.Redis | None = None
    ) -> int:
        """HSETNX each output; return how many were newly written."""
        return int(
            self._record_outputs(
                keys=[keys.out, keys.progress, keys.meta], args=_flatten(outputs), client=client
            )
        )

    def settle(
        self, keys: RunKeys, kind: str, values: dict[int, str], client: redis.Redis | None = None
    ) -> tuple[int, bool]:
        """Write terminal scores (``kind='score'``) or errors (``'err'``) once per sample.

        Returns how many were written and whether this caller must finalize the run.
        """
        written, finalize = self._settle(
            keys=[keys.score, keys.err, keys.progress, keys.meta, keys.settled],
            args=[kind, *_flatten(values)],
            client=client,
        )
        return int(written), bool(finalize)

    def reserve(
        self, budget_key: str, samples: int, run_id: str, who: str, dataset: str, split: str
    ) -> str:
        """Charge a run; ``'ok'`` or the name of the limit that refused (nothing written)."""
        return str(
            self._reserve(
                keys=[budget_key, AUDIT],
                args=[samples, run_id, who, dataset, split, time.time()],
            )
        )

    def refund(
        self,
        budget_key: str,
        keys: RunKeys,
        runs: int,
        samples: int,
        who: str,
        dataset: str,
        split: str,
        reason: str,
    ) -> int:
        """Give back part of a run's charge, once per run; return the samples given back."""
        return int(
            self._refund(
                keys=[budget_key, AUDIT, keys.refund],
                args=[runs, samples, who, dataset, split, keys.run_id, time.time(), reason],
            )
        )

    def cancel(self, keys: RunKeys) -> tuple[int, int]:
        """Stop a run; return (1 now / 0 before / -1 already finished, samples without result)."""
        state, unproduced = self._cancel(keys=[keys.meta, keys.out, keys.err], args=[time.time()])
        return int(state), int(unproduced)

    def set_tier(self, tiers_key: str, dataset: str, split: str, tier: str, who: str) -> str | None:
        """Set a tier with its audit entry; return the previous tier (None if unlisted)."""
        before = self._set_tier(
            keys=[tiers_key, AUDIT], args=[split, tier, who, dataset, time.time()]
        )
        return None if before is None else str(before)

    def set_budget(
        self, budget_key: str, dataset: str, split: str, totals: list[int | None], who: str
    ) -> None:
        """Replace the totals (runs, samples, per-run cap; None = unlimited), audited."""
        encoded = ["" if value is None else value for value in totals]
        self._set_budget(
            keys=[budget_key, AUDIT], args=[dataset, split, *encoded, who, time.time()]
        )

    def attempt(self, keys: RunKeys, samples: dict[int, bool]) -> dict[int, int]:
        """Count an attempt for each sample (id -> arrived alone); see attempt.lua: a
        negative count marks a sample tried before that must be sent on alone."""
        flat: list[int] = []
        for sample_id, solo in samples.items():
            flat += [sample_id, int(solo)]
        counts = self._attempt(keys=[keys.attempts], args=flat)
        return dict(zip(samples, (int(c) for c in counts), strict=True))
