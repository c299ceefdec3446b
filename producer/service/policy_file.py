"""``evalq policy apply FILE``: tiers, budgets, release rules and priorities from a YAML or
JSON file, reconciled.

::

    datasets:
      demo:
        validation:
          tier: non_viewable
          budget: {runs: 10, samples: 5000, max_samples_per_run: 500}
          release: ladder                  # the default for non_viewable
        test: {tier: no_access}
        hidden:
          tier: non_viewable
          release: {mechanism: ladder, eta: 0.02}   # or ladder / rounded / exact
      agents:
        validation:
          budget: {samples: 10000, tokens: 2000000}   # tokens: endpoint models' usage
          principals: {agent-a: {runs: 5}, agent-b: {runs: 5}}   # metered apart
          priority: high                   # runs on this split: high unless asked lower
    principals:
      ci-sweeps: {priority: low}           # this principal's default (before the split's)
    endpoints:                             # the only servers endpoint models may call
      http://vllm.internal:8000/v1: {requests_per_minute: 600, tokens_per_minute: 200000}
      https://api.openai.com/v1: {requests_per_minute: 60, api_key_env: OPENAI_API_KEY}
      # vllm.internal's requests carry no key; only api.openai.com's carry OPENAI_API_KEY

Reconciliation is :func:`evalq.shared.access.policy.budgeted_tier`'s: a budgeted split with no tier
(in the file or already stored) becomes ``non_viewable``; a budgeted ``no_access`` split is an
error; a budgeted ``viewable`` split is allowed with a warning. Budgets keep what was used. A
``release:`` rule (see :class:`evalq.shared.access.ladder.Release`) applies to ``non_viewable``
splits; one given to a ``viewable`` split is kept but warned about (viewable runs are always
released exactly). An ``endpoints:`` entry lists a server endpoint models may call, its limits
across the whole fleet (absent: unlimited) and the worker variable its API key is read from
(absent: its requests carry no key; there is no default, so a provider's key never goes to
another listed server); a file with an ``endpoints:`` section lists them all (a server it leaves
out is delisted, with a warning), a file without one leaves the list as it is.
A ``priority:`` (per split, or per principal under ``principals:``) is
the default priority of a run, and the most a non-admin may ask for
(:func:`evalq.shared.access.priorities.admit_priority`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import redis
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from evalq.shared.access.ladder import Release
from evalq.shared.access.ledger import Ledger
from evalq.shared.access.policy import Tier, budgeted_tier
from evalq.shared.access.priorities import PriorityStore
from evalq.shared.access.release import ReleaseStore
from evalq.shared.access.tiers import TierRegistry
from evalq.shared.errors import PolicyError, SplitNotFoundError, UnknownDatasetError, first_line
from evalq.shared.lm.limits import EndpointLimits
from evalq.shared.lm.spec import URL_PATTERN
from evalq.shared.models import Priority
from evalq.shared.names import check_name
from evalq.shared.store.endpoints import EndpointRegistry, normal_url

__all__ = ["PolicyFile", "apply_policy", "load_policy"]


class BudgetLimits(BaseModel):
    """A split's budget in a policy file; absent = unlimited."""

    model_config = ConfigDict(extra="forbid")

    runs: int | None = Field(default=None, ge=0)
    samples: int | None = Field(default=None, ge=0)
    max_samples_per_run: int | None = Field(default=None, ge=1)
    tokens: int | None = Field(default=None, ge=0)
    """Tokens (prompt and completion) of endpoint models' requests in all."""


class SplitPolicy(BaseModel):
    """A split's tier and budget in a policy file."""

    model_config = ConfigDict(extra="forbid")

    tier: Tier | None = None
    budget: BudgetLimits | None = None
    """The whole split's budget, whoever submits."""
    principals: dict[str, BudgetLimits] | None = None
    """Each named caller's own budget on the split, on top of the split's."""
    release: Release | None = None
    """How its aggregates are released to non-admins; absent = the Ladder."""
    priority: Priority | None = None
    """Default priority of runs on the split (after the principal's own)."""


class PrincipalPolicy(BaseModel):
    """A principal's defaults in a policy file."""

    model_config = ConfigDict(extra="forbid")

    priority: Priority | None = None
    """Default priority of the principal's runs, and the most it may ask for."""


class PolicyFile(BaseModel):
    """The whole file: datasets -> splits -> policy, and principals -> defaults."""

    model_config = ConfigDict(extra="forbid")

    datasets: dict[str, dict[str, SplitPolicy]] = Field(default_factory=dict)
    principals: dict[str, PrincipalPolicy] = Field(default_factory=dict)
    endpoints: dict[Annotated[str, Field(pattern=URL_PATTERN)], EndpointLimits] = Field(
        default_factory=dict
    )


