"""The gateway's runs: submit (one, a sweep's check, a rescore), list, read, cancel, resume and
purge them."""

from typing import Annotated

from fastapi import APIRouter, Body, Query
from pydantic import BaseModel, ConfigDict, Field

from evalq.producer.gateway.acting import Act
from evalq.producer.gateway.params import AdminQuery, RunId, RunIdText
from evalq.producer.service.rescore import RescoreRequest
from evalq.producer.service.submit import SubmitRequest
from evalq.producer.service.sweep import MAX_GRID
from evalq.producer.service.views import Cancellation, Resumption, RunView
from evalq.shared.access.roles import Role
from evalq.shared.models import Progress, RunFilter, RunMeta

__all__ = ["router"]

router = APIRouter(tags=["runs"])


class RunProgress(BaseModel):
    """A run's record and counters (what ``watch`` polls)."""

    meta: RunMeta
    progress: Progress


class PurgeRequest(BaseModel):
    """``POST /v1/purge``: the runs named, and those submitted more than ``older_than``
    seconds ago."""

    model_config = ConfigDict(extra="forbid")

    runs: list[RunIdText] = Field(default_factory=list, max_length=1000)
    older_than: float | None = Field(default=None, gt=0)


class Purged(BaseModel):
    purged: list[str]


@router.post("/v1/runs", response_model=RunMeta)
def submit(request: SubmitRequest, act: Act, admin: AdminQuery = False) -> RunMeta:
    """Submit a run of a registered dataset's split (``data``: admins only)."""
    return act.client(admin).submit(request)


@router.post("/v1/sweeps/check")
def check_sweep(
    points: Annotated[list[SubmitRequest], Body(max_length=MAX_GRID)], act: Act
) -> dict[str, int]:
    """Check a sweep's points' params against their evaluations' declarations before
    any is submitted (400 naming the declared parameters; nothing is charged)."""
    act.client().check_params(points)
    return {"points": len(points)}


@router.post("/v1/rescore", response_model=RunMeta)
def rescore(request: RescoreRequest, act: Act, admin: AdminQuery = False) -> RunMeta:
    """A new run scoring a completed run's stored outputs with another evaluation (a
    user: its own runs; gated and charged like a submit)."""
    return act.owned(request.run, admin=admin).rescore(request)


@router.get("/v1/runs", response_model=list[RunView])
def runs(
    act: Act,
    only: Annotated[RunFilter, Query()],
    limit: Annotated[int, Query(ge=1, le=1000)] = 20,
    admin: AdminQuery = False,
) -> list[RunView]:
    """The newest runs first: a user's own, every run for an admin; ``eval``, ``dataset``,
    ``sweep``, ``tag`` and ``status`` keep only the runs that match."""
    owner = None if act.who.role is Role.ADMIN else act.who.principal
    return act.client(admin).recent(limit, owner, only)


@router.get("/v1/runs/counts", response_model=dict[str, int])
def run_counts(
    act: Act, only: Annotated[RunFilter, Query()], admin: AdminQuery = False
) -> dict[str, int]:
    """How many runs are in each status: a user's own, every run for an admin (``principal``
    keeps one's); ``eval``, ``dataset``, ``sweep``, ``tag``, ``model`` and ``split`` filter as
    for the list."""
    owner = None if act.who.role is Role.ADMIN else act.who.principal
    return act.client(admin).run_counts(owner, only)


@router.get("/v1/runs/{run_id}", response_model=RunView)
def status(run_id: RunId, act: Act, admin: AdminQuery = False) -> RunView:
    """A run's status, counts and aggregate (as its split's tier allows)."""
    return act.owned(run_id, admin=admin).status(run_id)


@router.get("/v1/runs/{run_id}/progress", response_model=RunProgress)
def progress(run_id: RunId, act: Act) -> RunProgress:
    """A run's record and counters (counts only)."""
    meta, counts = act.owned(run_id).progress(run_id)
    return RunProgress(meta=meta, progress=counts)


@router.post("/v1/runs/{run_id}/cancel", response_model=Cancellation)
def cancel(run_id: RunId, act: Act) -> Cancellation:
    """Cancel a run (a user: its own): keep what finished, refund what produced nothing."""
    return act.owned(run_id).cancel(run_id)


@router.post("/v1/runs/{run_id}/resume", response_model=Resumption)
def resume(run_id: RunId, act: Act) -> Resumption:
    """Re-enqueue the samples without a terminal result (a user: its own runs)."""
    return act.owned(run_id).resume(run_id)


@router.post("/v1/purge", response_model=Purged)
def purge(body: PurgeRequest, act: Act) -> Purged:
    """Remove ended runs wholly: record, results, archive (admin; audited)."""
    return Purged(purged=act.admin("purge").purge(body.runs, body.older_than))
