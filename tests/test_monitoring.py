"""Monitoring: Flower against real workers, the Prometheus endpoint, and the HTML run report
rendered in headless Chromium."""

from __future__ import annotations

import base64
import html
import json
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from evalq.producer.operations.metrics import serve
from evalq.producer.operations.redis_server import free_port
from evalq.producer.reports.page import render, render_comparison
from evalq.producer.service.client import Client
from evalq.producer.service.report import Report, gather
from evalq.producer.service.submit import SubmitRequest
from evalq.shared.access.ledger import Ledger
from evalq.shared.data.loading import Sharding
from evalq.shared.lm.limits import EndpointLimits
from evalq.shared.models import RunMeta
from evalq.shared.settings import Settings
from evalq.shared.store.endpoints import EndpointRegistry
from evalq.shared.store.rate import RateLimit
from evalq.shared.store.reader import ResultReader
from tests.browser import colored_pixels, launched, require_chromium
from tests.conftest import Stack
from tests.helpers import (
    REPO,
    cli_env,
    dataset_name,
    ended_view,
    labelled_rows,
    list_splits,
    wait_completed,
    wait_for,
    write_rows,
)
from tests.plugins import predict

pytestmark = pytest.mark.integration

FLOWER_AUTH = ("watcher", "not-a-real-secret")


def _gathered(client: Client, run_id: str) -> Report:
    """What the report of ``run_id`` shows to ``client``'s reader."""
    return gather(client.status(run_id), client.samples)


