"""The gateway's API tokens: list their principals, create one, revoke a principal's."""

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from evalq.producer.gateway.acting import Act
from evalq.producer.gateway.caller import Who
from evalq.producer.gateway.params import NameArg
from evalq.shared.access.roles import Role, TokenRecord

__all__ = ["router"]

router = APIRouter(tags=["tokens"])


class TokenCreate(BaseModel):
    """``POST /v1/tokens``."""

    model_config = ConfigDict(extra="forbid")

    principal: str = Field(max_length=64)
    role: Role


class NewToken(BaseModel):
    principal: str
    role: Role
    token: str
    """Shown once; only its sha256 is stored."""


class Revoked(BaseModel):
    revoked: int


class Identity(BaseModel):
    """``GET /v1/whoami``: who the token stands for."""

    principal: str
    role: Role


@router.get("/v1/whoami", response_model=Identity)
async def whoami(who: Who) -> Identity:
    """The principal and role of the request's token (the viewer's sign-in)."""
    return Identity(principal=who.principal, role=who.role)


@router.get("/v1/tokens", response_model=list[TokenRecord])
def list_tokens(act: Act) -> list[TokenRecord]:
    """Every live token's principal and role (admin; never a token)."""
    return act.admin("tokens list").tokens()


@router.post("/v1/tokens", response_model=NewToken)
def create_token(body: TokenCreate, act: Act) -> NewToken:
    """A new token (admin; audited); shown once."""
    token = act.admin("tokens create").create_token(body.principal, body.role)
    return NewToken(principal=body.principal, role=body.role, token=token)


@router.delete("/v1/tokens/{principal}", response_model=Revoked)
def revoke_tokens(principal: NameArg, act: Act) -> Revoked:
    """Revoke every token of a principal (admin; audited)."""
    return Revoked(revoked=act.admin("tokens revoke").revoke_tokens(principal))
