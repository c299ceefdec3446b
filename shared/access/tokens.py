"""API tokens of the gateway: created once, stored only as a digest, revoked by principal.

A token is 32 random bytes (``secrets.token_urlsafe``) behind the prefix ``evalq_``; Redis holds
its sha256 with the principal and role it stands for, so neither a Redis reader nor a log ever
sees a usable token. Creations and revocations are audited in the same transaction.
"""

from __future__ import annotations

import hashlib
import secrets
import time

import redis
import redis.asyncio

from evalq.shared.access.roles import Caller, Role, TokenRecord
from evalq.shared.connection import confirmed
from evalq.shared.keys import TOKENS
from evalq.shared.names import check_name
from evalq.shared.store import audit

__all__ = ["TOKEN_PREFIX", "TokenLookup", "TokenStore"]

TOKEN_PREFIX = "evalq_"


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _stored_as(token: str) -> str | None:
    """The field ``token`` is stored under, or None when it cannot be a token."""
    if not token.startswith(TOKEN_PREFIX) or len(token) > 200:
        return None
    return _digest(token)


class TokenStore:
    """Token digests in ``evalq:tokens``."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client

    def create(self, principal: str, role: Role, *, who: str) -> str:
        """A new token for ``principal`` with ``role`` (audited); returned once, stored as its
        sha256 only."""
        check_name("principal", principal)
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        record = TokenRecord(principal=principal, role=role, created=time.time(), who=who)

        def write(one: redis.Redis) -> None:
            with one.pipeline(transaction=True) as pipe:
                pipe.hset(TOKENS, _digest(token), record.model_dump_json())
                audit.record(
                    pipe, "token_create", who, principal=principal, after=record.role.value
                )
                pipe.execute()

        confirmed(self._client, write)
        return token

    def caller(self, token: str) -> Caller | None:
        """Who ``token`` stands for, or None when it is unknown or revoked."""
        field = _stored_as(token)
        raw = None if field is None else self._client.hget(TOKENS, field)
        return None if raw is None else TokenRecord.model_validate_json(raw).caller

    def all(self) -> list[TokenRecord]:
        """Every live token's record, by principal then creation."""
        records = [TokenRecord.model_validate_json(v) for v in self._client.hvals(TOKENS)]
        return sorted(records, key=lambda r: (r.principal, r.created))

    def revoke(self, principal: str, *, who: str) -> int:
        """Revoke every token of ``principal`` (audited); return how many there were."""
        owned = [
            digest
            for digest, raw in self._client.hgetall(TOKENS).items()
            if TokenRecord.model_validate_json(raw).principal == principal
        ]
        if not owned:
            return 0

        def write(one: redis.Redis) -> None:
            with one.pipeline(transaction=True) as pipe:
                pipe.hdel(TOKENS, *owned)
                audit.record(pipe, "token_revoke", who, principal=principal, after=len(owned))
                pipe.execute()

        confirmed(self._client, write)
        return len(owned)


class TokenLookup:
    """Who a token stands for, asked without blocking (the gateway's event loop asks it for
    every request before the request takes a thread)."""

    def __init__(self, client: redis.asyncio.Redis) -> None:
        self._client = client

    async def caller(self, token: str) -> tuple[Caller, str] | None:
        """Who ``token`` stands for and its digest (to ask :meth:`live` later), or None when
        it is unknown or revoked."""
        field = _stored_as(token)
        raw = None if field is None else await self._client.hget(TOKENS, field)
        if field is None or raw is None:
            return None
        return TokenRecord.model_validate_json(raw).caller, field

    async def live(self, digest: str) -> bool:
        """Whether the token of ``digest`` is still live (not revoked)."""
        return bool(await self._client.hexists(TOKENS, digest))
