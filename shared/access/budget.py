"""A budget: what a split, or one caller on it, may still spend (runs, samples, samples per
run, tokens), and what it spent. :class:`evalq.shared.access.ledger.Ledger` keeps and charges runs
and samples; the workers charge tokens (:class:`evalq.shared.store.spend.TokenSpend`)."""

from __future__ import annotations

from pydantic import BaseModel, Field

__all__ = ["Budget"]


class Budget(BaseModel):
    """One split's budget; ``None`` totals are unlimited."""

    dataset: str
    """Dataset id."""
    split: str
    """Split name."""
    caller: str | None = None
    """The principal this budget meters on the split; None: the whole split, whoever submits."""
    runs_total: int | None = Field(default=None, ge=0)
    """Runs allowed in all."""
    samples_total: int | None = Field(default=None, ge=0)
    """Samples allowed in all."""
    max_samples_per_run: int | None = Field(default=None, ge=1)
    """Most samples one run may ask for."""
    tokens_total: int | None = Field(default=None, ge=0)
    """Tokens (prompt and completion, as the endpoint counts them) allowed in all."""
    runs_used: int = 0
    """Runs charged so far."""
    samples_used: int = 0
    """Samples charged so far."""
    tokens_used: int = 0
    """Tokens charged so far: the recorded usage of every request that returned."""
    tokens_reserved: int = 0
    """Tokens held by requests in flight (each its worst case) until they return."""

    @property
    def runs_left(self) -> int | None:
        return None if self.runs_total is None else max(0, self.runs_total - self.runs_used)

    @property
    def samples_left(self) -> int | None:
        if self.samples_total is None:
            return None
        return max(0, self.samples_total - self.samples_used)

    @property
    def tokens_left(self) -> int | None:
        if self.tokens_total is None:
            return None
        return max(0, self.tokens_total - self.tokens_used - self.tokens_reserved)

    def summary(self) -> dict[str, int | str | None]:
        """Totals, used and left, for display and JSON."""
        return {
            **self.model_dump(),
            "runs_left": self.runs_left,
            "samples_left": self.samples_left,
            "tokens_left": self.tokens_left,
        }
