"""Where a backlogged run stands in the fair dispatcher (:mod:`evalq.shared.queue.backlog`): its
samples waiting, its share of the workers, and who is served before it."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["Standing"]


class Standing(BaseModel):
    """Where a backlogged run stands in the dispatcher (``status`` shows it)."""

    model_config = ConfigDict(frozen=True)

    waiting: int
    """Samples in the run's backlog, not handed to the workers yet."""
    share: float
    """Fraction of the dispatched samples the run gets while the backlogged runs stay as they
    are: its principal's share of the principals' weight, times its share of its principal's."""
    principals: int
    """Principals with a backlogged run (its own included)."""
    runs: int
    """Backlogged runs of the run's principal (itself included)."""
    ahead: int
    """Principals served before this run's principal at the next refill."""

    @property
    def why(self) -> str:
        """Why the run's samples wait, in words."""
        shared = []
        if self.principals > 1:
            shared.append(f"{self.principals - 1} other principal(s)")
        if self.runs > 1:
            shared.append(f"{self.runs - 1} other run(s) of its principal")
        if not shared:
            return "only run waiting: dispatched as fast as the workers take it"
        turn = "next in turn" if self.ahead == 0 else f"{self.ahead} principal(s) ahead"
        return f"shares the workers with {' and '.join(shared)}; {turn}"
