"""The web viewer (``evalq serve`` at ``/``) in headless Chromium, driven by Playwright, against
the real gateway on uvicorn, a real Redis and real workers: sign-in, the runs list and its
filters, a run page that follows a going run live, the samples table (and its absence for a
``non_viewable`` split), what another principal's run answers, an admin's view, a sweep's
chart and a comparison. Every check reads the page's DOM (and the charts' pixels) against what
the API and the CLI answer for the same token; screenshots are written to
``$EVALQ_SCREENSHOTS`` (or the test's temporary folder)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from evalq.producer.clients.remote import RemoteClient
from evalq.producer.service.client import Client
from evalq.producer.service.submit import SubmitRequest
from evalq.producer.service.views import SampleQuery
from evalq.shared.access.policy import Tier
from evalq.shared.access.roles import Role
from evalq.shared.access.tiers import TierRegistry
from evalq.shared.models import RunFilter
from tests.browser import colored_pixels, launched
from tests.conftest import Door, Stack
from tests.helpers import (
    NOWHERE,
    audit_entries,
    cli_env,
    gateway,
    labelled_rows,
    list_splits,
    wait_completed,
    wait_for,
    write_rows,
)

pytestmark = pytest.mark.integration

BUSTED = (5, 17, 44)
"""Samples of the viewable run whose scoring fails."""
WAIT_MS = 30_000


@dataclass
class Site:
    """The gateway, three principals' tokens and their runs."""

    stack: Stack
    api: str
    alice: str
    bob: str
    root: str
    viewable: str
    hidden: str
    bobs: str
    sweep: str
    swept: list[str]
    flipped: str
    data: str
    bob_swept: str
    """Bob's run with the sweep id of Alice's sweep (callers pick sweep ids)."""
    runs: dict[str, RemoteClient] = field(default_factory=dict)

    def remote(self, token: str) -> RemoteClient:
        if token not in self.runs:
            self.runs[token] = RemoteClient(self.api, token)
        return self.runs[token]

    def cli(self, token: str, *args: str) -> subprocess.CompletedProcess[str]:
        """``evalq ARGS`` through the gateway, holding ``token`` (no Redis URL that works)."""
        return _door(self.api, token).run(*args)


def _door(api: str, token: str) -> Door:
    return Door("gateway", cli_env(NOWHERE, EVALQ_API_URL=api, EVALQ_TOKEN=token))


def _submit(client: RemoteClient, dataset: str, split: str, **request: Any) -> str:
    options = {"eval": "spy", **request}
    return client.submit(SubmitRequest(dataset=dataset, split=split, **options)).run_id