def _get(url: str, auth: tuple[str, str] | None = None) -> Any:
    request = urllib.request.Request(url)
    if auth is not None:
        token = base64.b64encode(":".join(auth).encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    with urllib.request.urlopen(request, timeout=10) as response:
        body = response.read().decode()
    return json.loads(body) if body[:1] in "[{" else body


def _ok(url: str) -> bool:
    try:
        return bool(_get(url) == "OK")
    except OSError:
        return False


def _submitted(
    stack: Stack,
    folder: Path,
    rows: list[dict[str, object]],
    tier: str = "viewable",
    **request: Any,
) -> tuple[Client, RunMeta]:
    """Write ``rows`` as a validation split of ``tier`` and submit them (``request`` adds to
    the :class:`SubmitRequest`); the run is not awaited."""
    write_rows(folder, "validation", rows)
    name = list_splits(stack.client, str(folder), "validation", tier=tier)
    client = Client(
        Settings(
            redis_url=stack.server.url, archive_url=stack.settings.archive_url, principal="tests"
        )
    )
    options = {"eval": "spy", **request}
    return client, client.submit(SubmitRequest(dataset=name, split="validation", **options))


@pytest.fixture
def flower(fresh_stack: Stack, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    log = (tmp_path / "flower.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "evalq.worker.celery", "flower", f"--port={port}",
         "--address=127.0.0.1", f"--basic-auth={':'.join(FLOWER_AUTH)}", "--persistent=False"],
        env=cli_env(fresh_stack.server.url),
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _ok(f"{base}/healthcheck"), 60, "flower to answer")
        yield base
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


def test_flower_sees_the_worker_and_tasks_with_ids_only(
    fresh_stack: Stack, flower: str, tmp_path: Path
) -> None:
    with pytest.raises(urllib.error.HTTPError):  # basic auth is on
        _get(f"{flower}/api/workers")
    # an inference worker and a scoring worker, so both stages travel as messages (a worker
    # that consumes both queues scores in the inference task)
    fresh_stack.start_workers(queues="infer")
    fresh_stack.start_workers(queues="score")
    rows = labelled_rows(40, salt="flower-")
    _, meta = _submitted(fresh_stack, tmp_path / "data", rows, tier="non_viewable")
    wait_completed(fresh_stack.client, meta.run_id)
    stored = ResultReader(fresh_stack.client).outputs(meta.run_id, list(range(40)))
    outputs = [json.dumps(o) for o in stored.values()]

    workers = wait_for(
        lambda: _get(f"{flower}/api/workers?refresh=1", FLOWER_AUTH), 60, "flower's workers"
    )
    assert any(name.startswith("evalq-") for name in workers)

    def both_kinds() -> dict[str, Any] | None:
        tasks: dict[str, Any] = _get(f"{flower}/api/tasks", FLOWER_AUTH)
        names = {task["name"] for task in tasks.values()}
        return tasks if {"evalq.infer", "evalq.score"} <= names else None

    tasks = wait_for(both_kinds, 60, "evalq.infer and evalq.score in flower")
    assert tasks is not None
    for task in tasks.values():
        shown = json.dumps([task.get("args"), task.get("kwargs"), task.get("result")])
        assert meta.run_id in shown
        if task["name"] == "evalq.archive":  # its one argument: the run id
            assert str(task.get("args")) == str([meta.run_id])  # Flower shows args as text
            continue
        assert meta.spec in shown
        assert "sample_ids" in shown
        for row in rows:  # no row text, no label, no secret field
            assert str(row["text"]) not in shown
            assert str(row["secret"]) not in shown
        assert "label" not in shown
        assert not any(output in shown for output in outputs)  # non_viewable outputs


def _metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = _get(url)
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_the_metrics_endpoint_serves_runs_queues_and_budgets(
    fresh_stack: Stack, tmp_path: Path
) -> None:
    data = dataset_name(tmp_path / "data")
    Ledger(fresh_stack.client).set(
        data, "validation", runs=5, samples=100, max_samples_per_run=None, who="tests"
    )
    _, meta = _submitted(fresh_stack, tmp_path / "data", labelled_rows(30), limit=20)
    endpoint = "http://127.0.0.1:9/v1"
    EndpointRegistry(fresh_stack.client).set(endpoint, EndpointLimits(), who="tests")
    RateLimit(fresh_stack.client, endpoint, EndpointLimits()).count(requests=3, rate_limited=1)
    server = serve(fresh_stack.client, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.port}/metrics"
    labels = (("dataset", data), ("eval", "spy"), ("run", meta.run_id), ("split", "validation"))
    try:
        before = _metrics(url)
        assert before["evalq_queue_depth", (("queue", "infer"),)] == 1  # 20 ids: one message
        assert before["evalq_run_samples", (*labels, ("state", "total"))] == 20
        assert before["evalq_run_samples", (*labels, ("state", "done"))] == 0
        assert before["evalq_run_active", labels] == 1
        budget = (("dataset", data), ("principal", ""), ("split", "validation"))
        assert before["evalq_budget_remaining", (*budget, ("unit", "samples"))] == 80
        assert before["evalq_budget_remaining", (*budget, ("unit", "runs"))] == 4
        traffic = "evalq_endpoint_last_minute"
        assert before[traffic, (("count", "requests"), ("endpoint", endpoint))] == 3
        assert before[traffic, (("count", "rate_limited"), ("endpoint", endpoint))] == 1
        assert before[traffic, (("count", "tokens"), ("endpoint", endpoint))] == 0

        fresh_stack.start_workers()
        wait_completed(fresh_stack.client, meta.run_id)
        after = _metrics(url)
        assert after["evalq_run_samples", (*labels, ("state", "scored"))] == 20
        assert after["evalq_run_samples", (*labels, ("state", "done"))] == 20
        assert after["evalq_run_active", labels] == 0
        assert after["evalq_queue_depth", (("queue", "infer"),)] == 0
        assert after["evalq_queue_depth", (("queue", "score"),)] == 0
    finally:
        server.close()


def _render(html_path: Path, shot: Path) -> tuple[dict[str, int], dict[str, list[str]]]:
    """Open the page in headless Chromium; colored pixels of each chart, by chart name, and
    the rendered text of each table's rows, by table name."""
    with launched() as browser:
        page = browser.new_page(viewport={"width": 1100, "height": 900})
        page.goto(html_path.as_uri())
        page.screenshot(path=str(shot), full_page=True)
        charts = page.locator("figure.chart")
        drawn = {
            str(charts.nth(i).get_attribute("data-chart")): colored_pixels(
                charts.nth(i).screenshot()
            )
            for i in range(charts.count())
        }
        tables = page.locator("table.rows")
        texts = {
            str(tables.nth(i).get_attribute("data-table")): tables.nth(i)
            .locator("tr")
            .all_inner_texts()
            for i in range(tables.count())
        }
        return drawn, texts


@pytest.fixture
def chromium() -> None:
    require_chromium()


@pytest.mark.usefixtures("chromium")
def test_the_report_renders_its_charts_in_headless_chromium(stack: Stack, tmp_path: Path) -> None:
    rows = labelled_rows(90, salt="report-")
    for i in (3, 40):
        rows[i]["text"] = f"boom {i}"  # inference error
    rows[70]["text"] = "bust 70"  # scoring error
    client, meta = _submitted(
        stack, tmp_path / "data", rows, eval="flaky", sharding=Sharding(shards=3)
    )
    wait_completed(stack.client, meta.run_id)

    report = _gathered(client, meta.run_id)
    # one error in each shard of 30: rows 3 and 40 fail inference, row 70 fails scoring
    assert [(s.scored, s.failed, s.total) for s in report.shards] == [(29, 1, 30)] * 3
    page = tmp_path / "report.html"
    page.write_text(render(report), encoding="utf-8")
    text = page.read_text()
    assert "<script" not in text  # self-contained: no script, nothing fetched
    assert "src=" not in text

    drawn, tables = _render(page, tmp_path / "report.png")
    charts = ["aggregates", "distribution", "throughput", "errors", "shards"]
    assert list(drawn) == [*charts, "samples", "provenance"]
    for name in charts:
        assert drawn[name] > 200, f"chart {name} looks empty ({drawn[name]} coloured pixels)"
    # the aggregates carry their 95% intervals; the three failed samples and the lowest
    # scores are listed; the workers that ran it are named
    assert report.view.stats is not None
    low, high = report.view.stats["correct"].ci95 or (0.0, 0.0)
    assert f"[{low:.4g}, {high:.4g}] n=90 (3 failed)" in text
    assert [row.split("\t")[0] for row in tables["failures"][1:]] == ["3", "40", "70"]
    assert len(tables["worst"]) == 1 + 10
    assert [row.split("\t")[1] for row in tables["worst"][1:]] == ["0"] * 10
    assert len(tables["provenance"]) >= 2
    assert report.view.provenance is not None
    assert report.view.provenance.workers[0].evaluation.endswith(".Flaky")


@pytest.mark.usefixtures("chromium")
def test_a_comparison_report_draws_the_differences_and_lists_flips(
    stack: Stack, tmp_path: Path
) -> None:
    """Two candidates of the ``guess`` eval, one flipping three items: the comparison page
    draws the forest plot and lists exactly the flipped samples."""
    labels = [i % 2 for i in range(40)]
    rows = [{"text": f"item-{i} cmp", "cue": 0, "label": y} for i, y in enumerate(labels)]
    client, base = _submitted(stack, tmp_path / "data", rows, eval="guess", params={"base": "0"})
    other = client.submit(
        SubmitRequest(
            eval="guess", dataset=base.dataset_id, split="validation",
            params={"base": "0", "flip": "item-1,item-2,item-7"},
        )
    )  # fmt: skip
    for meta in (base, other):
        wait_completed(stack.client, meta.run_id)
    found = client.compare([base.run_id, other.run_id])
    page = tmp_path / "compare.html"
    page.write_text(
        render_comparison(found, [client.status(base.run_id), client.status(other.run_id)]),
        encoding="utf-8",
    )
    assert "<script" not in page.read_text()
    drawn, tables = _render(page, tmp_path / "compare.png")
    assert drawn["forest"] > 200, f"the forest plot looks empty ({drawn['forest']} pixels)"
    labelled = f"{other.run_id} (guess)"  # a run by its task (and model, for a language task)
    assert tables["flips"][1].split("\t") == ["accuracy", labelled, "1, 7", "2"]
    assert tables["numbers"][1].split("\t")[:3] == ["accuracy", labelled, "+0.0250"]


def test_a_non_viewable_report_shows_aggregates_only(stack: Stack, tmp_path: Path) -> None:
    rows = labelled_rows(30, salt="hidden-")
    client, meta = _submitted(stack, tmp_path / "data", rows, tier="non_viewable")
    wait_completed(stack.client, meta.run_id)
    ended_view(client, meta.run_id)  # its end shows to a user from the next second on

    page = render(_gathered(client, meta.run_id))
    assert 'data-chart="aggregates"' in page
    assert 'data-chart="distribution"' not in page
    assert 'data-table="failures"' not in page
    assert 'data-table="worst"' not in page
    assert "per-sample results are not readable" in page
    admin_page = render(_gathered(Client(client.settings, admin=True), meta.run_id))
    assert 'data-chart="distribution"' in admin_page


def _cells(page: str, table: str) -> list[list[str]]:
    """The data rows of one of the page's tables, cell by cell, as text."""
    found = re.search(rf'<table class="rows" data-table="{table}">(.*?)</table>', page)
    assert found is not None, f"no {table} table"
    rows = re.findall(r"<tr>(.*?)</tr>", found.group(1))
    return [[html.unescape(c) for c in re.findall(r"<td>(.*?)</td>", row)] for row in rows[1:]]


def test_the_lowest_scoring_samples_show_their_input_and_target_where_the_tier_allows(
    stack: Stack, tmp_path: Path
) -> None:
    """On a viewable split each of the lowest-scoring samples shows its input (the row without
    its label fields) and its target (the label fields, read from the data: the results hold
    neither) beside its output, long values cut; on a non_viewable split a user gets no such
    table and no row's text, and an admin gets it as on a viewable one."""
    rows = [{**row, "context": "c" * 200} for row in labelled_rows(30)]
    client, meta = _submitted(stack, tmp_path / "open", rows)
    wait_completed(stack.client, meta.run_id)
    page = render(_gathered(client, meta.run_id))
    listed = _cells(page, "worst")
    wrong = [i for i, row in enumerate(rows) if predict(str(row["text"])) != row["label"]]
    assert [int(cells[0]) for cells in listed] == wrong[:10]
    for sample, score, shown_input, target, output in listed:
        row = rows[int(sample)]
        text = json.dumps({"text": row["text"], "context": row["context"]})
        assert score == "0"
        assert shown_input == text[:119] + "…"  # cut to 120 characters
        assert json.loads(target) == {"label": row["label"], "secret": row["secret"]}
        assert json.loads(output)["pred"] == predict(str(row["text"]))

    hidden = labelled_rows(30, salt="held-")
    user, held = _submitted(stack, tmp_path / "held", hidden, tier="non_viewable")
    wait_completed(stack.client, held.run_id)
    ended_view(user, held.run_id)
    page = render(_gathered(user, held.run_id))
    assert 'data-table="worst"' not in page
    assert not any(str(row["text"]) in page for row in hidden)
    admin = _cells(render(_gathered(Client(user.settings, admin=True), held.run_id)), "worst")
    assert [len(cells) for cells in admin] == [5] * 10
    first = hidden[int(admin[0][0])]
    assert json.loads(admin[0][2]) == {"text": first["text"]}
    assert json.loads(admin[0][3]) == {"label": first["label"], "secret": first["secret"]}
