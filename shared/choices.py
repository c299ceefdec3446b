"""The closed sets of values evalq's command line offers, and the shard limit it checks: plain
enums and a number, importing nothing, so that building the ``evalq`` app (its options'
choices, for ``--help``, a usage error or any command) loads no pydantic. Each belongs to, and
is exported by, the module of its concern as well: :class:`RunStatus` and :class:`Priority`
:mod:`evalq.shared.models`', :class:`Tier` :mod:`evalq.shared.access.policy`'s, :class:`Role`
:mod:`evalq.shared.access.roles`', :class:`RoutingKind` :mod:`evalq.shared.data.routing`'s,
:data:`MAX_SPEC_SHARDS` :mod:`evalq.shared.data.spec`'s and :class:`ExportFormat`
:mod:`evalq.producer.reports.export`'s.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "MAX_SPEC_SHARDS",
    "ExportFormat",
    "Priority",
    "Role",
    "RoutingKind",
    "RunStatus",
    "Tier",
]

MAX_SPEC_SHARDS = 1024
"""The most shards a dataset spec cuts a split into."""


class RunStatus(StrEnum):
    """Where a run is in its life."""

    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def active(self) -> bool:
        """Queued or running: its samples may still change."""
        return self in (RunStatus.QUEUED, RunStatus.RUNNING)


class Priority(StrEnum):
    """How much of the workers a run asks for, against the other runs of its principal and,
    through its principal, against other principals (``submit --priority``)."""

    LOW = "low"
    NORMAL = "normal"
    HIGH = "high"

    @property
    def weight(self) -> int:
        """The run's weight in the fair dispatcher: ``high`` gets twice ``normal``'s share,
        ``normal`` twice ``low``'s, and no weight is zero, so ``low`` is never starved."""
        return {Priority.LOW: 1, Priority.NORMAL: 2, Priority.HIGH: 4}[self]

    @property
    def rank(self) -> int:
        """Order of the levels: low < normal < high."""
        return list(Priority).index(self)


class Tier(StrEnum):
    """Visibility of a (dataset, split)."""

    VIEWABLE = "viewable"
    NON_VIEWABLE = "non_viewable"
    NO_ACCESS = "no_access"


class Role(StrEnum):
    """What a token's holder may do through the gateway."""

    ADMIN = "admin"
    """Datasets, tiers, budgets, policy, tokens, audit; ``--admin`` submits and reads; any run."""
    USER = "user"
    """Submit and read within the tiers; see, cancel and resume its own runs only."""


class RoutingKind(StrEnum):
    """The routings a spec can use."""

    CONTIGUOUS = "contiguous"
    ROUND_ROBIN = "round_robin"
    KMEANS = "kmeans"


class ExportFormat(StrEnum):
    """Formats of ``evalq results``."""

    JSONL = "jsonl"
    CSV = "csv"
    PARQUET = "parquet"
