"""The gateway's policy: split tiers, budgets, a policy file applied whole, and the audit
stream that records their changes."""

from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict

from evalq.producer.gateway.acting import Act
from evalq.producer.gateway.params import NameArg
from evalq.producer.service.policy_file import BudgetLimits, PolicyFile
from evalq.shared.access.budget import Budget
from evalq.shared.access.policy import Tier
from evalq.shared.access.roles import sees_budget

__all__ = ["router"]

router = APIRouter(tags=["policy"])


class TierChange(BaseModel):
    """``PUT /v1/tiers/{dataset}/{split}``."""

    model_config = ConfigDict(extra="forbid")

    tier: Tier


class TierBefore(BaseModel):
    before: Tier | None
    """The split's tier before (None: it was unlisted)."""


@router.get("/v1/tiers", response_model=dict[str, dict[str, Tier]])
def tiers(act: Act) -> dict[str, dict[str, Tier]]:
    """Every listed split's tier (unlisted splits are no_access)."""
    return act.client().tiers()


@router.put("/v1/tiers/{dataset}/{split}", response_model=TierBefore)
def set_tier(dataset: NameArg, split: NameArg, body: TierChange, act: Act) -> TierBefore:
    """Set a split's tier (admin; audited)."""
    return TierBefore(before=act.admin("tiers set").set_tier(dataset, split, body.tier))


@router.get("/v1/budgets", response_model=list[Budget])
def budgets(act: Act) -> list[Budget]:
    """The budgets this caller may see, totals and used: an admin every one; a user the
    splits' own (shared by every caller on them) and its own, never another principal's."""
    return [b for b in act.client().budgets() if sees_budget(act.who, b.caller)]


@router.put("/v1/budgets/{dataset}/{split}", response_model=Budget)
def set_budget(
    dataset: NameArg,
    split: NameArg,
    body: BudgetLimits,
    act: Act,
    caller: Annotated[str | None, Query(max_length=64)] = None,
) -> Budget:
    """Set a split's budget totals, or one caller's on it (admin; audited); what was used
    is kept."""
    return act.admin("budget set").set_budget(
        dataset,
        split,
        runs=body.runs,
        samples=body.samples,
        max_samples_per_run=body.max_samples_per_run,
        caller=caller,
        tokens=body.tokens,
    )


@router.post("/v1/policy", response_model=list[str])
def apply_policy(body: PolicyFile, act: Act) -> list[str]:
    """Apply tiers and budgets (admin; checked whole first); returns its warnings."""
    return act.admin("policy apply").apply_policy(body)


@router.get("/v1/audit", response_model=list[dict[str, str]])
def audit(act: Act, limit: Annotated[int, Query(ge=1, le=10_000)] = 50) -> list[dict[str, str]]:
    """The newest audit entries, oldest first (admin)."""
    return act.admin("audit").audit(limit)
