"""Release rules and the Ladder's state: what a run's aggregate shows to a caller who may not
see it exactly, stored per split (``release:`` in a policy file) and per caller.

The rules themselves (which mechanism applies, the grid, when the Ladder moves) are
:mod:`shared.access.policy`'s; this store persists them and commits a run's release, the caller's
new best and its audit entry in one script (``release.lua``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Annotated, Any

import redis
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    model_validator,
)

from shared.access.policy import Best, Decision, Mechanism, ReleaseRule
from shared.keys import AUDIT, release_best_key, release_config_key, release_run_key
from shared.models import RunMeta
from shared.names import check_name
from shared.store.audit import record
from shared.store.scripts import register

__all__ = ["MIN_ETA", "Release", "ReleaseStore", "Released"]

MIN_ETA = 1e-6
"""The finest grid a policy may set (finer is no protection, and far finer overflows)."""


class Release(BaseModel):
    """``release:`` of a split in a policy file: ``exact``, ``rounded``, ``ladder`` or a
    mapping ``{mechanism: ladder, eta: 0.02}``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mechanism: Mechanism
    eta: Annotated[float, Strict(), Field(ge=MIN_ETA, le=1)] | None = None
    """Grid and Ladder step; absent = :func:`shared.access.policy.default_eta` of the run's
    samples."""

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: object) -> object:
        if isinstance(value, dict) and "paired" in value:
            raise ValueError(
                "the paired Ladder was removed: it has no leakage bound, and a caller that keeps "
                "its best run's answers and adds one sample forced its margin to zero (200 of "
                "200 labels in 201 runs); use the ladder (with eta, if needed)"
            )
        return {"mechanism": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _consistent(self) -> Release:
        if self.mechanism is Mechanism.EXACT and self.eta is not None:
            raise ValueError("exact release has no eta")
        return self

    def rule(self) -> ReleaseRule:
        """The policy's view of it."""
        return ReleaseRule(self.mechanism, self.eta)


class Released(BaseModel):
    """What one run's aggregate released, fixed at its first read."""

    rule: str
    """The mechanism and its parameters, as :meth:`ReleaseRule.describe` says them."""
    aggregate: dict[str, float]
    """The released values."""
    why: dict[str, str]
    """Why each metric shows what it shows (``first run``, ``not better than the best ...``)."""


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
        self._commit = register(client, "shared.access", "release")

    def set_rule(self, dataset: str, split: str, release: Release, *, who: str) -> None:
        """Set a split's release rule (audited)."""
        check_name("dataset name", dataset)
        check_name("split", split)
        key = release_config_key(dataset)
        with self._client.pipeline(transaction=True) as pipe:
            pipe.hset(key, split, release.model_dump_json())
            after = release.model_dump(mode="json")
            record(pipe, "release_rule", who, dataset=dataset, split=split, after=after)
            pipe.execute()

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

    @staticmethod
    def _best_key(meta: RunMeta) -> str:
        return release_best_key(meta.principal, meta.dataset_id, meta.split, meta.eval)
