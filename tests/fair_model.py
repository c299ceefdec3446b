"""A reference model of the fair dispatcher's order, in Python: what ``stage.lua``,
``dispatch.lua`` and ``withdraw.lua`` do to one round (``shared/queue/lua/prelude.lua``:
``fair_dispatch``, ``fair_turn``, ``fair_first_of``, ``fair_principal_weight``,
``fair_leave``), step by step, on plain dictionaries that mirror the round's keys
(:class:`evalq.shared.keys.FairKeys`).

It is a model for the tests, not a second dispatcher: evalq dispatches only in Lua, in one
script per step, and nothing in the product imports this module (so it lives in ``tests/``,
not in ``shared/queue/``). The fast layer checks the fairness properties the docs promise on
it, with no Redis (``tests/test_fair_order.py``); a parity test runs random scenarios through
both it and the real scripts on a real ``redis-server`` and requires the same messages in the
same order (``tests/test_fair_parity.py``), so a property shown here holds for the Lua.

Time: the scripts read Redis's clock (``TIME``) to start and end a turn; the model reads
:attr:`FairRound.now`, which only :meth:`FairRound.advance` moves. Left out: the run's status
check (``stage.lua`` takes nothing for an ended run), the depth count's expiry (the janitor's
count, :meth:`FairRound.set_depth`, holds until set again), the chunking of a big stage
(:data:`evalq.shared.queue.backlog.STAGE_CHUNK`) and the scripts' handling of more than one
round per call (each round is independent).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

__all__ = ["Entry", "FairRound"]

FIRST_OF = 64
"""How many of a principal's lowest-time runs ``fair_first_of`` looks through for the turn's
model."""


@dataclass(frozen=True, slots=True)
class Entry:
    """A backlog entry (``samples|queue|message``): the message goes to ``queue``."""

    samples: int
    queue: str
    message: str


def _lowest(scores: dict[str, float]) -> tuple[str, float]:
    """A sorted set's first member: the lowest score, ties by the member's bytes."""
    member = min(scores, key=lambda m: (scores[m], m.encode()))
    return member, scores[member]


def _ordered(scores: dict[str, float]) -> list[tuple[str, float]]:
    return sorted(scores.items(), key=lambda item: (item[1], item[0].encode()))


def _deadline(at: float) -> float:
    """A turn's deadline as ``fair_turn`` stores it (``'%.6f'``) and reads it back."""
    return float(f"{at:.6f}")


