"""The workers' token ledger: token budgets (``budget set --tokens``) charged request by request,
so that what is charged never exceeds a budget, with any number of workers.

Before each try of an endpoint request its worker holds the request's worst case (the prompt's
bytes plus a chat template's share, plus every token it may generate) on its run's split and on
its principal's own budget there (``spend.lua``, one atomic step that refuses when ``used +
reserved + worst`` would pass a total); when the try returns the hold is let go and charged in
one step: the usage the endpoint reported (at most the hold), nothing when the server refused it
(a status without usage), the whole hold when it may have been served without an answer (a
timeout, a lost connection). A hold lives at most a try's timeout plus :data:`HOLD_MARGIN`: a
hold past its deadline belongs to a worker that died (or lost Redis) mid-try, and the janitor
charges it whole (:meth:`TokenSpend.expire`). Each step is safe to send again (redis-py retries
a command whose reply a dropped connection lost).

A refused hold waits while other requests hold enough that their return could make room, and
ends its sample :class:`evalq.shared.errors.TokensExhausted` otherwise (``used + worst > total``:
nothing in flight can change that): unsent, never charged.

A split's token budget is shared by everyone who runs on it, so one principal's holds on it are
bounded by a fair share of what is left (``spend.lua``): once it holds anything there, all it
holds stays within ``(total - used) / (holders + 1)``, ``holders`` being the principals holding
(one alone: half), and a principal holding nothing may always hold one request that fits. The
security review's 50 slow requests of one user held 5,390 of a split's 5,480 tokens, and another
user's run waited 360 s for them and ended unsent; now another user always finds part of what is
left free. A principal's own budget is its own: no share applies there.

The totals are the gateway's (``tokens_total`` in each :func:`evalq.shared.keys.budget_key`, which
the ``worker`` ACL user only reads); ``used`` and ``reserved`` are the workers'
(:func:`evalq.shared.keys.spend_key`), since only they see the usage an endpoint reports. Each step
reads the totals just before its script and passes them as arguments (:meth:`Scope.totals`):
Redis's ACL asks for write access to every key an ``EVALSHA`` names, so a budget key among the
script's keys refused every metered request of a worker holding the ``worker`` user (the
security review's finding, on the ACL file ``evalq acl`` writes). An admin's
run (not charged) is not metered; a principal's own token budget counts from when it is set.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from dataclasses import dataclass

import redis

from evalq.shared.connection import server_time
from evalq.shared.errors import TokensExhausted
from evalq.shared.keys import HOLD_DEADLINES, HOLDS, budget_key, spend_key
from evalq.shared.models import RunMeta
from evalq.shared.store.scripts import register

__all__ = ["HOLD_MARGIN", "RunMeter", "Scope", "TokenSpend"]

HOLD_MARGIN = 15.0
"""Seconds a hold outlives its try's timeout before the janitor charges it."""
_SWEEP = 10_000
"""Holds the janitor looks at in one sweep, at most."""
_CHARGED = "charged"
"""A hold's record once it was charged (``spend.lua``)."""
_TOTAL = "tokens_total"
"""The field of a budget holding its token total (absent: unlimited)."""


@dataclass(frozen=True)
class Scope:
    """Where a run's tokens are charged: its split, and its principal's own budget there."""

    dataset: str
    split: str
    principal: str | None

    @property
    def keys(self) -> list[str]:
        """The keys ``spend.lua`` writes: the holds and the split's (and principal's) ledger;
        never a budget (the ``worker`` ACL user only reads those)."""
        callers = [None, self.principal] if self.principal else [None]
        return [HOLDS, HOLD_DEADLINES, *(spend_key(self.dataset, self.split, c) for c in callers)]

    def totals(self, client: redis.Redis) -> list[str]:
        """The split's and the principal's ``tokens_total`` as they are now (``''``: none), in
        one round trip, for ``spend.lua``'s ARGV."""
        with client.pipeline(transaction=False) as pipe:
            pipe.hget(budget_key(self.dataset, self.split), _TOTAL)
            if self.principal:
                pipe.hget(budget_key(self.dataset, self.split, self.principal), _TOTAL)
            read = pipe.execute()
        return ["" if total is None else str(total) for total in [*read, None][:2]]

    def where(self, which: str) -> str:
        where = f"{self.dataset}/{self.split}"
        return f"{where} for {self.principal}" if which == "principal" else where


class TokenSpend:
    """The token ledger's holds and charges; owns ``spend.lua``."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._script = register(client, "evalq.shared.store", "spend", confirmed=True)
        self._worker = f"{os.getpid()}@{socket.gethostname()}"

    def meter(self, meta: RunMeta) -> RunMeter | None:
        """The meter of run ``meta``'s requests; None for a run no budget is charged for (an
        admin's)."""
        if not meta.charged:
            return None
        return RunMeter(self, Scope(meta.dataset_id, meta.split, meta.principal or None))

    def hold(
        self, scope: Scope, tokens: int, seconds: float, ticket: str | None = None
    ) -> str | tuple[str, int, int, int]:
        """Hold ``tokens`` for ``seconds`` at most: the hold's ticket (``ticket``, or a new
        one), or the refusal (``'split'``, ``'principal'`` or ``'share'`` (past the principal's
        fair share of the split's), its total, used, reserved), nothing held."""
        ticket = ticket or uuid.uuid4().hex
        record = {
            "tokens": tokens,
            "worker": self._worker,
            "dataset": scope.dataset,
            "split": scope.split,
            "principal": scope.principal or "",
        }
        millis = max(1, int(seconds * 1000))
        totals = scope.totals(self._client)
        args: list[str | int] = [
            "hold",
            ticket,
            *totals,
            tokens,
            json.dumps(record),
            millis,
            scope.principal or "",
        ]
        reply = self._script(keys=scope.keys, args=args)
        if int(reply[0]) == 1:
            return ticket
        return str(reply[1]), int(reply[2]), int(reply[3]), int(reply[4])

    def charge(self, scope: Scope, ticket: str, used: int) -> int:
        """Let go of a hold and charge ``used`` tokens (at most the hold; nothing more when it
        was charged already); return what was charged."""
        args: list[str | int] = ["charge", ticket, *scope.totals(self._client), max(0, used)]
        return int(self._script(keys=scope.keys, args=args))

    def expire(self) -> int:
        """Charge whole every hold past its deadline (its worker died mid-try: the request
        may have been served) and forget charged ones kept for retries; return the tokens
        charged."""
        now_ms = server_time(self._client) * 1000
        tickets = self._client.zrangebyscore(HOLD_DEADLINES, "-inf", now_ms, 0, _SWEEP)
        charged = 0
        for ticket in map(str, tickets):
            raw = self._client.hget(HOLDS, ticket)
            keys = [HOLDS, HOLD_DEADLINES]  # a charged (or gone) hold touches no budget
            if raw is not None and raw != _CHARGED:
                record = json.loads(raw)
                keys = Scope(record["dataset"], record["split"], record["principal"] or None).keys
            # a held hold is charged whole, whatever the totals: none is read
            charged += int(self._script(keys=keys, args=["expire", ticket, "", ""]))
        return charged


class RunMeter:
    """One run's token budget, as an endpoint model asks it
    (:class:`evalq.shared.lm.endpoint.Meter`)."""

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
        """The request of ``ticket`` returned having used ``used`` tokens (0: refused; its
        hold: it may have been served unanswered)."""
        self._spend.charge(self.scope, ticket, used)
