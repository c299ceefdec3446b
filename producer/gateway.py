"""The gateway (``evalq serve``): the HTTP door for callers who are not operators.

It holds the Redis credential and reads the data; a caller holds an API token, and the token
alone says who the caller is (:class:`shared.policy.Caller`). Every route hands the work to a
:class:`producer.client.Client` acting for that principal, so the gateway applies exactly the
rules direct mode does (tiers, floors, budgets: :mod:`shared.policy`), plus the role and
ownership rules of :mod:`shared.policy` that only a gateway can enforce. A refusal (a bad token,
a missing role, a tier, a budget) answers one line and is appended to the audit stream.

Errors answer ``{"error": "<one line>", "exit_code": N}`` with the exit code the CLI would have
exited with in direct mode; :class:`producer.remote.RemoteClient` turns them back into that.
"""

# No ``from __future__ import annotations`` here: FastAPI reads the routes' annotations at run
# time, and ``Who`` is local to create_gateway.
import logging
import re
from typing import Annotated

import redis
from fastapi import Depends, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from producer.client import Cancellation, Client, Resumption, RunView
from producer.comparison import Comparison
from producer.policy_file import BudgetLimits, PolicyFile
from producer.rescore import RescoreRequest
from producer.submit import SubmitRequest
from shared.audit import audit_refusal
from shared.celery_app import create_app
from shared.connection import connect
from shared.errors import (
    EvalqError,
    InputError,
    PolicyRefusedError,
    StoreError,
    UnauthorizedError,
    UnknownRunError,
)
from shared.evaluation import load_plugins
from shared.ledger import Budget
from shared.models import Progress, RunMeta
from shared.policy import (
    Caller,
    Role,
    Tier,
    admit_admin_flag,
    admit_owner,
    require_admin,
    sees_sources,
)
from shared.registry import RegisteredDataset
from shared.results import result_line
from shared.runs import RunFilter
from shared.settings import Settings
from shared.tokens import TokenRecord, TokenStore

__all__ = ["create_gateway"]

log = logging.getLogger("evalq.gateway")

RunId = Annotated[str, Path(pattern=r"^[0-9a-f]{1,64}$", description="A run id.")]
RunIdText = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{1,64}$")]
_PATH = re.compile(r"(?<![\w.:-])/[^\s'\"]+")
"""An absolute path in an error message: a data source's, which only admins see (the gateway
logs the message whole)."""
RunIdItem = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{1,64}$")]
AdminQuery = Annotated[
    bool, Query(description="Bypass tier and budget (admin role; recorded in the audit stream).")
]
NameArg = Annotated[str, Path(max_length=64, description="A dataset, split or principal name.")]


class RunProgress(BaseModel):
    """A run's record and counters (what ``watch`` polls)."""

    meta: RunMeta
    progress: Progress


class TierChange(BaseModel):
    """``PUT /v1/tiers/{dataset}/{split}``."""

    model_config = ConfigDict(extra="forbid")

    tier: Tier


class TierBefore(BaseModel):
    before: Tier | None
    """The split's tier before (None: it was unlisted)."""


