"""The workers' token ledger: token budgets (``budget set --tokens``) charged request by request,
so that what is charged never exceeds a budget, with any number of workers.

Before each try of an endpoint request its worker holds the request's worst case (the prompt's
bytes plus a chat template's share, plus every token it may generate) on its run's split and on
its principal's own budget there (``spend.lua``, one atomic step that refuses when ``used +
reserved + worst`` would pass a total); when the try returns the hold is let go and the usage the
endpoint reported charged, in one step. A hold lives at most a try's timeout plus
:data:`HOLD_MARGIN`: a try cannot outlive its timeout, so a hold past its deadline belongs to a
worker that died (or lost Redis) mid-try, and the janitor lets it go (:meth:`TokenSpend.expire`).

A refused hold waits while other requests hold enough that their return could make room, and
ends its sample :class:`shared.errors.TokensExhausted` otherwise (``used + worst > total``:
nothing in flight can change that): unsent, never charged.

The totals are the gateway's (``tokens_total`` in each :func:`shared.keys.budget_key`, which the
``worker`` ACL user only reads); ``used`` and ``reserved`` are the workers'
(:func:`shared.keys.spend_key`), since only they see the usage an endpoint reports. An admin's
run (not charged) is not metered.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from dataclasses import dataclass

import redis

from shared.connection import server_time
from shared.errors import TokensExhausted
from shared.keys import HOLD_DEADLINES, HOLDS, budget_key, spend_key
from shared.models import RunMeta
from shared.store.scripts import register

__all__ = ["HOLD_MARGIN", "RunMeter", "Scope", "TokenSpend"]

HOLD_MARGIN = 15.0
"""Seconds a hold outlives its try's timeout before the janitor may let it go."""


@dataclass(frozen=True)
class Scope:
    """Where a run's tokens are charged: its split, and its principal's own budget there."""

    dataset: str
    split: str
    principal: str | None

    @property
    def keys(self) -> list[str]:
        callers = [None, self.principal] if self.principal else [None]
        pairs = [
            key(self.dataset, self.split, caller)
            for caller in callers
            for key in (budget_key, spend_key)
        ]
        return [HOLDS, HOLD_DEADLINES, *pairs]

    def where(self, which: str) -> str:
        where = f"{self.dataset}/{self.split}"
        return f"{where} for {self.principal}" if which == "principal" else where


class TokenSpend:
    """The token ledger's holds and charges; owns ``spend.lua``."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._script = register(client, "shared.store", "spend")
        self._worker = f"{os.getpid()}@{socket.gethostname()}"

    def meter(self, meta: RunMeta) -> RunMeter | None:
        """The meter of run ``meta``'s requests; None for a run no budget is charged for (an
        admin's)."""
        if not meta.charged:
            return None
        return RunMeter(self, Scope(meta.dataset_id, meta.split, meta.principal or None))

    def hold(self, scope: Scope, tokens: int, seconds: float) -> str | tuple[str, int, int, int]:
        """Hold ``tokens`` for ``seconds`` at most: the hold's ticket, or the refusal
        (``'split'`` or ``'principal'``, its total, used, reserved), nothing held."""
        ticket = uuid.uuid4().hex
        record = {
            "tokens": tokens, "worker": self._worker, "dataset": scope.dataset,
            "split": scope.split, "principal": scope.principal or "",
        }  # fmt: skip
        millis = max(1, int(seconds * 1000))
        reply = self._script(
            keys=scope.keys, args=["hold", ticket, tokens, json.dumps(record), millis]
        )
        if int(reply[0]) == 1:
            return ticket
        return str(reply[1]), int(reply[2]), int(reply[3]), int(reply[4])

    def charge(self, scope: Scope, ticket: str, used: int) -> None:
        """Let go of a hold and charge ``used`` tokens (charged even when the janitor let the
        hold go first: usage is what the endpoint reported)."""
        self._script(keys=scope.keys, args=["charge", ticket, max(0, used)])

    def expire(self) -> int:
        """Let go of every hold past its deadline (its worker died mid-try); return the
        tokens given back."""
        now_ms = server_time(self._client) * 1000
        tickets = self._client.zrangebyscore(HOLD_DEADLINES, "-inf", now_ms)
        freed = 0
        for ticket in map(str, tickets):
            raw = self._client.hget(HOLDS, ticket)
            if raw is None:
                self._client.zrem(HOLD_DEADLINES, ticket)
                continue
            record = json.loads(raw)
            scope = Scope(record["dataset"], record["split"], record["principal"] or None)
            freed += int(self._script(keys=scope.keys, args=["release", ticket]))
        return freed


class RunMeter:
    """One run's token budget, as an endpoint model asks it (:class:`shared.lm.endpoint.Meter`)."""

    def __init__(self, spend: TokenSpend, scope: Scope) -> None:
        self._spend = spend
        self.scope = scope

    def hold(self, tokens: int, seconds: float) -> str | None:
        """Hold ``tokens`` for a try that times out after ``seconds``: the ticket; None when
        requests in flight hold enough that their return could make room (ask again later).
        Raises :class:`TokensExhausted` when nothing in flight could."""
        got = self._spend.hold(self.scope, tokens, seconds + HOLD_MARGIN)
        if isinstance(got, str):
            return got
        which, total, used, reserved = got
        if used + tokens <= total and reserved > 0:
            return None
        raise TokensExhausted(
            f"token budget of {self.scope.where(which)} exhausted: {used} of {total} used, "
            f"{reserved} held; this request may need {tokens}; not sent"
        )

    def charge(self, ticket: str, used: int) -> None:
        """The request of ``ticket`` returned having used ``used`` tokens (0: it failed)."""
        self._spend.charge(self.scope, ticket, used)