@dataclass
class FairRound:
    """One round of the fair dispatcher (one broker queue's), its runs' backlogs and the broker
    lists it fills, as the scripts leave them in Redis. Every list reads left to right as
    ``LRANGE 0 -1`` does: a backlog's oldest entry and a queue's head (what kombu pops next)
    are at the right."""

    turn_seconds: float
    now: float = 0.0
    principals: dict[str, float] = field(default_factory=dict)
    runs: dict[str, dict[str, float]] = field(default_factory=dict)
    """principal -> its backlogged run -> the run's virtual time (FairKeys.runs)."""
    clock: dict[str, float] = field(default_factory=dict)
    finish: dict[str, float] = field(default_factory=dict)
    owner: dict[str, str] = field(default_factory=dict)
    weight: dict[str, int] = field(default_factory=dict)
    weights: dict[str, dict[int, int]] = field(default_factory=dict)
    waiting: dict[str, int] = field(default_factory=dict)
    turn: dict[str, tuple[str, float]] = field(default_factory=dict)
    model: dict[str, str] = field(default_factory=dict)
    backlogs: dict[str, list[Entry]] = field(default_factory=dict)
    queues: dict[str, list[str]] = field(default_factory=dict)
    depth: int = 0
    """The janitor's count of the queue's depth (FairKeys.depth; 0 = none)."""

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` of Redis's clock pass."""
        self.now += seconds

    def set_depth(self, messages: int) -> None:
        """What :meth:`evalq.shared.queue.backlog.Backlog.set_depth` counts."""
        self.depth = max(1, messages)

    def stage(
        self,
        run: str,
        principal: str,
        weight: int,
        model: str,
        entries: Sequence[Entry],
        *,
        queue: str | None = None,
        refill: int | None = None,
        at_least: int = 0,
    ) -> int:
        """``stage.lua`` on a going run: append ``entries`` to ``run``'s backlog and enter it
        (and its principal) in the round; with ``refill``, then refill ``queue`` as
        :meth:`dispatch` does. Return the samples staged."""
        backlog = self.backlogs.setdefault(run, [])
        staged = 0
        for entry in entries:
            backlog.insert(0, entry)
            staged += entry.samples
        if staged == 0:
            return 0
        self.waiting[run] = self.waiting.get(run, 0) + staged
        self.owner[run] = principal
        self.weight[run] = weight
        self.model[run] = model
        runs = self.runs.setdefault(principal, {})
        if run not in runs:
            runs[run] = self.clock.get(principal, 0.0)
            counts = self.weights.setdefault(principal, {})
            counts[weight] = counts.get(weight, 0) + 1
        if principal not in self.principals:
            self.principals[principal] = max(
                self.clock.get("", 0.0), self.finish.get(principal, 0.0)
            )
        if refill is not None:
            assert queue is not None, "a refill names its queue"
            self.dispatch(queue, refill, at_least=at_least)
        return staged

    def dispatch(self, queue: str, depth: int, *, at_least: int = 0) -> int:
        """``fair_dispatch``: keep ``queue`` ``depth`` messages deep (the janitor's count when
        greater) and move at least ``at_least``, those beyond the depth to its head; return
        the messages moved."""
        depth = max(depth, self.depth)
        refill = depth - len(self.queues.get(queue, []))
        want = max(refill, at_least)
        moved = visits = 0
        while moved < want and visits < 4 * want + 64:
            visits += 1
            if not self.principals:
                break
            principal, ptime = _lowest(self.principals)
            chosen = self._turn(principal)
            if chosen is None:
                self._leave(principal, "")
                continue
            run, rtime = chosen
            backlog = self.backlogs.get(run, [])
            if not backlog:
                self._leave(principal, run)
                continue
            entry = backlog.pop()
            target = self.queues.setdefault(entry.queue, [])
            if moved >= refill:
                target.append(entry.message)  # RPUSH: the head
            else:
                target.insert(0, entry.message)  # LPUSH: the tail
            self.waiting[run] = self.waiting.get(run, 0) - entry.samples
            self.clock[principal] = rtime
            self.clock[""] = ptime
            self.runs[principal][run] = rtime + entry.samples / self.weight.get(run, 1)
            self.principals[principal] = ptime + entry.samples / self.principal_weight(principal)
            moved += 1
            if not backlog:
                self._leave(principal, run)
        return moved

    def withdraw(self, run: str) -> bool:
        """``withdraw.lua`` for this round: delete ``run``'s backlog and take it out of the
        round; False if it was in none."""
        self.backlogs.pop(run, None)
        owner = self.owner.get(run)
        if owner is None:
            return False
        self._leave(owner, run)
        return True

    def pop(self, queue: str) -> str | None:
        """What a worker takes next from ``queue`` (kombu's ``RPOP``)."""
        messages = self.queues.get(queue, [])
        return messages.pop() if messages else None

    def principal_weight(self, principal: str) -> int:
        """``fair_principal_weight``: the highest weight among the principal's backlogged runs
        (1 when none)."""
        counts: Iterable[tuple[int, int]] = self.weights.get(principal, {}).items()
        return max([1, *(w for w, n in counts if n > 0)])

    def _first_of(self, principal: str, model: str) -> tuple[str, float] | None:
        """``fair_first_of``: the lowest-time run of ``model`` among the principal's
        :data:`FIRST_OF` lowest."""
        for run, rtime in _ordered(self.runs.get(principal, {}))[:FIRST_OF]:
            if self.model.get(run, run) == model:
                return run, rtime
        return None

    def _turn(self, principal: str) -> tuple[str, float] | None:
        """``fair_turn``: the turn's model's lowest-time run while the turn lasts, else the
        lowest-time run, whose model starts a new turn."""
        turn = self.turn.get(principal)
        if turn is not None and self.now < turn[1]:
            found = self._first_of(principal, turn[0])
            if found is not None:
                return found
        runs = self.runs.get(principal, {})
        if not runs:
            return None
        run, rtime = _lowest(runs)
        self.turn[principal] = (self.model.get(run, run), _deadline(self.now + self.turn_seconds))
        return run, rtime

    def _leave(self, principal: str, run: str) -> None:
        """``fair_leave``: the run leaves its principal's runs; a principal left with none
        leaves the round, remembering its time in ``finish``."""
        weight = self.weight.get(run)
        runs = self.runs.get(principal, {})
        if run in runs:
            del runs[run]
            if weight is not None:
                counts = self.weights.setdefault(principal, {})
                left = counts.get(weight, 0) - 1
                if left <= 0:
                    counts.pop(weight, None)
                else:
                    counts[weight] = left
        self.owner.pop(run, None)
        self.weight.pop(run, None)
        self.waiting.pop(run, None)
        self.model.pop(run, None)
        if not runs:
            if principal in self.principals:
                self.finish[principal] = self.principals.pop(principal)
            self.runs.pop(principal, None)
            self.clock.pop(principal, None)
            self.turn.pop(principal, None)
            self.weights.pop(principal, None)