def load_policy(path: Path) -> PolicyFile:
    """Read and validate a YAML or JSON policy file."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PolicyError(f"cannot read {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise PolicyError(f"{path} is not valid YAML or JSON: {_yaml_problem(exc)}") from exc
    except ValueError as exc:  # e.g. an integer past Python's 4,300-digit conversion limit
        raise PolicyError(f"{path}: {first_line(exc)}") from None
    try:
        return PolicyFile.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise PolicyError(f"{path}: {where}: {first['msg']}") from exc


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """``line L, column C: problem`` (1-based, where the parser stopped) in one line."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"line {mark.line + 1}, column {mark.column + 1}: {exc.problem}"
    return first_line(exc)


@dataclass(frozen=True)
class _Change:
    dataset: str
    split: str
    tier: Tier | None
    budget: BudgetLimits | None
    principals: dict[str, BudgetLimits]
    release: Release | None
    priority: Priority | None


def _reconcile(
    policy: PolicyFile, tiers: TierRegistry, registered: Mapping[str, Collection[str]]
) -> tuple[list[_Change], list[str]]:
    changes: list[_Change] = []
    warnings: list[str] = []
    for dataset, splits in policy.datasets.items():
        for split, entry in splits.items():
            check_name("dataset name", dataset)
            check_name("split", split)
            for caller in entry.principals or {}:
                check_name("principal", caller)
            tier = entry.tier
            if entry.budget is not None or entry.principals:
                listed = tier or tiers.lookup(dataset, split)
                made, warning = budgeted_tier(f"{dataset}/{split}", listed)
                tier = made or tier
                if warning:
                    warnings.append(warning)
            if dataset not in registered:
                raise UnknownDatasetError(f"unknown dataset '{dataset}' (evalq datasets list)")
            if split not in registered[dataset]:
                have = ", ".join(sorted(registered[dataset]))
                raise SplitNotFoundError(
                    f"dataset '{dataset}' has no split '{split}' (splits: {have})"
                )
            if entry.release is not None:
                now = tier or tiers.lookup(dataset, split)
                warnings += _release_warnings(f"{dataset}/{split}", now)
            changes.append(
                _Change(
                    dataset,
                    split,
                    tier,
                    entry.budget,
                    entry.principals or {},
                    entry.release,
                    entry.priority,
                )
            )
    for principal in policy.principals:
        check_name("principal", principal)
    return changes, warnings


def _release_warnings(where: str, tier: Tier | None) -> list[str]:
    if tier is Tier.VIEWABLE:
        return [f"{where}: a release rule on a viewable split (released exactly while viewable)"]
    if tier in (None, Tier.NO_ACCESS):
        return [f"{where}: a release rule on a no_access split (nothing is released)"]
    return []


def apply_policy(
    policy: PolicyFile,
    client: redis.Redis,
    *,
    registered: Mapping[str, Collection[str]],
    who: str,
) -> list[str]:
    """Check the whole file first, then apply it; return its warnings (``registered``: each
    registered dataset's splits)."""
    tiers, ledger = TierRegistry(client), Ledger(client)
    releases, priorities = ReleaseStore(client), PriorityStore(client)
    changes, warnings = _reconcile(policy, tiers, registered)
    endpoints = EndpointRegistry(client)
    for url, listed in policy.endpoints.items():
        endpoints.set(url, listed, who=who)
    if "endpoints" in policy.model_fields_set:  # the file's list is the whole list
        kept = {normal_url(url) for url in policy.endpoints}
        for url in set(endpoints.all()) - kept:
            endpoints.remove(url, who=who)
            warnings.append(f"endpoint {url} delisted: it is not in the file's endpoints:")
    for principal, entry in policy.principals.items():
        if entry.priority is not None:
            priorities.set_principal(principal, entry.priority, who=who)
    for change in changes:
        if change.priority is not None:
            priorities.set_split(change.dataset, change.split, change.priority, who=who)
        if change.tier is not None:
            tiers.set(change.dataset, change.split, change.tier, who=who)
        if change.release is not None:
            releases.set_rule(change.dataset, change.split, change.release, who=who)
        limits = [(None, change.budget)] if change.budget is not None else []
        for caller, budget in [*limits, *change.principals.items()]:
            ledger.set(
                change.dataset,
                change.split,
                runs=budget.runs,
                samples=budget.samples,
                max_samples_per_run=budget.max_samples_per_run,
                who=who,
                caller=caller,
                tokens=budget.tokens,
            )
    return warnings
