"""The budget ledger: per (dataset, split) limits on runs, samples and tokens, and optionally per
caller on a split (so two agents on one split are metered apart), charged atomically.

A budget stores totals (absent = unlimited) and what has been used; what is left is derived.
Reserving is one Lua script that checks runs, then samples, then the per-run cap, and charges
and audits all at once or writes nothing. Setting new totals never touches what was used, so
re-applying a policy never refunds spend: what is left is ``max(0, total - used)``.

Tokens are charged by the workers, request by request, in their own keys beside the budget
(:mod:`evalq.shared.store.spend`); the ledger reads them into each budget, and gives back the
samples of runs a token budget kept from being sent (:meth:`Ledger.refund_unsent`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import redis

from evalq.shared.access.budget import Budget
from evalq.shared.errors import BudgetExhaustedError, StoreError
from evalq.shared.keys import ACTIVE, AUDIT, RUNS, UNSENT, RunKeys, budget_key, spend_key
from evalq.shared.models import RunMeta
from evalq.shared.names import check_name
from evalq.shared.store.scripts import register

__all__ = ["Ledger"]


def _refusal(budget: Budget, limit: str, samples: int) -> str:
    where = f"{budget.dataset}/{budget.split}"
    if budget.caller is not None:
        where += f" for {budget.caller}"
    if limit == "runs":
        return f"budget refused: {where} has no runs left ({budget.runs_total} in all)"
    if limit == "samples":
        return (
            f"budget refused: {where} has {budget.samples_left} samples left, "
            f"the run needs {samples}"
        )
    return (
        f"budget refused: {where} allows at most {budget.max_samples_per_run} samples per run, "
        f"the run has {samples}"
    )


class Ledger:
    """Budgets in ``evalq:budget:{dataset}:{split}``; owns ``reserve.lua``, ``refund.lua`` and
    ``set_budget.lua``."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._reserve = register(client, "evalq.shared.access", "reserve", confirmed=True)
        self._refund = register(client, "evalq.shared.access", "refund", confirmed=True)
        self._set_budget = register(client, "evalq.shared.access", "set_budget", confirmed=True)

    def get(self, dataset: str, split: str, caller: str | None = None) -> Budget:
        """The split's budget, or ``caller``'s on it (unlimited and unused when none is
        stored)."""
        raw = self._client.hgetall(budget_key(dataset, split, caller))
        fields = {**raw, "dataset": dataset, "split": split, "caller": caller}
        return self._with_tokens(fields)

    def _with_tokens(self, fields: Mapping[Any, Any]) -> Budget:
        """A budget from its stored ``fields``, with the tokens the workers charged."""
        key = spend_key(fields["dataset"], fields["split"], fields.get("caller") or None)
        spent = self._client.hgetall(key)
        used, reserved = int(spent.get("used", 0)), int(spent.get("reserved", 0))
        return Budget.model_validate({**fields, "tokens_used": used, "tokens_reserved": reserved})

    def reserve(self, meta: RunMeta) -> None:
        """Open the run ``meta`` recorded (:meth:`evalq.shared.store.runs.RunStore.create`) and,
        unless it is not ``charged`` (an admin's), charge it in the same script: one run of
        ``meta.n`` samples to its split's budget and to its principal's own on it (when one is set).
        Raise :class:`BudgetExhaustedError` (nothing written) when a budget refuses, and
        :class:`StoreError` when the pending record expired."""
        dataset, split, who, run = meta.dataset_id, meta.split, meta.principal, RunKeys(meta.run_id)
        reply = self._reserve(
            keys=[
                budget_key(dataset, split),
                budget_key(dataset, split, who),
                AUDIT,
                run.facts,
                run.meta,
                run.ids,
                RUNS,
                ACTIVE,
            ],
            args=[
                meta.n,
                meta.run_id,
                who,
                dataset,
                split,
                repr(meta.created),
                "1" if meta.charged else "0",
            ],
        )
        verdict, samples = str(reply[0]), meta.n
        if verdict == "gone":
            raise StoreError(f"run {meta.run_id} was not opened in time; submit it again")
        if verdict != "ok":
            budget = self.get(dataset, split, who if reply[1] == "principal" else None)
            raise BudgetExhaustedError(_refusal(budget, verdict, samples), verdict)

    def refund(
        self,
        dataset: str,
        split: str,
        run_id: str,
        *,
        runs: int,
        samples: int,
        who: str,
        submitter: str,
        reason: str,
    ) -> int:
        """Give back ``runs`` and ``samples`` of a run's charge (to the split, and to the
        ``submitter``'s own budget on it when one is set), at most once per run; return the
        samples given back."""
        caller = budget_key(dataset, split, submitter)
        return int(
            self._refund(
                keys=[budget_key(dataset, split), caller, AUDIT, RunKeys(run_id).facts],
                args=[runs, samples, who, dataset, split, run_id, time.time(), reason],
            )
        )

    def set(
        self,
        dataset: str,
        split: str,
        *,
        runs: int | None,
        samples: int | None,
        max_samples_per_run: int | None,
        who: str,
        caller: str | None = None,
        tokens: int | None = None,
    ) -> Budget:
        """Replace the split's totals, or ``caller``'s own on the split (None = unlimited),
        keep what was used, audit it."""
        check_name("dataset name", dataset)
        check_name("split", split)
        if caller is not None:
            check_name("principal", caller)
        Budget(  # validates the totals before anything is written
            dataset=dataset,
            split=split,
            runs_total=runs,
            samples_total=samples,
            max_samples_per_run=max_samples_per_run,
            tokens_total=tokens,
        )
        limits = (runs, samples, max_samples_per_run, tokens)
        totals = ["" if v is None else v for v in limits]
        self._set_budget(
            keys=[budget_key(dataset, split, caller), AUDIT],
            args=[dataset, split, *totals, who, time.time(), caller or ""],
        )
        return self.get(dataset, split, caller)

    def all(self) -> list[Budget]:
        """Every stored budget."""
        budgets = []
        for key in self._client.scan_iter(match=budget_key("*", "*"), count=500):
            raw = self._client.hgetall(key)
            if "dataset" in raw and "split" in raw:
                budgets.append(self._with_tokens(raw))
        return sorted(budgets, key=lambda b: (b.dataset, b.split, b.caller or ""))

    def refund_unsent(self, unsent: Callable[[str], tuple[RunMeta, int] | None]) -> int:
        """Give back the samples of each run a token budget kept from being sent (the runs
        workers listed in :data:`evalq.shared.keys.UNSENT` as they ended; ``unsent`` reads a run's
        record and count, None when it is gone), and the run itself when none of its samples
        was sent, once per run; return the samples given back."""
        given = 0
        for run_id in map(str, self._client.smembers(UNSENT)):
            found = unsent(run_id)
            if found is not None:
                meta, samples = found
                given += self.refund(
                    meta.dataset_id,
                    meta.split,
                    run_id,
                    runs=int(samples >= meta.n),
                    samples=samples,
                    who="evalq",
                    submitter=meta.principal,
                    reason="tokens exhausted",
                )
            self._client.srem(UNSENT, run_id)
        return given
