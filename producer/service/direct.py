"""Direct access: one principal's handle on the stores, shared by the parts of the direct client.

An operator holding the Redis URL, or the gateway acting for a token's principal, reads and
writes the stores through one :class:`Direct`: the settings, the Redis connection, each store
once, the data cache its settings name, the Celery app (made on first use) and the
:class:`evalq.shared.access.disclosure.Disclosure` that answers what this reader may see.
:class:`evalq.producer.service.client.Client` and its parts (:mod:`evalq.producer.service.viewer`,
:mod:`evalq.producer.service.samples`, :mod:`evalq.producer.service.resume`) hold one each.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import redis
from celery import Celery

from evalq.shared.access.disclosure import Disclosure
from evalq.shared.access.ledger import Ledger
from evalq.shared.access.policy import Reader
from evalq.shared.access.registry import DatasetRegistry
from evalq.shared.access.release import ReleaseStore
from evalq.shared.access.tiers import TierRegistry
from evalq.shared.access.tokens import TokenStore
from evalq.shared.connection import connect, server_time
from evalq.shared.data.remote import DataCache
from evalq.shared.data.spec import DatasetSpec, fetch_spec
from evalq.shared.errors import UnknownRunError
from evalq.shared.failures import UNSENT
from evalq.shared.models import RunMeta
from evalq.shared.queue.backlog import Backlog
from evalq.shared.queue.celery_app import create_app
from evalq.shared.settings import Settings
from evalq.shared.store.audit import audit_admin
from evalq.shared.store.presence import Presence
from evalq.shared.store.provenance import ProvenanceStore
from evalq.shared.store.reader import ResultReader
from evalq.shared.store.runs import RunStore
from evalq.shared.store.writer import ResultWriter

if TYPE_CHECKING:
    from datasets import Dataset

__all__ = ["CLI_RETRIES", "Direct"]

CLI_RETRIES = 3
"""Connection retries of a client (about 0.35 s of back-off): a person waiting on a command
learns quickly that Redis is down; workers ride out longer drops."""


class Direct:
    """The stores one principal, admin or not, acts through."""

    def __init__(
        self,
        settings: Settings,
        admin: bool,
        *,
        principal: str,
        client: redis.Redis | None,
        app: Celery | None,
        sees_sources: bool,
    ) -> None:
        """``client`` and ``app``: the gateway's shared ones (None: connect to
        ``settings.redis_url``, make the app on first use)."""
        self.settings = settings
        self.admin = admin
        self.principal = principal
        self.sees_sources = sees_sources
        self.data_cache = DataCache.of(settings)
        """Where this process keeps its copies of object-store sources' objects."""
        self.redis = client or connect(settings.redis, retries=CLI_RETRIES)
        self._app = app
        self.runs = RunStore(self.redis)
        self.results = ResultReader(self.redis)
        self.writer = ResultWriter(self.redis)
        self.tiers = TierRegistry(self.redis)
        self.ledger = Ledger(self.redis)
        self.presence = Presence(self.redis)
        self.registry = DatasetRegistry(self.redis)
        self.tokens = TokenStore(self.redis)
        self.releases = ReleaseStore(self.redis)
        self.backlog = Backlog(self.redis)
        self.provenance = ProvenanceStore(self.redis)
        self.disclosure = Disclosure(
            tiers=self.tiers,
            releases=self.releases,
            results=self.results,
            provenance=self.provenance,
            admin=admin,
            sees_sources=sees_sources,
        )

    @property
    def app(self) -> Celery:
        """The Celery app used to publish (made on first use)."""
        if self._app is None:
            self._app = create_app(self.settings)
        return self._app

    def outward(self, meta: RunMeta) -> RunMeta:
        """``meta`` as this reader may see it (:meth:`Disclosure.outward`)."""
        return self.disclosure.outward(meta)

    def reader(self, meta: RunMeta) -> Reader:
        """What this reader may see of the run (:meth:`Disclosure.reader`)."""
        return self.disclosure.reader(meta)

    def seen(self, meta: RunMeta) -> tuple[RunMeta, bool]:
        """``meta`` as this reader reads it now (:meth:`Disclosure.listed`), and whether it
        sees the run's timing. An action on a run (resume, rescore) judges the run's
        state by this view, so that its answer tells a reader who does not see the timing no
        more than ``status`` does: not the run's end before the grain, nor a count."""
        if self.disclosure.reader(meta).sees_timing:
            return meta, True
        return self.disclosure.listed(meta, server_time(self.redis)), False

    def spec(self, run_id: str) -> DatasetSpec:
        """The published dataset spec of a run (a source and routing, no rows)."""
        return fetch_spec(self.redis, self.runs.get(run_id).spec)

    def split_rows(self, spec: DatasetSpec) -> Dataset:
        """The split of ``spec``, rebuilt here from its source (read through
        :attr:`data_cache`) and checked against what the spec pins."""
        from evalq.shared.data.loading import load_rows

        return load_rows(spec, self.data_cache)

    def readable(self, run_id: str) -> None:
        """Refuse, before any result is streamed, a reader without per-sample access and a
        run whose record names an archive outside its folder; an admin's read of a split that
        is not viewable is audited."""
        meta = self.runs.get(run_id)
        self.runs.saw_end(meta)
        reader = self.reader(meta)
        reader.require_samples()
        self.results.archive_url(run_id)
        if reader.bypasses:
            audit_admin(self.redis, "admin_read", self.principal, meta, {"tier": reader.tier})

    def refund_unsent(self) -> int:
        """Give back (once per run) the samples token budgets kept from being sent in runs
        that have ended (:meth:`Ledger.refund_unsent`); return how many."""

        def unsent(run_id: str) -> tuple[RunMeta, int] | None:
            try:
                meta = self.runs.get(run_id)
            except UnknownRunError:
                return None
            return (meta, self.unsent(run_id)) if meta.charged else None

        return self.ledger.refund_unsent(unsent)

    def unsent(self, run_id: str) -> int:
        """The run's samples a token budget kept from being sent."""
        return self.results.errors_by_kind(run_id).get(UNSENT, 0)