@pytest.fixture(scope="module")
def site(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    root = tmp_path_factory.mktemp("viewer")
    rows = labelled_rows(60)
    for i in BUSTED:
        rows[i]["text"] = f"bust {i} " + str(rows[i]["text"]).split(" ", 2)[2]
    write_rows(root / "data", "validation", rows)
    write_rows(root / "data", "hidden", labelled_rows(30))
    data = list_splits(stack.client, root / "data", "validation")
    TierRegistry(stack.client).set(data, "hidden", Tier.NON_VIEWABLE, who="tests")
    labels = [int(i % 10 < 7) for i in range(40)]
    guessed = [{"text": f"item-{i} cmp", "cue": 0, "label": y} for i, y in enumerate(labels)]
    write_rows(root / "cmp", "validation", guessed)
    cmp = list_splits(stack.client, root / "cmp", "validation")
    operator = Client(stack.settings)
    tokens = {p: operator.create_token(p, r) for p, r in
              [("v-alice", Role.USER), ("v-bob", Role.USER), ("v-root", Role.ADMIN)]}  # fmt: skip
    operator.close()
    archive = {"EVALQ_ARCHIVE_URL": stack.settings.archive_url}
    with gateway(stack.server.url, root / "gateway.log", **archive) as (api, _):
        alice = RemoteClient(api, tokens["v-alice"])
        bob = RemoteClient(api, tokens["v-bob"])
        viewable = _submit(alice, data, "validation", eval="flaky")
        hidden = _submit(alice, data, "hidden")
        bobs = _submit(bob, data, "validation", tags=["bobs"])
        swept = _door(api, tokens["v-alice"]).run(
            "submit", "guess", "--dataset", cmp, "--split", "validation",
            "--sweep", "base=0,1", "--json",
        )  # fmt: skip
        assert swept.returncode == 0, swept.stderr
        sweep = json.loads(swept.stdout)
        flipped = _submit(alice, cmp, "validation", eval="guess",
                          params={"base": "0", "flip": "item-1,item-2,item-7"})  # fmt: skip
        bob_swept = _submit(bob, cmp, "validation", eval="guess", params={"base": "1"},
                            sweep=sweep["sweep"])  # fmt: skip
        for run_id in (viewable, hidden, bobs, *sweep["run_ids"], flipped, bob_swept):
            wait_completed(stack.client, run_id)
        made = Site(
            stack, api, tokens["v-alice"], tokens["v-bob"], tokens["v-root"], viewable,
            hidden, bobs, sweep["sweep"], sweep["run_ids"], flipped, data, bob_swept,
        )  # fmt: skip
        yield made
        alice.close()
        bob.close()
        for client in made.runs.values():
            client.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with launched() as chromium:
        yield chromium


@dataclass
class Tab:
    """A fresh browser context's page and every request it sent."""

    page: Any
    requests: list[tuple[str, dict[str, str]]]
    answers: list[tuple[str, int]]
    shots: Path

    def shot(self, name: str) -> bytes:
        png: bytes = self.page.screenshot(path=str(self.shots / f"{name}.png"), full_page=True)
        return png


@pytest.fixture
def tab(browser: Any, tmp_path: Path) -> Iterator[Tab]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    shots = Path(os.environ.get("EVALQ_SCREENSHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    found = Tab(page, [], [], shots)
    page.on("request", lambda r: found.requests.append((r.url, r.headers)))
    page.on("response", lambda r: found.answers.append((r.url, r.status)))
    yield found
    context.close()


def _sign_in(tab: Tab, api: str, token: str, where: str = "#/runs") -> None:
    tab.page.goto(f"{api}/{where}")
    tab.page.fill("#token", token)
    tab.page.click("#sign-in button[type=submit]")
    tab.page.locator("#who .principal").wait_for()


def _refusal(api: str, token: str, path: str) -> tuple[int, str]:
    """The status and one-line error the API answers ``path`` with, for ``token``."""
    asked = urllib.request.Request(f"{api}{path}", headers={"Authorization": f"Bearer {token}"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(asked, timeout=30)
    return refused.value.code, json.load(refused.value)["error"]


def _list_reads(tab: Tab) -> int:
    """How many times the page read the runs list."""
    return sum(urlsplit(url).path == "/v1/runs" for url, _ in tab.requests)


def _listed(tab: Tab) -> list[str]:
    tab.page.locator("#runs table, #no-runs").first.wait_for()
    rows = tab.page.locator("table[data-table=runs] tbody tr")
    return [str(r) for r in rows.evaluate_all("rows => rows.map(r => r.dataset.run)")]


def test_a_user_signs_in_and_sees_only_what_its_token_may(site: Site, tab: Tab) -> None:
    from playwright.sync_api import expect

    page = tab.page
    answer = page.goto(f"{site.api}/")
    assert answer is not None
    policy = answer.headers["content-security-policy"]
    assert "script-src 'self'" in policy
    assert "unsafe-inline" not in policy
    assert answer.headers["x-content-type-options"] == "nosniff"
    page.fill("#token", "evalq_not-a-token")
    page.click("#sign-in button[type=submit]")
    expect(page.locator("#sign-in-problem")).to_contain_text(
        "unauthorized: unknown or revoked token"
    )

    page.fill("#token", site.alice)
    page.click("#sign-in button[type=submit]")
    expect(page.locator("#who .principal")).to_have_text("v-alice (user)")
    listed = _listed(tab)
    assert listed == [v.meta.run_id for v in site.remote(site.alice).recent(200)]
    assert site.viewable in listed
    assert site.hidden in listed
    assert site.bobs not in listed
    tab.shot("runs-alice")

    # another principal's run, by its URL: the page says what the API and the CLI say
    refused = site.cli(site.alice, "status", site.bobs)
    assert refused.returncode == 3
    said = refused.stderr.strip().removeprefix("error: ")
    assert said == f"forbidden: run {site.bobs} belongs to another principal"
    page.goto(f"{site.api}/#/runs/{site.bobs}")
    expect(page.locator("#run-refused")).to_have_text(f"Refused (HTTP 403){said}")

    # the token travels as a header, in no URL, and is kept in this tab's session only
    assert all(site.alice not in url for url, _ in tab.requests)
    calls = [(url, headers) for url, headers in tab.requests if "/v1/" in url]
    assert calls
    signed = [h.get("authorization") for url, h in calls if "/v1/whoami" not in url]
    assert signed
    assert all(h == f"Bearer {site.alice}" for h in signed)
    assert page.evaluate("sessionStorage.getItem('evalq.token')") == site.alice
    assert page.evaluate("localStorage.length + document.cookie.length") == 0
    page.click("#sign-out")
    page.locator("#sign-in").wait_for()
    assert page.evaluate("sessionStorage.getItem('evalq.token')") is None


def test_the_runs_list_filters_as_the_api_does(site: Site, tab: Tab) -> None:
    from playwright.sync_api import expect

    _sign_in(tab, site.api, site.alice)
    alice = site.remote(site.alice)
    tab.page.fill("#filter-eval", "guess")
    tab.page.click("#filters button[type=submit]")
    expect(tab.page).to_have_url(f"{site.api}/#/runs?eval=guess")
    expected = [v.meta.run_id for v in alice.recent(200, only=RunFilter(eval="guess"))]
    wait_for(lambda: _listed(tab) == expected, 30, "the guess runs listed")
    assert sorted(expected) == sorted([*site.swept, site.flipped])

    for query, only in [
        ("split=hidden", RunFilter(split="hidden")),
        (f"dataset={site.data}&status=completed", RunFilter(dataset=site.data,
                                                             status="completed")),  # type: ignore[arg-type]
        (f"sweep={site.sweep}", RunFilter(sweep=site.sweep)),
        ("eval=nothing-like-it", RunFilter(eval="nothing-like-it")),
    ]:  # fmt: skip
        expected = [v.meta.run_id for v in alice.recent(200, only=only)]
        tab.page.goto(f"{site.api}/#/runs?{query}")
        wait_for(lambda e=expected: _listed(tab) == e, 30, f"the runs of {query}")  # type: ignore[misc]
    assert [v.meta.run_id for v in alice.recent(200, only=RunFilter(split="hidden"))] == [
        site.hidden
    ]
    expect(tab.page.locator("#no-runs")).to_be_visible()
    tab.shot("runs-filtered")


def test_a_run_page_follows_the_run_live_and_shows_its_interval_once_done(
    site: Site, tab: Tab, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    write_rows(tmp_path / "data", "validation", labelled_rows(128))
    data = list_splits(site.stack.client, tmp_path / "data", "validation")
    gate = tmp_path / "gate"
    alice = site.remote(site.alice)
    params = {"gate": str(gate), "open_until": "64"}  # samples 64 on wait for the gate
    run_id = _submit(alice, data, "validation", eval="slow", params=params)
    try:
        wait_for(lambda: alice.status(run_id).progress.done >= 64, 60, "the first 64 samples")
        _sign_in(tab, site.api, site.alice, f"#/runs/{run_id}")
        page = tab.page
        expect(page.locator("#run-status")).to_have_attribute("data-status", "running")
        first = int(page.locator("#done").get_attribute("data-done") or -1)
        assert 64 <= first < 128
        expect(page.locator("#live")).to_have_text("● live")
        page.evaluate("window.__samePage = true")
        tab.shot("run-live")
    finally:
        gate.touch()
    expect(page.locator("#done")).to_have_attribute("data-done", "128")
    expect(page.locator("#run-status")).to_have_attribute("data-status", "completed")
    view = alice.status(run_id)
    assert view.stats is not None
    correct = view.stats["correct"]
    assert correct.ci95 is not None
    row = page.locator("#aggregates tr[data-metric=correct]")
    expect(row).to_have_attribute("data-mean", str(correct.mean))
    assert float(row.get_attribute("data-low") or "nan") == pytest.approx(correct.ci95[0])
    expect(row.locator("td.ci")).to_have_text(f"{correct.ci95[0]:.4f} to {correct.ci95[1]:.4f}")
    expect(page.locator("#live")).to_have_text("")
    assert page.evaluate("window.__samePage") is True  # no reload: the same document
    # one read of the run, then its events: no polling
    reads = [u for u, _ in tab.requests if u.split("?")[0].endswith(f"/v1/runs/{run_id}")]
    streams = [u for u, _ in tab.requests if f"/v1/runs/{run_id}/events" in u]
    assert (len(reads), len(streams)) == (1, 1)
    tab.shot("run-done")


def test_the_samples_table_shows_a_viewable_runs_outputs(site: Site, tab: Tab) -> None:
    from playwright.sync_api import expect

    _sign_in(tab, site.api, site.alice, f"#/runs/{site.viewable}/samples")
    page = tab.page
    expect(page.locator("#page-range")).to_have_text("1-50 of 60")
    expected = site.remote(site.alice).sample_page(site.viewable, SampleQuery(limit=50)).samples
    rows = page.locator("table[data-table=samples] tbody tr")
    expect(rows).to_have_count(50)
    shown = rows.evaluate_all(
        "rows => rows.map(r => [r.dataset.sample, r.querySelector('.output').textContent])"
    )
    assert shown == [
        [str(r.sample_id), json.dumps(r.output, separators=(",", ":"))] for r in expected
    ]
    tab.shot("samples")
    page.click("#next")
    expect(page.locator("#page-range")).to_have_text("51-60 of 60")

    page.goto(f"{site.api}/#/runs/{site.viewable}/samples")
    page.check("#sample-failed")
    page.click("#sample-filters button[type=submit]")
    expect(page.locator("#page-range")).to_have_text("1-3 of 3")
    failed = rows.evaluate_all("rows => rows.map(r => +r.dataset.sample)")
    assert failed == list(BUSTED)
    expect(rows.first.locator(".error")).to_have_text("score/ValueError: cannot score a bust")
    page.goto(f"{site.api}/#/runs/{site.viewable}/samples?sort=-correct")
    expect(rows.first.locator(".scores")).to_have_text("correct=1")
    page.goto(f"{site.api}/#/runs/{site.viewable}/samples?q=bust")
    expect(page.locator("#page-range")).to_have_text("1-3 of 3")

    page.click(f"table[data-table=samples] a >> text='{BUSTED[0]}'")
    expect(page.locator("#sample-input pre")).to_contain_text('"label"')
    expect(page.locator("#sample-error pre")).to_have_text("score/ValueError: cannot score a bust")
    tab.shot("sample")


def test_the_samples_page_sends_only_what_its_route_takes_and_pages_on_where_cut(
    site: Site, tab: Tab
) -> None:
    from playwright.sync_api import expect

    _sign_in(tab, site.api, site.alice, f"#/runs/{site.viewable}/samples?q=bust")
    page = tab.page
    expect(page.locator("#page-range")).to_have_text("1-3 of 3")
    # an offset past any integer is clamped (sent as digits), and the page offers the last page
    samples = f"{site.api}/#/runs/{site.viewable}/samples"
    page.goto(f"{samples}?offset=99999999999999999999999")
    expect(page.locator("#page-range")).to_have_text("none of 60")
    expect(page.locator("#prev")).to_have_attribute(
        "href", f"#/runs/{site.viewable}/samples?offset=50"
    )
    sent = [urlsplit(u).query for u, _ in tab.requests if f"/{site.viewable}/samples?" in u]
    assert "offset=9007199254740991&" in sent[-1]
    assert not any("e%2B" in q for q in sent)
    # what the route does not take is the API's own line, said as a bad request (not a refusal)
    route = f"/v1/runs/{site.viewable}/samples"
    for bad in ("sort=%3Cb%3E", f"q={'x' * 201}"):
        status, said = _refusal(site.api, site.alice, f"{route}?{bad}")
        assert status == 422
        page.goto(f"{samples}?{bad}")
        expect(page.locator("#samples-bad strong")).to_have_text(f"Bad request: {said}")
        expect(page.locator("#samples-refused")).to_have_count(0)
        expect(page.locator("#sample-filters")).to_be_visible()
    tab.shot("samples-bad-request")
    # a bad % escape in the address: no such page (not the page before left on screen)
    for nowhere in ("#/runs/%", "#/runs/%E0%A4%A"):
        page.goto(samples)
        expect(page.locator("#page-range")).to_have_text("1-50 of 60")
        page.goto(f"{site.api}/{nowhere}")
        expect(page.locator("#no-such-page")).to_contain_text(f"Nothing is at {nowhere}.")
        expect(page.locator("#samples")).to_have_count(0)

    # the gateway may answer fewer samples than asked (it caps a page's bytes): the page says
    # so and the next one starts where this one was cut
    def cut(route: Any) -> None:
        answer = route.fetch()
        body = answer.json()
        body["samples"] = body["samples"][:20] if body["offset"] == 0 else body["samples"]
        route.fulfill(response=answer, json=body)

    page.route(re.compile(r"/v1/runs/[^/?]+/samples\?"), cut)
    page.goto(samples)
    expect(page.locator("#page-range")).to_have_text("1-20 of 60")
    expect(page.locator("#page-cut")).to_have_text("page cut at 20 samples (size)")
    tab.shot("samples-cut")
    page.click("#next")
    expect(page.locator("#page-range")).to_have_text("21-60 of 60")
    expect(page.locator("#page-cut")).to_have_count(0)
    page.unroute_all()


def test_a_non_viewable_run_shows_nothing_per_sample_and_says_why(site: Site, tab: Tab) -> None:
    from playwright.sync_api import expect

    refused = site.cli(site.alice, "results", site.hidden)
    assert refused.returncode == 3
    said = refused.stderr.strip().removeprefix("error: ")
    assert said.startswith("tier refused: ")
    _sign_in(tab, site.api, site.alice, f"#/runs/{site.hidden}/samples")
    page = tab.page
    box = page.locator("#samples-refused")
    expect(box.locator("p").first).to_have_text(said)
    expect(box).to_contain_text("split is non_viewable")
    expect(page.locator("table[data-table=samples]")).to_have_count(0)
    asked = [status for url, status in tab.answers if f"/v1/runs/{site.hidden}/samples" in url]
    assert asked == [403]
    tab.shot("samples-non-viewable")
    # its run page shows the aggregate as released, and no sample
    page.goto(f"{site.api}/#/runs/{site.hidden}")
    expect(page.locator("#run-status")).to_have_attribute("data-status", "completed")
    expect(page.locator("#aggregates")).to_be_visible()
    assert "sample" not in (page.locator("#aggregates").text_content() or "")


def test_an_admin_sees_every_principals_runs_and_reads_every_tier_when_it_asks(
    site: Site, tab: Tab
) -> None:
    from playwright.sync_api import expect

    _sign_in(tab, site.api, site.root)
    page = tab.page
    expect(page.locator("#who .principal")).to_have_text("v-root (admin)")
    listed = _listed(tab)
    assert {site.viewable, site.hidden, site.bobs} <= set(listed)
    admin = RemoteClient(site.api, site.root)
    try:
        assert listed == [v.meta.run_id for v in admin.recent(200)]
        page.fill("#filter-principal", "v-bob")
        page.click("#filters button[type=submit]")
        expected = [v.meta.run_id for v in admin.recent(200, only=RunFilter(principal="v-bob"))]
        wait_for(lambda: _listed(tab) == expected, 30, "bob's runs")
        assert site.bobs in expected
        expect(page.locator(f"tr[data-run='{site.bobs}'] td.principal")).to_have_text("v-bob")
        tab.shot("runs-admin")

        # bob's run shares the id of alice's sweep: each sweep link names its principal, and
        # the page reads that principal's runs only
        sweeps = page.locator(f"tr[data-run='{site.bob_swept}'] a.sweep-link")
        expect(sweeps).to_have_attribute("href", f"#/sweeps/{site.sweep}?principal=v-bob")
        sweeps.click()
        expect(page.locator("#sweep-principal")).to_have_text("v-bob")
        swept = page.locator("table[data-table=sweep] tbody tr")
        expect(swept).to_have_count(1)
        expect(swept).to_have_attribute("data-run", site.bob_swept)
        page.goto(f"{site.api}/#/sweeps/{site.sweep}")  # no principal: whose is asked
        expect(page.locator("#sweep-owners a")).to_have_text(["v-alice", "v-bob"])
        expect(page.locator("svg[data-chart=sweep]")).to_have_count(0)
        page.click("#sweep-owners a >> text=v-alice")
        expect(page.locator("#sweep-principal")).to_have_text("v-alice")
        ran = swept.evaluate_all("rows => rows.map(r => r.dataset.run)")
        assert sorted(ran) == sorted(site.swept)

        page.goto(f"{site.api}/#/runs/{site.hidden}/samples")
        expect(page.locator("#samples-refused")).to_contain_text("tier refused")  # no flag
        page.check("#admin-mode")
        rows = page.locator("table[data-table=samples] tbody tr")
        expect(rows).to_have_count(30)
        bypass = RemoteClient(site.api, site.root, admin=True)
        expected_rows = bypass.sample_page(site.hidden, SampleQuery(limit=50)).samples
        bypass.close()
        shown = rows.evaluate_all("rows => rows.map(r => r.querySelector('.output').textContent)")
        assert shown == [json.dumps(r.output, separators=(",", ":")) for r in expected_rows]
        assert any(
            e["action"] == "admin_read" for e in audit_entries(site.stack.client, site.hidden)
        )
        tab.shot("samples-admin")
    finally:
        admin.close()


def test_a_sweep_chart_and_a_comparison_show_what_compare_json_gives(site: Site, tab: Tab) -> None:
    from playwright.sync_api import expect

    _sign_in(tab, site.api, site.alice, f"#/runs/{site.swept[0]}")
    page = tab.page
    sweeps = page.locator("#run a.sweep-link")
    expect(sweeps).to_have_attribute("href", f"#/sweeps/{site.sweep}?principal=v-alice")
    sweeps.click()
    expect(page.locator("#sweep-principal")).to_have_text("v-alice")
    points = page.locator("svg[data-chart=sweep] g.point")
    expect(points).to_have_count(2)
    alice = site.remote(site.alice)
    views = {v.meta.params["base"]: v for v in (alice.status(r) for r in site.swept)}
    drawn = points.evaluate_all(
        "gs => gs.map(g => [g.dataset.label, +g.dataset.mean, +g.dataset.low, +g.dataset.high])"
    )
    expected = []
    for base in ("0", "1"):
        stat = (views[base].stats or {})["accuracy"]
        assert stat.ci95 is not None
        expected.append([base, stat.mean, *stat.ci95])
    assert drawn == expected
    assert [d[1] for d in drawn] == [pytest.approx(0.3), pytest.approx(0.7)]
    chart = page.locator("svg[data-chart=sweep]")
    assert colored_pixels(chart.screenshot()) > 300, "the sweep chart looks empty"
    tab.shot("sweep")

    base = site.swept[0] if views["0"].meta.run_id == site.swept[0] else site.swept[1]
    answered = site.cli(site.alice, "compare", base, site.flipped, "--json")
    assert answered.returncode == 0, answered.stderr
    found = json.loads(answered.stdout)
    delta = found["metrics"]["accuracy"][site.flipped]
    page.goto(f"{site.api}/#/compare?runs={base},{site.flipped}")
    row = page.locator("svg[data-chart=forest-accuracy] g.row")
    expect(row).to_have_count(1)
    assert float(row.get_attribute("data-delta") or "nan") == delta["delta"]
    assert float(row.get_attribute("data-low") or "nan") == delta["ci95"][0]
    assert float(row.get_attribute("data-high") or "nan") == delta["ci95"][1]
    table = page.locator(f"table[data-table=deltas-accuracy] tr[data-run='{site.flipped}']")
    expect(table.locator("td.delta")).to_have_text(f"{delta['delta']:+.4f}")
    low, high = delta["ci95"]
    expect(table.locator("td.ci")).to_have_text(f"{low:.4f} to {high:.4f}")
    flips = page.locator("table[data-table=flips-accuracy] tbody tr")
    shown = flips.evaluate_all("rows => rows.map(r => [r.dataset.kind, +r.dataset.sample])")
    flipped = found["flips"]["accuracy"][site.flipped]
    assert shown == [["fixed", i] for i in flipped["fixed"]] + [
        ["broken", i] for i in flipped["broken"]
    ]
    assert shown == [["fixed", 1], ["fixed", 2], ["broken", 7]]
    forest = page.locator("svg[data-chart=forest-accuracy]")
    assert colored_pixels(forest.screenshot()) > 100, "the forest plot looks empty"
    tab.shot("compare")
    links = flips.first.locator("a")
    hrefs = links.evaluate_all("links => links.map(a => a.getAttribute('href'))")
    assert hrefs == [f"#/runs/{base}/samples/1", f"#/runs/{site.flipped}/samples/1"]
    links.nth(1).click()
    expect(page.locator("#sample-output pre")).to_have_text("1")


def test_the_viewer_says_what_it_cuts_short_and_when_the_gateway_is_down(
    site: Site, tab: Tab
) -> None:
    from playwright.sync_api import expect

    page = tab.page
    page.goto(f"{site.api}/")
    expect(page.locator("#token-kept")).to_contain_text("kept for this tab only")
    assert page.locator("link[rel=icon]").get_attribute("href") == "data:,"

    # the runs list and a sweep at their limits (answers padded to the limit asked)
    def padded(route: Any) -> None:
        answer = route.fetch()
        limit = int(parse_qs(urlsplit(route.request.url).query)["limit"][0])
        route.fulfill(response=answer, json=(answer.json() * limit)[:limit])

    page.route(re.compile(r"/v1/runs\?"), padded)
    _sign_in(tab, site.api, site.alice)
    expect(page.locator("table[data-table=runs] tbody tr")).to_have_count(200)
    expect(page.locator("#runs-limit")).to_have_text(
        "showing the newest 200 runs that match; filter to see older ones"
    )
    page.goto(f"{site.api}/#/sweeps/{site.sweep}")
    expect(page.locator("#sweep-limit")).to_have_text("showing the newest 256 runs of this sweep")
    page.unroute_all()

    page.route("**/v1/**", lambda route: route.abort())  # as if the gateway were down
    page.goto(f"{site.api}/#/runs/{site.viewable}")
    down = f"the gateway at {site.api} cannot be reached; is `evalq serve` running?"
    expect(page.locator("#app .notice")).to_have_text(f"Gateway unreachable{down}")
    tab.shot("gateway-down")
    assert not any(urlsplit(u).path == "/favicon.ico" for u, _ in tab.requests)


HIDE = """hidden => {
  Object.defineProperty(document, 'hidden', { configurable: true, get: () => hidden });
  document.dispatchEvent(new Event('visibilitychange'));
}"""
"""Hide (or show) the tab, as far as the page can tell."""


def _refreshes_once_shown(tab: Tab, run_id: str) -> None:
    """The runs list (``run_id`` going) is read again after its refresh interval, not while
    the tab is hidden, and at once when it is shown again."""
    page = tab.page
    assert _listed(tab) == [run_id]
    reads = _list_reads(tab)
    table = page.locator("table[data-table=runs]")
    drawn = page.locator("table[data-table=runs]:not([data-seen])")  # the next timer is set
    table.evaluate("t => { t.dataset.seen = '1'; }")
    page.clock.run_for(5_000)  # a listed run goes: the list is read again, and drawn
    drawn.wait_for()
    assert _list_reads(tab) == reads + 1
    table.evaluate("t => { t.dataset.seen = '1'; }")
    page.evaluate(HIDE, True)
    page.clock.run_for(60_000)
    page.wait_for_timeout(300)
    assert _list_reads(tab) == reads + 1  # not while the tab is hidden
    page.evaluate(HIDE, False)
    drawn.wait_for()  # read again once shown
    assert _list_reads(tab) == reads + 2


def test_a_hidden_tab_reads_the_list_again_once_shown_and_a_revoked_token_signs_out(
    site: Site, tab: Tab, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    write_rows(tmp_path / "data", "validation", labelled_rows(128))
    data = list_splits(site.stack.client, tmp_path / "data", "validation")
    gate = tmp_path / "gate"
    operator = Client(site.stack.settings)
    token = operator.create_token("v-carol", Role.USER)
    carol = RemoteClient(site.api, token)
    params = {"gate": str(gate), "open_until": "0"}  # every sample waits for the gate
    run_id = _submit(carol, data, "validation", eval="slow", params=params)
    page = tab.page
    said = "unauthorized: unknown or revoked token"
    try:
        page.clock.install()  # the list's refresh timer fires when the test says
        _sign_in(tab, site.api, token)
        _refreshes_once_shown(tab, run_id)

        page.goto(f"{site.api}/#/runs/{run_id}")
        expect(page.locator("#live")).to_have_text("● live")
        reads = _list_reads(tab)
        page.clock.run_for(60_000)
        page.wait_for_timeout(300)
        assert _list_reads(tab) == reads  # left the list: no timer of it is left

        # revoked while the run page follows the run: its events end in an error, which signs out
        operator.revoke_tokens("v-carol")
        expect(page.locator("#sign-in-problem")).to_have_text(f"Not signed in{said}")
        expect(page.locator("#run")).to_have_count(0)
        assert page.evaluate("sessionStorage.getItem('evalq.token')") is None
        tab.shot("revoked")

        # revoked between two pages: the next one asks for a token, saying why
        page.fill("#token", operator.create_token("v-carol", Role.USER))
        page.click("#sign-in button[type=submit]")
        expect(page.locator("#live")).to_have_text("● live")
        page.goto(f"{site.api}/#/runs")
        assert _listed(tab) == [run_id]
        operator.revoke_tokens("v-carol")
        page.goto(f"{site.api}/#/runs?eval=slow")
        expect(page.locator("#sign-in-problem")).to_have_text(f"Not signed in{said}")
        expect(page.locator("#who")).to_be_empty()
        expect(page.locator("#app .notice")).to_have_count(1)
    finally:
        gate.touch()
        wait_completed(site.stack.client, run_id)
        carol.close()
        operator.close()


def test_a_run_page_says_what_failed_and_offers_resume_only_when_it_helps(
    site: Site, tab: Tab, tmp_path: Path
) -> None:
    """#44's finding 9: a finished run's errors with their first message (a per-sample reader's
    only), Resume disabled on a run that goes, "waiting its turn" only behind other principals,
    the samples' target column and outputs as text, one-line timestamps in a runs table that
    fits 1,400 px, and a comparison that names each run's task."""
    from playwright.sync_api import expect

    _sign_in(tab, site.api, site.alice, f"#/runs/{site.viewable}")
    page = tab.page
    row = page.locator("#errors tr[data-kind='score/ValueError']")
    expect(row.locator("td.message")).to_contain_text("cannot score a bust")
    expect(page.locator("#run .actions button", has_text="Resume")).to_have_count(0)  # completed
    # the held-out reader's errors by stage only, and no message read for it
    page.goto(f"{site.api}/#/runs/{site.hidden}")
    expect(page.locator("#run-status")).to_have_attribute("data-status", "completed")
    assert page.locator("#errors td.message:not(:empty)").count() == 0

    alone = {"waiting": 808, "share": 1.0, "principals": 1, "runs": 1, "ahead": 0}
    behind = {**alone, "principals": 2, "ahead": 1}
    said = page.evaluate(
        "async ([a, b]) => { const m = await import('/viewer/pages.js');"
        " return [m.waitingText(a), m.waitingText(b)]; }",
        [alone, behind],
    )
    assert "waiting its turn" not in said[0]
    assert "808 samples" in said[0]
    assert said[1].startswith("waiting its turn")
    assert "1 principal(s) served first" in said[1]

    write_rows(tmp_path / "data", "validation", labelled_rows(128))
    data = list_splits(site.stack.client, tmp_path / "data", "validation")
    gate = tmp_path / "gate"
    alice = site.remote(site.alice)
    run_id = _submit(alice, data, "validation", eval="slow",
                     params={"gate": str(gate), "open_until": "64"})  # fmt: skip
    try:
        wait_for(lambda: alice.status(run_id).progress.done >= 64, 60, "the first 64 samples")
        page.goto(f"{site.api}/#/runs/{run_id}")
        expect(page.locator("#run-status")).to_have_attribute("data-status", "running")
        expect(page.locator("#run .actions button", has_text="Resume")).to_be_disabled()
        tab.shot("run-live-resume")
    finally:
        gate.touch()
    expect(page.locator("#run-status")).to_have_attribute("data-status", "completed")

    page.goto(f"{site.api}/#/runs/{site.viewable}/samples?inputs=1")
    rows = page.locator("table[data-table=samples] tbody tr")
    expect(rows).to_have_count(50)
    expected = (
        site.remote(site.alice)
        .sample_page(site.viewable, SampleQuery(limit=50, with_input=True))
        .samples
    )
    shown = rows.evaluate_all("rows => rows.map(r => r.querySelector('.target').textContent)")
    assert shown == [str(r.input["label"]) for r in expected if r.input is not None]
    assert [r.target for r in expected] == [r.input["label"] for r in expected if r.input]

    page.set_viewport_size({"width": 1400, "height": 900})
    page.goto(f"{site.api}/#/runs")
    _listed(tab)
    fits = page.evaluate(
        "() => { const box = document.querySelector('#runs');"
        " const cell = document.querySelector('table[data-table=runs] td.when');"
        " const text = document.createRange(); text.selectNodeContents(cell);"
        " const lines = new Set([...text.getClientRects()].map((r) => Math.round(r.top)));"
        " return [box.scrollWidth <= box.clientWidth, lines.size === 1]; }"
    )
    tab.shot("runs-1400")
    assert fits == [True, True]

    base, other = site.swept[0], site.flipped
    page.goto(f"{site.api}/#/compare?runs={base},{other}")
    cell = page.locator(f"table[data-table=deltas-accuracy] tr[data-run='{other}'] td").first
    expect(cell).to_contain_text(f"{other} (guess")
