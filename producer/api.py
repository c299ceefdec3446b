"""The client interface, and which door a command goes through: the gateway when
``EVALQ_API_URL`` is set, Redis otherwise (direct mode: operator trust).

:class:`Api` is what the CLI calls. Two classes implement it with the same methods and
signatures: :class:`evalq.producer.client.Client` (Redis) and
:class:`evalq.producer.remote.RemoteClient` (HTTP); ``tests/test_api.py`` fails when either drifts
from it. What only code beside Redis can do is not on it: the Celery app (``Client.app``) and the
per-sample reads the report and the gateway's streams make (``Client.samples``,
:class:`evalq.producer.samples.Samples`). Importing this module loads neither client;
:func:`open_api` loads the one it opens.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import pyarrow as pa
    from datasets import Dataset

    from evalq.producer.comparison import Comparison
    from evalq.producer.policy_file import PolicyFile
    from evalq.producer.rescore import RescoreRequest
    from evalq.producer.submit import SubmitRequest
    from evalq.producer.views import Cancellation, Resumption, RunView, SamplePage, SampleQuery
    from evalq.shared.access.budget import Budget
    from evalq.shared.access.dataset import RegisteredDataset
    from evalq.shared.access.policy import Tier
    from evalq.shared.access.roles import Role, TokenRecord
    from evalq.shared.access.task import RegisteredTask
    from evalq.shared.models import Progress, RunFilter, RunMeta, SampleResult
    from evalq.shared.settings import Settings

__all__ = ["Api", "open_api"]


class Api(Protocol):
    """Submit, watch, read and administer runs as one principal, over Redis or over HTTP."""

    admin: bool
    """``--admin``: bypass tier and budget, read every tier (admins only; audited)."""

    def submit(self, request: SubmitRequest) -> RunMeta:
        """Gate a run on its split's tier and budget, then enqueue it."""
        ...

    def check_params(self, points: Sequence[SubmitRequest]) -> None:
        """Refuse (nothing charged) the first point whose params its evaluation does not
        declare: a sweep checks every point before it submits one."""
        ...

    def rescore(self, request: RescoreRequest) -> RunMeta:
        """A new run scoring a run's stored outputs with another evaluation."""
        ...

    def status(self, run_id: str) -> RunView:
        """The run's record and counters, and its aggregate where the policy allows it."""
        ...

    def stalled(self, meta: RunMeta, progress: Progress) -> str | None:
        """Why nothing moves a going run; None when it is moving or has ended."""
        ...

    def recent(
        self, limit: int = 20, owner: str | None = None, only: RunFilter | None = None
    ) -> list[RunView]:
        """The newest runs first (``owner``'s, and those ``only`` matches, when given)."""
        ...

    def progress(self, run_id: str) -> tuple[RunMeta, Progress]:
        """The run's record and counters."""
        ...

    def owner(self, run_id: str) -> str:
        """Who submitted the run."""
        ...

    def ended(self, run_id: str) -> RunMeta:
        """The record of a run that has ended; exit code 4 if it ended failed or cancelled."""
        ...

    def results(self, run_id: str, with_input: bool = False) -> Iterator[SampleResult]:
        """Per-sample results (each with its row when ``with_input``), where the policy gives
        this reader per-sample access."""
        ...

    def follow_results(self, run_id: str, with_input: bool = False) -> Iterator[SampleResult]:
        """Each sample's result as soon as it is settled, once each, until the run ends."""
        ...

    def sample_page(self, run_id: str, query: SampleQuery | None = None) -> SamplePage:
        """One page of per-sample results (filtered, searched, sorted as ``query`` says) and
        how many match, refused as :meth:`results` is; an archived run's page reads only the
        rows it holds."""
        ...

    def result_lines(self, run_id: str) -> Iterator[str]:
        """Per-sample results as JSON lines."""
        ...

    def result_tables(self, run_id: str) -> Iterator[pa.Table]:
        """Per-sample results as tables of the archive's columns."""
        ...

    def results_dataset(self, run_id: str) -> Dataset:
        """The run's per-sample results as a Hugging Face ``datasets.Dataset``."""
        ...

    def compare(self, run_ids: Sequence[str], flips: int = 10) -> Comparison:
        """Each run against the first, sample by sample."""
        ...

    def report(self, run_id: str) -> str:
        """The run's self-contained HTML report."""
        ...

    def cancel(self, run_id: str) -> Cancellation:
        """Stop a run, keep what finished, refund (once) what produced nothing."""
        ...

    def resume(self, run_id: str) -> Resumption:
        """Re-enqueue every sample without a terminal result; charges nothing."""
        ...

    def add_dataset(
        self, name: str, data: str, *, revision: str | None = None, config: str | None = None
    ) -> RegisteredDataset:
        """Register ``data`` as ``name``, each split pinned (admin; audited)."""
        ...

    def datasets(self) -> list[RegisteredDataset]:
        """Every registered dataset."""
        ...

    def add_task(
        self, name: str, text: str, *, dataset: str | None = None, split: str | None = None
    ) -> RegisteredTask:
        """Register the language task file ``text`` (YAML) as ``name`` (admin; audited), with
        the scorers of the process that registers it; with ``dataset`` and ``split``, checked
        first against that registered split's rows."""
        ...

    def tasks(self) -> list[RegisteredTask]:
        """Every registered language task."""
        ...

    def set_tier(self, dataset: str, split: str, tier: Tier) -> Tier | None:
        """Set a split's tier (admin; audited); return the one before (None if unlisted)."""
        ...

    def tiers(self) -> dict[str, dict[str, Tier]]:
        """Every listed split's tier, by dataset (unlisted splits are ``no_access``)."""
        ...

    def set_budget(
        self,
        dataset: str,
        split: str,
        *,
        runs: int | None,
        samples: int | None,
        max_samples_per_run: int | None,
        caller: str | None = None,
        tokens: int | None = None,
    ) -> Budget:
        """Replace a split's budget totals, or ``caller``'s own on it (admin; audited)."""
        ...

    def budgets(self) -> list[Budget]:
        """Every budget this caller may see."""
        ...

    def apply_policy(self, policy: PolicyFile) -> list[str]:
        """Apply a policy file (admin; checked whole first); return its warnings."""
        ...

    def create_token(self, principal: str, role: Role) -> str:
        """A new API token for ``principal`` (admin; shown once; audited)."""
        ...

    def tokens(self) -> list[TokenRecord]:
        """Every live token's principal, role and creation (admin; never the token)."""
        ...

    def revoke_tokens(self, principal: str) -> int:
        """Revoke every token of ``principal`` (admin; audited); return how many."""
        ...

    def purge(self, run_ids: Sequence[str] = (), older_than: float | None = None) -> list[str]:
        """Remove ended runs wholly (admin; audited)."""
        ...

    def audit(self, limit: int = 50) -> list[dict[str, str]]:
        """The newest ``limit`` audit entries, oldest first (admin)."""
        ...

    def close(self) -> None:
        """Close the connection."""
        ...


def open_api(settings: Settings | None = None, admin: bool = False) -> Api:
    """A :class:`evalq.producer.remote.RemoteClient` of the gateway when ``api_url`` is set
    (``redis_url`` is then never read), else a direct :class:`evalq.producer.client.Client`."""
    from evalq.shared.settings import get_settings

    settings = settings or get_settings()
    if settings.api_url:
        from evalq.producer.remote import RemoteClient

        token = settings.token.get_secret_value() if settings.token else None
        return RemoteClient(settings.api_url, token, admin)
    from evalq.producer.client import Client

    return Client(settings, admin)
