"""The gateway (``evalq serve``): the HTTP door for callers who are not operators.

It holds the Redis credential and reads the data; a caller holds an API token, and the token
alone says who the caller is (:class:`shared.access.roles.Caller`). Every route hands the work to
a :class:`producer.client.Client` acting for that principal, so the gateway applies exactly the
rules direct mode does (tiers, floors, budgets: :mod:`shared.access.policy`), plus the role and
ownership rules of :mod:`shared.access.roles` that only a gateway can enforce. A refusal (a bad
token, a missing role, a tier, a budget) answers one line and is appended to the audit stream.

Errors answer ``{"error": "<one line>", "exit_code": N}`` with the exit code the CLI would have
exited with in direct mode; :class:`producer.remote.RemoteClient` turns them back into that.
"""

# No ``from __future__ import annotations`` here: FastAPI reads the routes' annotations at run
# time, and ``Who`` is local to create_gateway.
import logging
import math
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Annotated

import redis
from fastapi import Body, Depends, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field, StringConstraints
from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import Scope

from producer.client import Client
from producer.comparison import Comparison
from producer.limits import BodyLimit, RateLimiter, StreamSlots, TokenFirst
from producer.policy_file import BudgetLimits, PolicyFile
from producer.rescore import RescoreRequest
from producer.retainer import Retainer
from producer.streams import ResultStream, Streams
from producer.submit import SubmitRequest
from producer.sweep import MAX_GRID
from producer.views import Cancellation, Resumption, RunView
from shared.access.budget import Budget
from shared.access.dataset import RegisteredDataset
from shared.access.policy import Tier
from shared.access.roles import (
    Caller,
    Role,
    TokenRecord,
    admit_admin_flag,
    admit_owner,
    require_admin,
    sees_budget,
    sees_sources,
)
from shared.access.tokens import TokenLookup
from shared.connection import connect, connect_async
from shared.errors import (
    EvalqError,
    InputError,
    PolicyRefusedError,
    StoreError,
    ThrottledError,
    UnauthorizedError,
    UnknownEvalError,
    UnknownRunError,
)
from shared.evaluation import load_plugins
from shared.models import Progress, RunMeta
from shared.names import RUN_ID
from shared.queue.celery_app import create_app
from shared.settings import Settings
from shared.store.audit import audit_refusal
from shared.store.results import result_line
from shared.store.runs import RunFilter

__all__ = ["create_gateway"]

log = logging.getLogger("evalq.gateway")

RunId = Annotated[str, Path(pattern=RUN_ID, description="A run id.")]
RunIdText = Annotated[str, StringConstraints(pattern=RUN_ID)]
_PATH = re.compile(r"(?<![\w.:-])/[^\s'\"]+")
"""An absolute path in an error message: a data source's, which only admins see (the gateway
logs the message whole)."""
RunIdItem = Annotated[str, StringConstraints(pattern=RUN_ID)]
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
    retry_after: float | None = None
    """429 only: seconds after which the same request would be admitted (the ``Retry-After``
    header rounds it up to whole seconds); absent when a stream cap refused."""


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


def _throttled(exc: ThrottledError) -> JSONResponse:
    body: dict[str, object] = {"error": str(exc), "exit_code": exc.exit_code}
    headers = None
    if exc.retry_after is not None:
        body["retry_after"] = round(exc.retry_after, 3)
        headers = {"Retry-After": str(max(1, math.ceil(exc.retry_after)))}
    return JSONResponse(body, status_code=429, headers=headers)


def _unknown_run(exc: RequestValidationError) -> str | None:
    """``no run 'X'`` when the request names a run by something that cannot be a run id (a
    path's ``run_id``, a ``run`` query or body field): no run has it, whatever its shape."""
    first = exc.errors()[0]
    named = [part for part in first.get("loc", ()) if isinstance(part, str)]
    if first.get("type") == "string_pattern_mismatch" and named[-1:] in (["run_id"], ["run"]):
        return f"no run '{first.get('input')}'"
    return None


