"""The Ladder's state: each split's release rule (``release:`` in a policy file), each caller's
best so far, and each run's release, fixed at its first read.

The arithmetic (which mechanism applies, the grid, when the Ladder moves) is
:mod:`evalq.shared.access.ladder`'s; this store persists its inputs and outputs, and :meth:`settle`
runs a release's round: read the caller's best, decide, and commit the run's release, the
caller's new best and its audit entry in one script (``release.lua``), again while other reads
of the same caller's runs move the Ladder in between.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import redis
from pydantic import ValidationError

from evalq.shared.access.ladder import Best, Decision, Release, Released, ReleaseRule, release
from evalq.shared.connection import confirmed
from evalq.shared.errors import EvalqError
from evalq.shared.evaluation import lower_is_better
from evalq.shared.keys import AUDIT, release_best_key, release_config_key, release_run_key
from evalq.shared.models import RunMeta
from evalq.shared.names import check_name
from evalq.shared.store.audit import record
from evalq.shared.store.scripts import register

__all__ = ["RELEASE_RETRIES", "ReleaseStore"]

RELEASE_RETRIES = 20
"""Tries at committing a run's release while other reads of the same caller's runs move its
Ladder (each read retries only when another one committed)."""


def _best(raw: object) -> Best | None:
    if raw is None:
        return None
    data = json.loads(str(raw))
    return Best(float(data["value"]), str(data["run"]))


def _encoded(best: Best | None) -> str:
    return "" if best is None else json.dumps({"value": best.value, "run": best.run})


class ReleaseStore:
    """Release rules in ``evalq:release:config:{dataset}``, each caller's Ladder in
    ``evalq:release:best:*``, each run's release in ``evalq:release:run:{run}``; owns
    ``release.lua``."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._commit = register(client, "evalq.shared.access", "release", confirmed=True)

    def set_rule(self, dataset: str, split: str, release: Release, *, who: str) -> None:
        """Set a split's release rule (audited)."""
        check_name("dataset name", dataset)
        check_name("split", split)
        key = release_config_key(dataset)

        def write(one: redis.Redis) -> None:
            with one.pipeline(transaction=True) as pipe:
                pipe.hset(key, split, release.model_dump_json())
                after = release.model_dump(mode="json")
                record(pipe, "release_rule", who, dataset=dataset, split=split, after=after)
                pipe.execute()

        confirmed(self._client, write)

    def rule(self, dataset: str, split: str) -> ReleaseRule | None:
        """The split's configured rule; None when it has none or it cannot be read (the policy
        then applies its default)."""
        raw = self._client.hget(release_config_key(dataset), split)
        if raw is None:
            return None
        try:
            return Release.model_validate_json(str(raw)).rule()
        except ValidationError:
            return None

    def released(self, run_id: str) -> Released | None:
        """What the run released, if it has been read before."""
        raw = self._client.get(release_run_key(run_id))
        return None if raw is None else Released.model_validate_json(str(raw))

    def best(self, meta: RunMeta) -> dict[str, Best]:
        """The run's caller's best so far on each metric (its split and evaluation)."""
        raw: Mapping[Any, Any] = self._client.hgetall(self._best_key(meta))
        return {str(m): b for m, v in raw.items() if (b := _best(v)) is not None}

    def commit(
        self,
        meta: RunMeta,
        rule: str,
        decisions: Mapping[str, Decision],
        read: Mapping[str, Best],
        exact: Mapping[str, float],
    ) -> Released | None:
        """Fix the run's release (by ``rule``, as described) and move the Ladder where a
        decision says so, unless a best changed since ``read`` (then None: read again); the
        release that holds is returned (an earlier reader's, if there was one)."""
        released = Released(
            rule=rule,
            aggregate={m: d.released for m, d in decisions.items()},
            why={m: d.why for m, d in decisions.items()},
        )
        triples: list[str] = []
        for metric, decision in decisions.items():
            triples += [metric, _encoded(read.get(metric)), _encoded(decision.best)]
        audit = {
            "rule": released.rule,
            "metrics": {
                m: {"exact": exact[m], "released": d.released, "why": d.why, "margin": d.margin}
                for m, d in decisions.items()
            },
        }
        result = self._commit(
            keys=[self._best_key(meta), release_run_key(meta.run_id), AUDIT],
            args=[
                released.model_dump_json(),
                json.dumps(audit),
                meta.principal,
                meta.dataset_id,
                meta.split,
                meta.run_id,
                time.time(),
                released.rule,
                *triples,
            ],
        )
        return None if result is None else Released.model_validate_json(str(result))

    def settle(
        self, meta: RunMeta, rule: ReleaseRule, aggregate: Mapping[str, float], samples: int
    ) -> Released:
        """The run's aggregate (over ``samples`` scored samples) as ``rule`` releases it to its
        caller: fixed at the first read (a Ladder round), the same at every read after."""
        for _ in range(RELEASE_RETRIES):
            done = self.released(meta.run_id)
            if done is not None:
                return done
            best = self.best(meta)
            decisions = release(
                rule,
                aggregate,
                samples,
                meta.run_id,
                best=best,
                lower_is_better=lower_is_better(meta.eval),
            )
            committed = self.commit(meta, rule.describe(samples), decisions, best, aggregate)
            if committed is not None:
                return committed
        raise EvalqError(f"run {meta.run_id}: its release kept racing other reads; try again")

    @staticmethod
    def _best_key(meta: RunMeta) -> str:
        return release_best_key(meta.principal, meta.dataset_id, meta.split, meta.eval)
