"""The client of the gateway's routes, the one the CLI and :func:`evalq.open_api` use: over HTTP
with ``EVALQ_API_URL`` and ``EVALQ_TOKEN`` set, and in direct mode to the same app built in the
command's process for the operator (:mod:`evalq.producer.clients.inprocess`); see
:func:`evalq.producer.clients.api.open_api`. Through a gateway it never reads ``EVALQ_REDIS_URL``
and never reads a row of data: the gateway resolves sample ids and counts. An error the gateway
answers becomes a
:class:`evalq.shared.errors.RemoteError` with the gateway's one line and the direct-mode exit code.
Importing it loads no Celery, kombu, Redis or pyarrow (``tests/test_api.py`` checks): the types
it only names are imported for type checking, and pyarrow when a table is asked for. The admin
answers' models (datasets, tasks, budgets, tokens) and the comparison are imported by the
methods that read them, so a read of a run loads none of the language task or dataset spec
models (``tests/test_layout.py`` checks).

::

    from evalq.producer.clients.remote import RemoteClient
    from evalq.producer.service.submit import SubmitRequest

    evalq = RemoteClient("http://127.0.0.1:8700", token)
    run = evalq.submit(SubmitRequest(eval="topic", dataset="demo", split="validation"))
"""

from __future__ import annotations

import json
import re
import time
import weakref
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import httpx
from pydantic import TypeAdapter

from evalq.producer.service.views import (
    LINE_ROWS,
    Cancellation,
    Resumption,
    RunView,
    SamplePage,
    SampleQuery,
    check_ended,
)
from evalq.shared.choices import Tier
from evalq.shared.errors import GatewayUnreachableError, InputError, RemoteError, first_line
from evalq.shared.models import Progress, RunMeta, SampleResult

if TYPE_CHECKING:
    import pyarrow as pa
    from datasets import Dataset

    from evalq.producer.service.comparison import Comparison
    from evalq.producer.service.policy_file import PolicyFile
    from evalq.producer.service.rescore import RescoreRequest
    from evalq.producer.service.submit import SubmitRequest
    from evalq.shared.access.budget import Budget
    from evalq.shared.access.dataset import RegisteredDataset
    from evalq.shared.access.roles import Role, TokenRecord
    from evalq.shared.access.task import RegisteredTask
    from evalq.shared.models import RunFilter

__all__ = ["RemoteClient"]

_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,200}")

TIMEOUT = httpx.Timeout(60.0, connect=5.0)
"""A submit reads the split on the gateway; streams have no read timeout."""
RATE_WAIT = 10.0
"""Seconds one call waits out the gateway's rate limit, in all, before it gives up (exit 3)."""