def _validation_message(exc: RequestValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first.get("loc", ()))
    message = str(first.get("msg", "invalid")).removeprefix("Value error, ")
    return f"invalid request: {where}: {message}"


def create_gateway(settings: Settings) -> FastAPI:  # noqa: PLR0915 - one closure per route
    """The gateway's FastAPI app, talking to Redis with ``settings.redis_url``."""
    store = connect(settings.redis_url)
    # a connection per open stream (its XREAD BLOCK), and some for the token look-ups
    waits = connect_async(settings.redis_url, max_connections=settings.gateway_streams + 64)
    load_plugins(settings.plugins)
    celery = create_app(settings)
    lookup = TokenLookup(waits)
    limiter = RateLimiter(settings.gateway_burst)
    streams = Streams(
        StreamSlots(settings.gateway_streams_per_principal, settings.gateway_streams), waits
    )
    bearer = HTTPBearer(auto_error=False, description="An API token: evalq tokens create")
    working = StreamSlots(
        settings.gateway_inflight, 2**31,
        ("too many requests", "requests in flight", "wait for one to finish"),
    )  # fmt: skip

    def too_large() -> JSONResponse:
        message = (
            f"request body too large: the gateway takes at most {settings.gateway_max_body} bytes"
        )
        return _error(message, InputError.exit_code, 413)

    retainer = Retainer(store, settings)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        retainer.start()
        yield
        retainer.stop()
        await waits.aclose()

    api = FastAPI(
        title="evalq gateway",
        summary="Submit, watch and read evaluation runs within the split tiers.",
        version="1",
        responses={
            401: {"model": ErrorBody, "description": "No token, or an unknown one"},
            403: {"model": ErrorBody, "description": "Refused by role, tier or budget"},
            413: {"model": ErrorBody, "description": "A request body over the gateway's limit"},
            422: {"model": ErrorBody, "description": "Invalid request"},
            429: {"model": ErrorBody, "description": "Too many requests or open streams"},
        },
        lifespan=lifespan,
    )

    async def identify(token: str | None, address: str) -> tuple[Caller, str]:
        """Who ``token`` stands for, and its digest; a caller without a known token is held
        to the anonymous rate of its ``address`` (:class:`ThrottledError`), then refused
        (:class:`UnauthorizedError`). On the event loop: a refused request takes no thread."""
        found = None if token is None else await lookup.caller(token)
        if found is None:
            admit(("anonymous", address), settings.gateway_rate, f"anonymous caller {address}")
            if token is None:
                raise UnauthorizedError("unauthorized: no token (set EVALQ_TOKEN)")
            raise UnauthorizedError("unauthorized: unknown or revoked token")
        return found

    async def token_first(scope: Scope) -> Response | None:
        """A request with a body: its caller first (a 401, or the anonymous rate limit's 429,
        before the body is read); a known one is kept for the route's ``caller``."""
        scheme, _, token = Headers(scope=scope).get("authorization", "").partition(" ")
        given = token.strip() if scheme.lower() == "bearer" and token.strip() else None
        client = scope.get("client")
        try:
            found = await identify(given, client[0] if client else "unknown")
        except ThrottledError as exc:
            return _throttled(exc)
        except UnauthorizedError as exc:
            audit_refusal(store, "anonymous", f"{scope['method']} {scope['path']}", str(exc))
            return _error(str(exc), exc.exit_code, 401)
        scope.setdefault("state", {})["identified"] = found
        return None

    api.add_middleware(TokenFirst, check=token_first)
    api.add_middleware(BodyLimit, limit=settings.gateway_max_body, refusal=too_large)  # outer

    def admit(key: tuple[str, str], rate: float, who: str) -> None:
        wait = limiter.admit(key, rate)
        if wait is not None:
            raise ThrottledError(
                f"rate limited: {who} sent more than {rate:g} requests a second (at most "
                f"{limiter.size(rate):g} at once); try again in {wait:.1f} s",
                retry_after=wait,
            )

    async def caller(
        request: Request,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ) -> AsyncIterator[Caller]:
        # on the event loop, before the request takes a thread: a refused one never does
        found = getattr(request.state, "identified", None)  # TokenFirst's, for a body's
        if found is None:
            token = None if credentials is None else credentials.credentials
            address = request.client.host if request.client else "unknown"
            found = await identify(token, address)
        who, digest = found
        request.state.principal = who.principal
        request.state.sees_sources = sees_sources(who)
        request.state.token = digest
        rate = settings.gateway_admin_rate if who.role is Role.ADMIN else settings.gateway_rate
        admit(("principal", who.principal), rate, who.principal)
        give_back = working.take(who.principal)  # held while its route works
        request.state.working = give_back  # a results stream gives it back at once (it holds
        try:  # a stream slot of its own instead)
            yield who
        finally:
            give_back()

    Who = Annotated[Caller, Depends(caller, scope="function")]

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
        message = exc.on("the gateway") if isinstance(exc, UnknownEvalError) else str(exc)
        if not getattr(request.state, "sees_sources", False):
            hidden = _PATH.sub("<path>", message)
            if hidden != message:
                log.warning("%s %s: %s", request.method, request.url.path, message)
            message = hidden
        return _error(message, exc.exit_code, _status_of(exc))

    @api.exception_handler(ThrottledError)
    async def _too_many(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ThrottledError)
        return _throttled(exc)  # not audited: a flood of them would grow the audit stream

    @api.exception_handler(RequestValidationError)
    def _invalid(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        unknown = _unknown_run(exc)
        if unknown is not None:
            return _error(unknown, UnknownRunError.exit_code, 404)
        return _error(_validation_message(exc), InputError.exit_code, 422)

    @api.exception_handler(redis.RedisError)
    def _redis_down(request: Request, exc: Exception) -> JSONResponse:
        log.warning("redis error on %s %s: %s", request.method, request.url.path, exc)
        return _error("the gateway cannot reach its Redis; try again", 1, 503)

    @api.post("/v1/runs", response_model=RunMeta, tags=["runs"])
    def submit(request: SubmitRequest, who: Who, admin: AdminQuery = False) -> RunMeta:
        """Submit a run of a registered dataset's split (``data``: admins only)."""
        return client(who, admin).submit(request)

    @api.post("/v1/sweeps/check", tags=["runs"])
    def check_sweep(
        points: Annotated[list[SubmitRequest], Body(max_length=MAX_GRID)], who: Who
    ) -> dict[str, int]:
        """Check a sweep's points' params against their evaluations' declarations before
        any is submitted (400 naming the declared parameters; nothing is charged)."""
        client(who, False).check_params(points)
        return {"points": len(points)}

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
    async def results(
        run_id: RunId,
        who: Who,
        request: Request,
        *,
        follow: bool = False,
        with_input: bool = False,
        admin: AdminQuery = False,
    ) -> StreamingResponse:
        """Per-sample results as JSON lines (viewable splits; admins see all, audited);
        ``follow`` streams each as it is stored until the run ends; ``with_input`` adds each
        sample's row (the gateway reads the data). A principal holds at most
        ``EVALQ_GATEWAY_STREAMS_PER_PRINCIPAL`` of these streams open at once (429 beyond)."""
        request.state.working()
        give_back = streams.slots.take(who.principal)
        try:
            acting = await streams.run(lambda: owned(who, run_id, admin))
            if follow:
                follower = await streams.run(lambda: acting.samples.follower(run_id, with_input))
                lines = streams.follow(follower, partial(lookup.live, request.state.token))
            else:
                lines = streams.lines(await streams.run(lambda: _lines(acting, run_id, with_input)))
        except BaseException:
            give_back()
            raise
        return ResultStream(lines, give_back)

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
        """The budgets this caller may see, totals and used: an admin every one; a user the
        splits' own (shared by every caller on them) and its own, never another principal's."""
        return [b for b in client(who).budgets() if sees_budget(who, b.caller)]

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


def _lines(acting: Client, run_id: str, with_input: bool) -> Iterator[str]:
    """The run's results as JSON lines: straight from the stored texts, or with each row."""
    if not with_input:
        return acting.result_lines(run_id)
    return map(result_line, acting.results(run_id, with_input=True))
