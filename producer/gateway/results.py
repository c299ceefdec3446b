"""The gateway's reads of runs' per-sample results: the results stream (followed or not), the
comparison of runs sample by sample, and a run's HTML report."""

from collections.abc import Iterator
from functools import partial
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, StreamingResponse

from evalq.producer.gateway.acting import Act
from evalq.producer.gateway.context import Shared
from evalq.producer.gateway.params import AdminQuery, RunId, RunIdText
from evalq.producer.gateway.streams import ResultStream
from evalq.producer.service.client import Client
from evalq.producer.service.comparison import Comparison
from evalq.producer.service.sweep import MAX_GRID
from evalq.producer.service.views import SamplePage, SampleQuery
from evalq.shared.store.wire import result_line

__all__ = ["router"]

router = APIRouter(tags=["runs"])


@router.get(
    "/v1/runs/{run_id}/results",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/x-ndjson": {}}}},
)
async def results(
    run_id: RunId,
    act: Act,
    context: Shared,
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
    streams = context.streams
    give_back = streams.slots.take(act.who.principal)
    try:
        acting = await streams.run(lambda: act.owned(run_id, admin=admin))
        if follow:
            follower = await streams.run(lambda: acting.samples.follower(run_id, with_input))
            lines = streams.follow(follower, partial(context.live, request.state.token))
        else:
            lines = streams.lines(await streams.run(lambda: _lines(acting, run_id, with_input)))
    except BaseException:
        give_back()
        raise
    return ResultStream(lines, give_back)


@router.get("/v1/runs/{run_id}/samples", response_model=SamplePage)
def samples(
    run_id: RunId,
    act: Act,
    query: Annotated[SampleQuery, Query()],
    admin: AdminQuery = False,
) -> SamplePage:
    """One page of per-sample results and how many match: ``failed`` keeps the failures,
    ``q`` the samples whose output, scores or error hold a text, ``sort`` orders by a metric
    (``-metric``: highest first), ``ids`` names samples, ``with_input`` adds each row (the
    gateway reads the data). Refused exactly as ``results`` is; an archived run's page reads
    only the rows it shows (a filter or a sort, only the columns it needs)."""
    return act.owned(run_id, admin=admin).sample_page(run_id, query)


def _lines(acting: Client, run_id: str, with_input: bool) -> Iterator[str]:
    """The run's results as JSON lines: straight from the stored texts, or with each row."""
    if not with_input:
        return acting.result_lines(run_id)
    return map(result_line, acting.results(run_id, with_input=True))


@router.get("/v1/compare", response_model=Comparison)
def compare(
    act: Act,
    run: Annotated[list[RunIdText], Query(min_length=1, max_length=MAX_GRID)],
    flips: Annotated[int, Query(ge=0, le=1000)] = 10,
    admin: AdminQuery = False,
) -> Comparison:
    """Each run against the first, sample by sample (``run`` repeated, as many as a sweep has
    points: a user's own runs of viewable splits; admins any, audited)."""
    return act.owned(*run, admin=admin).compare(run, flips)


@router.get("/v1/runs/{run_id}/report", response_class=HTMLResponse)
def report(run_id: RunId, act: Act, admin: AdminQuery = False) -> HTMLResponse:
    """A self-contained HTML report (charts as the split's tier allows), under a policy that
    lets it run nothing (its charts are inline SVG, its style one inline sheet)."""
    from evalq.producer.reports.page import (
        render,  # the report's and charts' modules: its reads only
    )

    page = render(act.owned(run_id, admin=admin).report(run_id))
    return HTMLResponse(page, headers=REPORT_HEADERS)


REPORT_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; "
        "form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
"""The report is the caller's data on the gateway's origin: it may run no script."""
