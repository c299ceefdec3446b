"""The roles: what a token's holder may do through the gateway (admin or user), who a request
acts for, and the rules that follow from the role alone (admin operations, ``--admin``, data
sources, budgets, ownership of runs). What a tier allows is :mod:`evalq.shared.access.policy`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from evalq.shared.choices import Role
from evalq.shared.errors import ForbiddenError

__all__ = [
    "Caller",
    "Role",
    "TokenRecord",
    "admit_admin_flag",
    "admit_owner",
    "require_admin",
    "sees_budget",
    "sees_sources",
]


@dataclass(frozen=True)
class Caller:
    """Who a gateway request acts for: the principal and role of its token."""

    principal: str
    role: Role


class TokenRecord(BaseModel):
    """What a token stands for: a principal in a role (the token itself is never stored;
    :class:`evalq.shared.access.tokens.TokenStore` keeps these)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    principal: str
    role: Role
    created: float
    """Unix time of creation."""
    who: str
    """Who created it."""

    @property
    def caller(self) -> Caller:
        return Caller(self.principal, self.role)


def require_admin(caller: Caller, what: str) -> None:
    """Admin operations (datasets, tiers, budgets, policy, tokens, audit) need the admin
    role: :class:`ForbiddenError` otherwise."""
    if caller.role is not Role.ADMIN:
        raise ForbiddenError(
            f"forbidden: {what} needs the admin role ({caller.principal} is a user)"
        )


def admit_admin_flag(caller: Caller, admin: bool) -> bool:
    """``--admin`` (bypass tier and budget, read every tier) is for admins only."""
    if admin:
        require_admin(caller, "--admin")
    return admin


def sees_sources(caller: Caller) -> bool:
    """Registered datasets' sources (paths, Hub ids, file digests) are an admin's to read; a
    user sees names, splits and tiers."""
    return caller.role is Role.ADMIN


def sees_budget(caller: Caller, metered: str | None) -> bool:
    """Whether ``caller`` may see a budget metering ``metered`` (None: a whole split's, which
    every caller on the split draws from, so its ``used`` counts everyone's runs together): an
    admin sees every budget, a user the splits' and its own; another principal's budget (its
    name, totals and use) is not a user's to read."""
    return caller.role is Role.ADMIN or metered is None or metered == caller.principal


def admit_owner(caller: Caller, run_id: str, owner: str) -> None:
    """A user sees, cancels and resumes only its own runs (each principal is metered on its
    own, so another's aggregates are not its to read); an admin, every run."""
    if caller.role is not Role.ADMIN and owner != caller.principal:
        raise ForbiddenError(f"forbidden: run {run_id} belongs to another principal")
