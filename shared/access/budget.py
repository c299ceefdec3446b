"""A budget: what a split, or one caller on it, may still spend (runs, samples, samples per
run), and what it spent. :class:`shared.access.ledger.Ledger` keeps and charges them."""

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
    runs_used: int = 0
    """Runs charged so far."""
    samples_used: int = 0
    """Samples charged so far."""

    @property
    def runs_left(self) -> int | None:
        return None if self.runs_total is None else max(0, self.runs_total - self.runs_used)

    @property
    def samples_left(self) -> int | None:
        if self.samples_total is None:
            return None
        return max(0, self.samples_total - self.samples_used)

    def summary(self) -> dict[str, int | str | None]:
        """Totals, used and left, for display and JSON."""
        return {
            **self.model_dump(),
            "runs_left": self.runs_left,
            "samples_left": self.samples_left,
        }