class RemoteClient:
    """Submit, watch, read and administer runs through the gateway, as the token's principal."""

    def __init__(
        self,
        url: str,
        token: str | None,
        admin: bool = False,
        *,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        """``transport``: how requests reach the gateway (None: HTTP to ``url``; direct mode's
        :class:`evalq.producer.clients.inprocess.AppTransport`: its app in this process)."""
        self.admin = admin
        token = (token or "").strip()
        if token and not _TOKEN.fullmatch(token):
            raise InputError("EVALQ_TOKEN is malformed (a token is letters, digits, '_' and '-')")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            self._http = httpx.Client(
                base_url=url.rstrip("/"), headers=headers, timeout=TIMEOUT, transport=transport
            )
        except (httpx.InvalidURL, ValueError) as exc:
            raise InputError(f"EVALQ_API_URL is not a valid URL: {first_line(exc)}") from None
        if self._http.base_url.userinfo:
            self._http.close()
            raise InputError(
                "EVALQ_API_URL holds a user or password: the gateway authenticates by "
                "EVALQ_TOKEN alone (a URL's password would replace the token, and show in "
                "messages); remove them"
            )
        self.url = str(self._http.base_url).rstrip("/")
        # a command drops its client without closing it: its connections close when it goes
        self._closing = weakref.finalize(self, self._http.close)

    def _send(self, request: httpx.Request, stream: bool = False) -> httpx.Response:
        """``request``'s answer; a rate limit (429 with ``Retry-After``) is waited out and the
        request sent again, up to :data:`RATE_WAIT` seconds in all (the gateway refuses it
        before doing anything, so sending it again is safe)."""
        waited = 0.0
        while True:
            response = self._answer(request, stream)
            if response.is_success:
                return response
            if stream:
                response.read()
                response.close()
            try:
                body = response.json()
                message, code = str(body["error"]), int(body["exit_code"])
            except (ValueError, KeyError, TypeError):
                body, message, code = {}, f"the gateway answered HTTP {response.status_code}", 1
            if response.status_code in {502, 503, 504}:  # its Redis, or a proxy before it, is down
                raise GatewayUnreachableError(message)
            wait = _retry_after(response, body) if response.status_code == 429 else None
            if wait is None or waited + wait > RATE_WAIT:
                raise RemoteError(message, code)
            time.sleep(wait)
            waited += wait

    def _answer(self, request: httpx.Request, stream: bool) -> httpx.Response:
        try:
            return self._http.send(request, stream=stream)
        except httpx.TransportError as exc:
            raise GatewayUnreachableError(
                f"cannot reach the gateway at {self.url} (EVALQ_API_URL): {first_line(exc)}"
            ) from None

    def call(self, method: str, path: str, body: Any = None, **params: Any) -> Any:
        """Any route of the gateway: its JSON answer (``body`` sent as JSON; ``params`` as the
        query, those that are None left out), or the gateway's error raised as in direct mode.
        Every method below is this call and the model its answer validates as; an operation
        with nothing to validate needs no method of its own."""
        query = {k: v for k, v in params.items() if v is not None}
        request = self._http.build_request(method, path, json=body, params=query)
        response = self._send(request, stream=True)
        try:  # a stream (events, followed results) is refused at its first line, not its end
            kind = response.headers.get("content-type", "").partition(";")[0].strip()
            if kind != "application/json":
                raise ValueError(f"its answer is {kind or 'of no content type'}")
            return json.loads(response.read())
        finally:
            response.close()

    def flag(self) -> dict[str, Any]:
        """The query that asks for ``--admin`` (none without it)."""
        return {"admin": "true"} if self.admin else {}

    def submit(self, request: SubmitRequest) -> RunMeta:
        """Submit through the gateway: it checks tier and budget and reads the split."""
        body = request.model_dump(mode="json")
        return RunMeta.model_validate(self.call("POST", "/v1/runs", body, **self.flag()))

    def check_params(self, points: Sequence[SubmitRequest]) -> None:
        """The gateway checks every point's params against its evaluation's declaration."""
        body = [point.model_dump(mode="json") for point in points]
        self.call("POST", "/v1/sweeps/check", body)

    def status(self, run_id: str) -> RunView:
        """The run as this token may see it."""
        return RunView.model_validate(self.call("GET", f"/v1/runs/{_seg(run_id)}", **self.flag()))

    def stalled(self, meta: RunMeta, progress: Progress) -> str | None:
        """Why nothing moves the run, or None (the gateway looks)."""
        return self.status(meta.run_id).stalled

    def recent(
        self, limit: int = 20, owner: str | None = None, only: RunFilter | None = None
    ) -> list[RunView]:
        """The newest runs first (a user's own; ``owner`` is the gateway's to decide)."""
        filters = {} if only is None else only.model_dump(mode="json", exclude_none=True)
        found = self.call("GET", "/v1/runs", limit=limit, **filters, **self.flag())
        return [RunView.model_validate(v) for v in found]

    def progress(self, run_id: str) -> tuple[RunMeta, Progress]:
        """The run's record and counters."""
        found = self.call("GET", f"/v1/runs/{_seg(run_id)}/progress")
        return RunMeta.model_validate(found["meta"]), Progress.model_validate(found["progress"])

    def owner(self, run_id: str) -> str:
        """Who submitted the run (a user learns it only of its own runs)."""
        return self.progress(run_id)[0].principal

    def ended(self, run_id: str) -> RunMeta:
        """The record of a run that has ended; exit code 4 if it ended failed or cancelled."""
        return check_ended(self.progress(run_id)[0])

    def results(self, run_id: str, with_input: bool = False) -> Iterator[SampleResult]:
        """Per-sample results, streamed; a refusal is raised here, before any row."""
        return self._rows(run_id, follow=False, with_input=with_input)

    def follow_results(self, run_id: str, with_input: bool = False) -> Iterator[SampleResult]:
        """Each result as it is stored, until the run ends."""
        return self._rows(run_id, follow=True, with_input=with_input)

    def sample_page(self, run_id: str, query: SampleQuery | None = None) -> SamplePage:
        """One page of per-sample results, as the gateway's policy allows."""
        params = (query or SampleQuery()).model_dump(mode="json", exclude_none=True)
        found = self.call("GET", f"/v1/runs/{_seg(run_id)}/samples", **params, **self.flag())
        return SamplePage.model_validate(found)

    def result_lines(self, run_id: str) -> Iterator[str]:
        """Per-sample results as the gateway's JSON lines, passed through unparsed."""
        response = self._send(self._results_request(run_id, False, False), stream=True)
        return _passed(response)

    def _rows(self, run_id: str, follow: bool, with_input: bool) -> Iterator[SampleResult]:
        response = self._send(self._results_request(run_id, follow, with_input), stream=True)
        return _parsed(response)

    def _results_request(self, run_id: str, follow: bool, with_input: bool) -> httpx.Request:
        params = {
            "follow": "true" if follow else "false",
            "with_input": "true" if with_input else "false",
            **self.flag(),
        }
        return self._http.build_request(
            "GET",
            f"/v1/runs/{_seg(run_id)}/results",
            params=params,
            timeout=httpx.Timeout(60.0, read=None),
        )

    def compare(self, run_ids: Sequence[str], flips: int = 10) -> Comparison:
        """Each run against the first, as the gateway's policy allows (own runs only)."""
        from evalq.producer.service.comparison import Comparison

        found = self.call("GET", "/v1/compare", run=list(run_ids), flips=flips, **self.flag())
        return Comparison.model_validate(found)

    def report(self, run_id: str) -> str:
        """The run's HTML report, rendered by the gateway."""
        request = self._http.build_request(
            "GET", f"/v1/runs/{_seg(run_id)}/report", params=self.flag()
        )
        return self._send(request).text

    def rescore(self, request: RescoreRequest) -> RunMeta:
        """Rescore a run's outputs through the gateway (a user: its own runs)."""
        body = request.model_dump(mode="json")
        return RunMeta.model_validate(self.call("POST", "/v1/rescore", body, **self.flag()))

    def cancel(self, run_id: str) -> Cancellation:
        """Cancel a run (a user: its own)."""
        return Cancellation(**self.call("POST", f"/v1/runs/{_seg(run_id)}/cancel"))

    def resume(self, run_id: str) -> Resumption:
        """Re-enqueue a run's unsettled samples (a user: its own runs)."""
        return Resumption(**self.call("POST", f"/v1/runs/{_seg(run_id)}/resume"))

    def add_dataset(
        self, name: str, data: str, *, revision: str | None = None, config: str | None = None
    ) -> RegisteredDataset:
        """Register a dataset the gateway's machine can read (admin)."""
        from evalq.shared.access.dataset import RegisteredDataset

        body = {"name": name, "data": data, "revision": revision, "config": config}
        return RegisteredDataset.model_validate(self.call("POST", "/v1/datasets", body))

    def datasets(self) -> list[RegisteredDataset]:
        """Every registered dataset."""
        from evalq.shared.access.dataset import RegisteredDataset

        found = self.call("GET", "/v1/datasets")
        return TypeAdapter(list[RegisteredDataset]).validate_python(found)

    def add_task(
        self, name: str, text: str, *, dataset: str | None = None, split: str | None = None
    ) -> RegisteredTask:
        """Register a language task file (admin), checked by the gateway (its scorers; with
        ``dataset`` and ``split``, that split's rows)."""
        from evalq.shared.access.task import RegisteredTask

        body = {"name": name, "text": text, "dataset": dataset, "split": split}
        return RegisteredTask.model_validate(self.call("POST", "/v1/tasks", body))

    def add_lm_eval_task(
        self, name: str, task: str, *, include_path: str | None = None
    ) -> RegisteredTask:
        """Register lm-eval's task ``task`` (admin), resolved and pinned by the gateway (an
        include folder on its machine, searched first)."""
        from evalq.shared.access.task import RegisteredTask

        body = {"name": name, "lm_eval": task, "include_path": include_path}
        return RegisteredTask.model_validate(self.call("POST", "/v1/tasks", body))

    def tasks(self) -> list[RegisteredTask]:
        """Every registered language task."""
        from evalq.shared.access.task import RegisteredTask

        return TypeAdapter(list[RegisteredTask]).validate_python(self.call("GET", "/v1/tasks"))

    def set_tier(self, dataset: str, split: str, tier: Tier) -> Tier | None:
        """Set a split's tier (admin); return the one before."""
        found = self.call("PUT", f"/v1/tiers/{_seg(dataset)}/{_seg(split)}", {"tier": tier.value})
        return None if found["before"] is None else Tier(found["before"])

    def tiers(self) -> dict[str, dict[str, Tier]]:
        """Every listed split's tier, by dataset."""
        found = self.call("GET", "/v1/tiers")
        return TypeAdapter(dict[str, dict[str, Tier]]).validate_python(found)

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
        """Set a split's budget totals, or ``caller``'s own on it (admin)."""
        from evalq.shared.access.budget import Budget

        body = {
            "runs": runs,
            "samples": samples,
            "max_samples_per_run": max_samples_per_run,
            "tokens": tokens,
        }
        path = f"/v1/budgets/{_seg(dataset)}/{_seg(split)}"
        return Budget.model_validate(self.call("PUT", path, body, caller=caller))

    def budgets(self) -> list[Budget]:
        """Every stored budget."""
        from evalq.shared.access.budget import Budget

        return TypeAdapter(list[Budget]).validate_python(self.call("GET", "/v1/budgets"))

    def apply_policy(self, policy: PolicyFile) -> list[str]:
        """Apply a policy file (admin); return its warnings."""
        return [str(w) for w in self.call("POST", "/v1/policy", policy.model_dump(mode="json"))]

    def create_token(self, principal: str, role: Role) -> str:
        """A new token for ``principal`` (admin)."""
        body = {"principal": principal, "role": role.value}
        return str(self.call("POST", "/v1/tokens", body)["token"])

    def tokens(self) -> list[TokenRecord]:
        """Every live token's record (admin)."""
        from evalq.shared.access.roles import TokenRecord

        return TypeAdapter(list[TokenRecord]).validate_python(self.call("GET", "/v1/tokens"))

    def revoke_tokens(self, principal: str) -> int:
        """Revoke every token of ``principal`` (admin)."""
        return int(self.call("DELETE", f"/v1/tokens/{_seg(principal)}")["revoked"])

    def audit(self, limit: int = 50) -> list[dict[str, str]]:
        """The newest audit entries (admin)."""
        return [dict(e) for e in self.call("GET", "/v1/audit", limit=limit)]

    def results_dataset(self, run_id: str) -> Dataset:
        """The run's per-sample results as a ``datasets.Dataset`` (the columns of
        :meth:`evalq.producer.service.client.Client.results_dataset`), streamed from the gateway."""
        from datasets import Dataset

        from evalq.shared.store.archive import PART_ROWS, table_of
        from evalq.shared.store.wire import as_chunks

        return Dataset(table_of(as_chunks(self.results(run_id), PART_ROWS)))

    def result_tables(self, run_id: str) -> Iterator[pa.Table]:
        """Per-sample results as tables of the archive's columns, from the gateway's lines."""
        from evalq.shared.store.wire import as_chunks

        return (chunk.table() for chunk in as_chunks(self.results(run_id), LINE_ROWS))

    def purge(self, run_ids: Sequence[str] = (), older_than: float | None = None) -> list[str]:
        """Remove ended runs wholly (admin)."""
        body = {"runs": list(run_ids), "older_than": older_than}
        return [str(r) for r in self.call("POST", "/v1/purge", body)["purged"]]

    def close(self) -> None:
        """Close the HTTP connection pool (and direct mode's app: its Redis clients)."""
        self._closing()


def _seg(part: str) -> str:
    """One path segment, percent-encoded (a ``/`` or ``..`` in a name stays inside it)."""
    return quote(part, safe="")


def _retry_after(response: httpx.Response, body: Any) -> float | None:
    """The seconds a 429 says to wait: its body's ``retry_after`` (to the millisecond), else
    its ``Retry-After`` header; None when it says neither (a cap on open streams)."""
    found = body.get("retry_after") if isinstance(body, dict) else None
    if found is None:
        found = response.headers.get("retry-after")
    try:
        return None if found is None else max(0.0, float(found))
    except ValueError:
        return None


def _passed(response: httpx.Response) -> Iterator[str]:
    """A results stream's lines; an error line (the stream's token was revoked) is raised."""
    try:
        for line in response.iter_lines():
            if line.startswith('{"error":'):
                body = json.loads(line)
                raise RemoteError(str(body["error"]), int(body["exit_code"]))
            if line:
                yield line + "\n"
    finally:
        response.close()


def _parsed(response: httpx.Response) -> Iterator[SampleResult]:
    for line in _passed(response):
        yield SampleResult.model_validate_json(line)
