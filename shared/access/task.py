"""A registered task's record (a YAML language task or an lm-eval task): its name, its spec
and who registered it. :class:`evalq.shared.access.tasks.TaskRegistry` keeps them (the HTTP
client reads this module without Redis)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Discriminator, Tag

from evalq.shared.lm.harness import HarnessSpec
from evalq.shared.lm.task import TaskSpec

__all__ = ["RegisteredTask"]


def _kind_of(spec: Any) -> str:
    """Which spec a record holds: an lm-eval task's names its ``lm_eval`` task."""
    if isinstance(spec, HarnessSpec) or (isinstance(spec, dict) and "lm_eval" in spec):
        return "lm-eval"
    return "language"


class RegisteredTask(BaseModel):
    """A registered task's record."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    """Its registered name (what ``evalq submit NAME`` names)."""
    spec: Annotated[
        Annotated[TaskSpec, Tag("language")] | Annotated[HarnessSpec, Tag("lm-eval")],
        Discriminator(_kind_of),
    ]
    """The task, as its YAML file said it, or an lm-eval task as lm-eval resolved it (its
    files pinned)."""
    digest: str
    """sha256 of the spec's canonical JSON (:attr:`TaskSpec.digest`,
    :attr:`HarnessSpec.digest`): what provenance shows."""

    @property
    def kind(self) -> str:
        """``lm-eval`` or ``language`` (a YAML task): the task kind its runs are."""
        return "lm-eval" if isinstance(self.spec, HarnessSpec) else "language"

    who: str
    """Who registered it."""
    added: float
    """Unix time of registration."""
