"""Pages of a run's samples (``Api.sample_page``, ``GET /v1/runs/{run}/samples``): the same
slices of the same results as a whole read gives, live and archived, filtered, searched and
sorted; refused exactly as ``results`` is; an archived run's page reads only the parts that
hold it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from evalq.producer.clients.remote import RemoteClient
from evalq.producer.service.client import Client
from evalq.producer.service.submit import SubmitRequest
from evalq.producer.service.views import SamplePage, SampleQuery
from evalq.shared.access.policy import Tier
from evalq.shared.access.tiers import TierRegistry
from evalq.shared.errors import ArchiveUnreadableError, RemoteError, TierRefusedError
from evalq.shared.models import SampleResult
from evalq.shared.settings import Settings
from evalq.shared.store.archive import ArchiveReader, ArchiveWriter, Chunk
from evalq.shared.store.pages import PageQuery
from evalq.shared.store.reader import ResultReader
from tests.conftest import Stack
from tests.helpers import labelled_rows, list_splits, wait_completed, wait_for, write_rows

BUSTED = (3, 50, 51, 97)


def _rows(n: int) -> list[dict[str, object]]:
    rows = labelled_rows(n)
    for i in BUSTED:
        rows[i]["text"] = f"bust {i} " + str(rows[i]["text"]).split(" ", 2)[2]
    return rows


def _all_pages(client: Client | RemoteClient, run_id: str, **query: object) -> SamplePage:
    """Every page of a query, 7 samples at a time, joined."""
    found: list[SampleResult] = []
    total = None
    while total is None or len(found) < total:
        page = client.sample_page(
            run_id,
            SampleQuery(offset=len(found), limit=7, **query),  # type: ignore[arg-type]
        )
        total = page.total
        assert page.offset == len(found)
        if not page.samples:
            break
        found += page.samples
    return SamplePage(run_id=run_id, total=total or 0, offset=0, samples=found)


@pytest.fixture(scope="module")
def user(stack: Stack) -> Iterator[Client]:
    settings = Settings(
        redis_url=stack.server.url, archive_url=stack.settings.archive_url, principal="pages"
    )
    client = Client(settings)
    yield client
    client.close()


@pytest.mark.integration
def test_pages_of_a_live_then_archived_run_are_slices_of_its_results(
    stack: Stack, user: Client, tmp_path: Path
) -> None:
    write_rows(tmp_path / "data", "validation", labelled_rows(128))
    data = list_splits(stack.client, tmp_path / "data", "validation")
    gate = tmp_path / "gate"
    params = {"gate": str(gate), "open_until": "64"}
    run_id = user.submit(
        SubmitRequest(eval="slow", dataset=data, split="validation", params=params)
    ).run_id
    try:
        wait_for(lambda: user.status(run_id).progress.done >= 64, 60, "the first 64 samples")
        going = user.sample_page(run_id, SampleQuery(offset=60, limit=8))
        assert going.total == 128
        assert [r.sample_id for r in going.samples] == list(range(60, 68))
        assert [r.scores is not None for r in going.samples] == [True] * 4 + [False] * 4
        assert user.sample_page(run_id, SampleQuery(sort="-correct", limit=1)).total == 128
    finally:
        gate.touch()
    wait_completed(stack.client, run_id)
    wait_for(lambda: ResultReader(stack.client).archive(run_id), 60, "the archive")
    whole = list(user.results(run_id))
    assert _all_pages(user, run_id).samples == whole
    assert user.sample_page(run_id, SampleQuery(offset=60, limit=8)).samples == whole[60:68]
    assert user.sample_page(run_id, SampleQuery(offset=128)).samples == []


@pytest.mark.integration
def test_filters_search_and_sort_pick_what_the_results_hold(
    stack: Stack, user: Client, tmp_path: Path, served: tuple[str, str]
) -> None:
    write_rows(tmp_path / "data", "validation", _rows(120))
    write_rows(tmp_path / "data", "hidden", labelled_rows(20))
    data = list_splits(stack.client, tmp_path / "data", "validation")
    TierRegistry(stack.client).set(data, "hidden", Tier.NON_VIEWABLE, who="tests")
    api, token = served
    remote = RemoteClient(api, token)
    owner = Client(stack.settings.model_copy(update={"principal": "ux-user"}))
    try:
        run_id = remote.submit(SubmitRequest(eval="flaky", dataset=data, split="validation")).run_id
        hidden = remote.submit(SubmitRequest(eval="spy", dataset=data, split="hidden")).run_id
        for run in (run_id, hidden):
            wait_completed(stack.client, run)
        whole = list(owner.results(run_id))

        failed = _all_pages(owner, run_id, failed=True)
        assert [r.sample_id for r in failed.samples] == list(BUSTED)
        assert failed.total == len(BUSTED)
        assert all(r.error is not None for r in failed.samples)

        ranked = _all_pages(owner, run_id, sort="-correct").samples
        scores = [r.scores["correct"] for r in ranked if r.scores is not None]
        assert scores == sorted(scores, reverse=True)
        assert [r.sample_id for r in ranked[-len(BUSTED) :]] == list(BUSTED)  # failures last
        lowest = owner.sample_page(run_id, SampleQuery(sort="correct", limit=3)).samples
        assert [r.scores for r in lowest] == [{"correct": 0.0}] * 3

        text = '"pred":2'
        searched = _all_pages(owner, run_id, q=text).samples
        assert searched == [r for r in whole if text in json.dumps(r.output, separators=(",", ":"))]
        picked = owner.sample_page(run_id, SampleQuery(ids=[97, 4, 50], with_input=True))
        assert [r.sample_id for r in picked.samples] == [4, 50, 97]  # submission order
        assert picked.samples[0].input is not None
        assert picked.samples[0].input["label"] is not None

        # through the gateway: the same pages, and the same refusal as results
        query = SampleQuery(failed=True, sort="correct", offset=1, limit=2)
        assert remote.sample_page(run_id, query) == owner.sample_page(run_id, query)
        with pytest.raises(TierRefusedError) as direct:
            owner.sample_page(hidden)
        with pytest.raises(TierRefusedError) as streamed:
            list(owner.results(hidden))
        assert str(direct.value) == str(streamed.value)
        with pytest.raises(RemoteError) as far:
            remote.sample_page(hidden)
        assert str(far.value) == str(direct.value)
        assert far.value.exit_code == 3
    finally:
        remote.close()
        owner.close()


def _chunk(start: int, n: int) -> Chunk:
    ids = list(range(start, start + n))
    return Chunk(
        ids,
        [json.dumps(f"out {i}") for i in ids],
        [json.dumps({"m": i % 5}) for i in ids],
        [None] * n,
    )


def test_an_archived_page_reads_only_the_parts_that_hold_it(tmp_path: Path) -> None:
    """Three parts of 40 rows: a page inside the third is read with the first two gone (a
    read of the whole archive then fails), and a sort reads only its metric's column."""
    writer = ArchiveWriter(str(tmp_path / "run" / "a1"))
    for start in (0, 40, 80):
        writer.write(_chunk(start, 40))
    writer.finish({"run": "r"})
    archive = ArchiveReader(writer.url)
    page = archive.rows([95, 81, 119])
    assert page.sample_ids == [95, 81, 119]
    assert page.outputs == ['"out 95"', '"out 81"', '"out 119"']
    for part in ("part-00000.parquet", "part-00001.parquet"):
        (tmp_path / "run" / "a1" / part).unlink()
    assert archive.rows(list(range(80, 90))).sample_ids == list(range(80, 90))
    with pytest.raises(ArchiveUnreadableError):
        archive.rows([5])
    query = PageQuery(sort="-m")
    assert query.columns() == ("sample_id", "score.m")
    assert PageQuery(failed=True, q="x").columns() == ("sample_id", "error", "output", "scores")