class DatasetAdd(BaseModel):
    """``POST /v1/datasets``."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=64)
    data: str = Field(min_length=1, max_length=4096)
    revision: str | None = Field(default=None, max_length=200)
    config: str | None = Field(default=None, max_length=200)


class TokenCreate(BaseModel):
    """``POST /v1/tokens``."""

    model_config = ConfigDict(extra="forbid")

    principal: str = Field(max_length=64)
    role: Role


class NewToken(BaseModel):
    principal: str
    role: Role
    token: str
    """Shown once; only its sha256 is stored."""


class Revoked(BaseModel):
    revoked: int


class PurgeRequest(BaseModel):
    """``POST /v1/purge``: the runs named, and those submitted more than ``older_than``
    seconds ago."""

    model_config = ConfigDict(extra="forbid")

    runs: list[RunIdText] = Field(default_factory=list, max_length=1000)
    older_than: float | None = Field(default=None, gt=0)


class Purged(BaseModel):
    purged: list[str]


class ErrorBody(BaseModel):
    error: str
    """One line for a person."""
    exit_code: int
    """What the CLI exits with."""


def _status_of(exc: EvalqError) -> int:
    if isinstance(exc, UnauthorizedError):
        return 401
    if isinstance(exc, PolicyRefusedError):
        return 403
    if isinstance(exc, UnknownRunError):
        return 404
    if isinstance(exc, InputError):
        return 400
    if isinstance(exc, StoreError):
        return 503
    return 409


def _error(message: str, code: int, status: int) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse({"error": message, "exit_code": code}, status_code=status, headers=headers)


def _validation_message(exc: RequestValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first.get("loc", ()))
    message = str(first.get("msg", "invalid")).removeprefix("Value error, ")
    return f"invalid request: {where}: {message}"


def create_gateway(settings: Settings) -> FastAPI:  # noqa: PLR0915 - one closure per route
    """The gateway's FastAPI app, talking to Redis with ``settings.redis_url``."""
    store = connect(settings.redis_url)
    load_plugins(settings.plugins)
    celery = create_app(settings)
    tokens = TokenStore(store)
    bearer = HTTPBearer(auto_error=False, description="An API token: evalq tokens create")
    api = FastAPI(
        title="evalq gateway",
        summary="Submit, watch and read evaluation runs within the split tiers.",
        version="1",
        responses={
            401: {"model": ErrorBody, "description": "No token, or an unknown one"},
            403: {"model": ErrorBody, "description": "Refused by role, tier or budget"},
            422: {"model": ErrorBody, "description": "Invalid request"},
        },
    )

    def caller(
        request: Request,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ) -> Caller:
        if credentials is None:
            raise UnauthorizedError("unauthorized: no token (set EVALQ_TOKEN)")
        found = tokens.caller(credentials.credentials)
        if found is None:
            raise UnauthorizedError("unauthorized: unknown or revoked token")
        request.state.principal = found.principal
        request.state.sees_sources = sees_sources(found)
        return found

    Who = Annotated[Caller, Depends(caller)]

    def client(who: Caller, admin: bool = False) -> Client:
        admitted = admit_admin_flag(who, admin)
        return Client(
            settings, admitted, principal=who.principal, client=store, app=celery,
            sees_sources=sees_sources(who),
        )  # fmt: skip

    def owned(who: Caller, run_id: str, admin: bool = False) -> Client:
        acting = client(who, admin)
        admit_owner(who, run_id, acting.owner(run_id))
        return acting

    def admin_client(who: Caller, what: str) -> Client:
        require_admin(who, what)
        return client(who)

    @api.exception_handler(EvalqError)
    def _evalq_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, EvalqError)
        if isinstance(exc, PolicyRefusedError):
            who = getattr(request.state, "principal", "anonymous")
            audit_refusal(store, who, f"{request.method} {request.url.path}", str(exc))
        message = str(exc)
        if not getattr(request.state, "sees_sources", False):
            hidden = _PATH.sub("<path>", message)
            if hidden != message:
                log.warning("%s %s: %s", request.method, request.url.path, message)
            message = hidden
        return _error(message, exc.exit_code, _status_of(exc))

    @api.exception_handler(RequestValidationError)
    def _invalid(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return _error(_validation_message(exc), InputError.exit_code, 422)

    @api.exception_handler(redis.RedisError)
    def _redis_down(request: Request, exc: Exception) -> JSONResponse:
        log.warning("redis error on %s %s: %s", request.method, request.url.path, exc)
        return _error("the gateway cannot reach its Redis; try again", 1, 503)

    @api.post("/v1/runs", response_model=RunMeta, tags=["runs"])
    def submit(request: SubmitRequest, who: Who, admin: AdminQuery = False) -> RunMeta:
        """Submit a run of a registered dataset's split (``data``: admins only)."""
        return client(who, admin).submit(request)

    @api.post("/v1/rescore", response_model=RunMeta, tags=["runs"])
    def rescore(request: RescoreRequest, who: Who, admin: AdminQuery = False) -> RunMeta:
        """A new run scoring a completed run's stored outputs with another evaluation (a
        user: its own runs; gated and charged like a submit)."""
        return owned(who, request.run, admin).rescore(request)

    @api.get("/v1/runs", response_model=list[RunView], tags=["runs"])
    def runs(
        who: Who,
        only: Annotated[RunFilter, Query()],
        limit: Annotated[int, Query(ge=1, le=1000)] = 20,
        admin: AdminQuery = False,
    ) -> list[RunView]:
        """The newest runs first: a user's own, every run for an admin; ``eval``, ``dataset``,
        ``sweep``, ``tag`` and ``status`` keep only the runs that match."""
        owner = None if who.role is Role.ADMIN else who.principal
        return client(who, admin).recent(limit, owner, only)

    @api.get("/v1/runs/{run_id}", response_model=RunView, tags=["runs"])
    def status(run_id: RunId, who: Who, admin: AdminQuery = False) -> RunView:
        """A run's status, counts and aggregate (as its split's tier allows)."""
        return owned(who, run_id, admin).status(run_id)

    @api.get("/v1/runs/{run_id}/progress", response_model=RunProgress, tags=["runs"])
    def progress(run_id: RunId, who: Who) -> RunProgress:
        """A run's record and counters (counts only)."""
        meta, counts = owned(who, run_id).progress(run_id)
        return RunProgress(meta=meta, progress=counts)

    @api.get(
        "/v1/runs/{run_id}/results",
        tags=["runs"],
        response_class=StreamingResponse,
        responses={200: {"content": {"application/x-ndjson": {}}}},
    )
    def results(
        run_id: RunId,
        who: Who,
        follow: bool = False,
        with_input: bool = False,
        admin: AdminQuery = False,
    ) -> StreamingResponse:
        """Per-sample results as JSON lines (viewable splits; admins see all, audited);
        ``follow`` streams each as it is stored until the run ends; ``with_input`` adds each
        sample's row (the gateway reads the data)."""
        acting = owned(who, run_id, admin)
        if not follow and not with_input:
            lines = acting.result_lines(run_id)
            return StreamingResponse(lines, media_type="application/x-ndjson")
        rows = (
            acting.follow_results(run_id, with_input=with_input)
            if follow
            else acting.results(run_id, with_input=with_input)
        )
        return StreamingResponse(map(result_line, rows), media_type="application/x-ndjson")

    @api.get("/v1/compare", response_model=Comparison, tags=["runs"])
    def compare(
        who: Who,
        run: Annotated[list[RunIdItem], Query(min_length=2, max_length=32)],
        flips: Annotated[int, Query(ge=0, le=1000)] = 10,
        admin: AdminQuery = False,
    ) -> Comparison:
        """Each run against the first, sample by sample (``run`` repeated: a user's own runs of
        viewable splits; admins any, audited)."""
        acting = client(who, admin)
        for run_id in run:
            admit_owner(who, run_id, acting.owner(run_id))
        return acting.compare(run, flips)

    @api.get("/v1/runs/{run_id}/report", response_class=HTMLResponse, tags=["runs"])
    def report(run_id: RunId, who: Who, admin: AdminQuery = False) -> HTMLResponse:
        """A self-contained HTML report (charts as the split's tier allows)."""
        return HTMLResponse(owned(who, run_id, admin).report(run_id))

    @api.post("/v1/runs/{run_id}/cancel", response_model=Cancellation, tags=["runs"])
    def cancel(run_id: RunId, who: Who) -> Cancellation:
        """Cancel a run (a user: its own): keep what finished, refund what produced nothing."""
        return owned(who, run_id).cancel(run_id)

    @api.post("/v1/runs/{run_id}/resume", response_model=Resumption, tags=["runs"])
    def resume(run_id: RunId, who: Who) -> Resumption:
        """Re-enqueue the samples without a terminal result (a user: its own runs)."""
        return owned(who, run_id).resume(run_id)

    @api.get("/v1/datasets", response_model=list[RegisteredDataset], tags=["datasets"])
    def datasets(who: Who) -> list[RegisteredDataset]:
        """Every registered dataset and its pinned splits (a user: names and splits only)."""
        found = client(who).datasets()
        return found if sees_sources(who) else [record.outline() for record in found]

    @api.post("/v1/datasets", response_model=RegisteredDataset, tags=["datasets"])
    def add_dataset(body: DatasetAdd, who: Who) -> RegisteredDataset:
        """Register (or re-pin) a dataset (admin)."""
        acting = admin_client(who, "datasets add")
        return acting.add_dataset(body.name, body.data, revision=body.revision, config=body.config)

    @api.get("/v1/tiers", response_model=dict[str, dict[str, Tier]], tags=["policy"])
    def tiers(who: Who) -> dict[str, dict[str, Tier]]:
        """Every listed split's tier (unlisted splits are no_access)."""
        return client(who).tiers()

    @api.put("/v1/tiers/{dataset}/{split}", response_model=TierBefore, tags=["policy"])
    def set_tier(dataset: NameArg, split: NameArg, body: TierChange, who: Who) -> TierBefore:
        """Set a split's tier (admin; audited)."""
        return TierBefore(before=admin_client(who, "tiers set").set_tier(dataset, split, body.tier))

    @api.get("/v1/budgets", response_model=list[Budget], tags=["policy"])
    def budgets(who: Who) -> list[Budget]:
        """Every budget: totals and used."""
        return client(who).budgets()

    @api.put("/v1/budgets/{dataset}/{split}", response_model=Budget, tags=["policy"])
    def set_budget(
        dataset: NameArg,
        split: NameArg,
        body: BudgetLimits,
        who: Who,
        caller: Annotated[str | None, Query(max_length=64)] = None,
    ) -> Budget:
        """Set a split's budget totals, or one caller's on it (admin; audited); what was used
        is kept."""
        return admin_client(who, "budget set").set_budget(
            dataset,
            split,
            runs=body.runs,
            samples=body.samples,
            max_samples_per_run=body.max_samples_per_run,
            caller=caller,
        )

    @api.post("/v1/policy", response_model=list[str], tags=["policy"])
    def apply_policy(body: PolicyFile, who: Who) -> list[str]:
        """Apply tiers and budgets (admin; checked whole first); returns its warnings."""
        return admin_client(who, "policy apply").apply_policy(body)

    @api.get("/v1/tokens", response_model=list[TokenRecord], tags=["tokens"])
    def list_tokens(who: Who) -> list[TokenRecord]:
        """Every live token's principal and role (admin; never a token)."""
        return admin_client(who, "tokens list").tokens()

    @api.post("/v1/tokens", response_model=NewToken, tags=["tokens"])
    def create_token(body: TokenCreate, who: Who) -> NewToken:
        """A new token (admin; audited); shown once."""
        token = admin_client(who, "tokens create").create_token(body.principal, body.role)
        return NewToken(principal=body.principal, role=body.role, token=token)

    @api.delete("/v1/tokens/{principal}", response_model=Revoked, tags=["tokens"])
    def revoke_tokens(principal: NameArg, who: Who) -> Revoked:
        """Revoke every token of a principal (admin; audited)."""
        return Revoked(revoked=admin_client(who, "tokens revoke").revoke_tokens(principal))

    @api.post("/v1/purge", response_model=Purged, tags=["runs"])
    def purge(body: PurgeRequest, who: Who) -> Purged:
        """Remove ended runs wholly: record, results, archive (admin; audited)."""
        return Purged(purged=admin_client(who, "purge").purge(body.runs, body.older_than))

    @api.get("/v1/audit", response_model=list[dict[str, str]], tags=["policy"])
    def audit(who: Who, limit: Annotated[int, Query(ge=1, le=10_000)] = 50) -> list[dict[str, str]]:
        """The newest audit entries, oldest first (admin)."""
        return admin_client(who, "audit").audit(limit)

    return api
