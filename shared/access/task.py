"""A registered language task's record: its name, its spec and who registered it.
:class:`evalq.shared.access.tasks.TaskRegistry` keeps them (the HTTP client reads this module
without Redis)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from evalq.shared.lm.task import TaskSpec

__all__ = ["RegisteredTask"]


class RegisteredTask(BaseModel):
    """A registered task's record."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    """Its registered name (what ``evalq submit NAME`` names)."""
    spec: TaskSpec
    """The task, as its YAML file said it."""
    digest: str
    """sha256 of the spec's canonical JSON (:attr:`TaskSpec.digest`): what provenance shows."""
    who: str
    """Who registered it."""
    added: float
    """Unix time of registration."""
