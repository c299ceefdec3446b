"""A registered dataset's record: its name, its splits each pinned to a source, and who
registered it. :class:`evalq.shared.access.registry.DatasetRegistry` keeps them."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict

from evalq.shared.data.spec import Source
from evalq.shared.errors import EvalqError, SplitNotFoundError

__all__ = ["RegisteredDataset"]


class RegisteredDataset(BaseModel):
    """A registered dataset's record."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    """Its registered name."""
    data: str
    """The source as it was given (a path, an object-store URL or a Hub id); empty in an
    outline."""
    splits: Mapping[str, Source | None]
    """Each split's pinned source (None in an outline)."""
    who: str
    """Who registered it."""
    added: float
    """Unix time of registration."""

    def source(self, split: str) -> Source:
        """The pinned source of ``split``; :class:`SplitNotFoundError` (exit 2) naming the
        dataset's splits when it has no such split."""
        if split not in self.splits:
            have = ", ".join(sorted(self.splits))
            raise SplitNotFoundError(
                f"dataset '{self.name}' has no split '{split}' (splits: {have})"
            )
        source = self.splits[split]
        if source is None:
            raise EvalqError(f"dataset '{self.name}': this record is an outline, without sources")
        return source

    def outline(self) -> RegisteredDataset:
        """The record without its sources (paths, URLs, Hub ids, file digests): what a caller who
        is not an admin sees (a digest of a small labelled file can be matched offline
        against every labelling of inputs the caller knows)."""
        return self.model_copy(update={"data": "", "splits": dict.fromkeys(self.splits)})
