"""The gateway's limits: the token bucket, the stream slots and the budget rule alone, then end
to end with a real redis-server, the gateway (``evalq serve``) on uvicorn on a free port and
callers holding only tokens. One caller cannot stall the gateway for the others (open streams,
requests a second, request bodies), and a user reads no other principal's budget. No worker
runs: a submitted run stays queued, a run that never ends during a test."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from evalq.producer.clients.remote import RemoteClient
from evalq.producer.gateway.limits import RateLimiter, StreamSlots
from evalq.producer.operations.redis_server import RedisServer
from evalq.producer.service.client import Client
from evalq.producer.service.submit import SubmitRequest
from evalq.shared.access.policy import Tier
from evalq.shared.access.roles import Caller, Role, sees_budget
from evalq.shared.errors import ThrottledError
from evalq.shared.settings import Settings
from tests.helpers import NOWHERE, REPO, labelled_rows, wait_for, write_rows
from tests.helpers import gateway as serve
from tests.zygote import Started

integration = pytest.mark.integration


@dataclass
class Place:
    """A Redis with a registered dataset, tokens and one queued run per user."""

    server: RedisServer
    root: Path
    operator: Client
    tokens: dict[str, str]
    runs: dict[str, str]
    """Each user's queued run."""


@dataclass
class Gateway:
    api: str
    process: Started


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Place]:
    root = tmp_path_factory.mktemp("limits")
    server = RedisServer(root / "redis").start()
    settings = Settings(redis_url=server.url, plugins=("tests.plugins",), principal="op")
    operator = Client(settings)
    write_rows(root / "data", "validation", labelled_rows(30))
    operator.add_dataset("ds", str(root / "data"))
    operator.set_tier("ds", "validation", Tier.VIEWABLE)
    roles = {"root": Role.ADMIN, "alice": Role.USER, "bob": Role.USER, "carol": Role.USER}
    tokens = {p: operator.create_token(p, role) for p, role in roles.items()}
    runs = {}
    for user in ("alice", "bob", "carol"):
        acting = Client(settings, principal=user)
        request = SubmitRequest(eval="spy", dataset="ds", split="validation", limit=10)
        runs[user] = acting.submit(request).run_id
        acting.close()
    try:
        yield Place(server, root, operator, tokens, runs)
    finally:
        operator.close()
        server.stop()


@contextmanager
def gateway(place: Place, log: Path, **env: str) -> Iterator[Gateway]:
    """``evalq serve`` on a free port with ``env`` (``EVALQ_GATEWAY_*`` limits), until the
    block ends."""
    with serve(place.server.url, log, **env) as (api, process):
        yield Gateway(api, process)


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _cli(place: Place, api: str, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``evalq ARGS`` through the gateway, holding ``token`` and no Redis URL that works."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVALQ_")}
    env.update(PYTHONPATH=str(REPO), EVALQ_API_URL=api, EVALQ_TOKEN=token, EVALQ_REDIS_URL=NOWHERE)
    return subprocess.run(
        [sys.executable, "-c", "from evalq.shared.cli import main; main()", *args],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def _one_line_refusal(response: httpx.Response, status: int, exit_code: int) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["exit_code"] == exit_code
    assert len(str(body["error"]).splitlines()) == 1
    return str(body["error"])


def test_a_bucket_admits_its_burst_then_one_request_per_refill() -> None:
    now = [100.0]
    limiter = RateLimiter(burst=3.0, clock=lambda: now[0])
    alice, bob = ("principal", "alice"), ("principal", "bob")
    assert [limiter.admit(alice, 2.0) for _ in range(6)] == [None] * 6  # 2/s x 3 s
    assert limiter.admit(alice, 2.0) == pytest.approx(0.5)
    assert limiter.admit(bob, 2.0) is None  # a bucket per key
    now[0] += 0.25
    assert limiter.admit(alice, 2.0) == pytest.approx(0.25)
    now[0] += 0.25
    assert limiter.admit(alice, 2.0) is None
    assert limiter.admit(alice, 2.0) is not None
    assert limiter.admit(alice, 0.0) is None  # rate 0: no limit
    assert limiter.size(0.1) == 1.0  # a bucket holds one request at least


def test_stream_slots_cap_each_principal_and_all_and_come_back_once() -> None:
    slots = StreamSlots(per_principal=2, total=3)
    first, _ = slots.take("alice"), slots.take("alice")
    with pytest.raises(ThrottledError, match="alice has 2 results streams open"):
        slots.take("alice")
    slots.take("bob")
    with pytest.raises(ThrottledError, match="the gateway has 3 results streams open"):
        slots.take("bob")
    first()
    first()  # given back once, however often
    assert slots.count == 2
    slots.take("alice")
    assert slots.count == 3


def test_a_user_sees_the_splits_budgets_and_its_own() -> None:
    alice, root = Caller("alice", Role.USER), Caller("root", Role.ADMIN)
    assert [sees_budget(alice, m) for m in (None, "alice", "bob")] == [True, True, False]
    assert all(sees_budget(root, m) for m in (None, "alice", "bob"))


async def _until(probe: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)


async def _latencies_beside_streams(api: str, place: Place, streams: int) -> list[float]:
    """Open ``streams`` follow streams of alice's queued run, then time bob's requests while
    all of them stay open."""
    path = f"/v1/runs/{place.runs['alice']}/results"
    opened: list[int] = []
    limits = httpx.Limits(max_connections=streams + 10, max_keepalive_connections=0)
    timeout = httpx.Timeout(120.0, read=None)
    async with httpx.AsyncClient(base_url=api, limits=limits, timeout=timeout) as held:

        async def hold() -> None:
            headers = _auth(place.tokens["alice"])
            async with held.stream("GET", path, params={"follow": "true"}, headers=headers) as r:
                assert r.status_code == 200, await r.aread()
                opened.append(1)
                async for _ in r.aiter_raw():
                    pass

        tasks = [asyncio.create_task(hold()) for _ in range(streams)]
        try:
            await _until(
                lambda: len(opened) == streams or any(t.done() for t in tasks),
                150,
                f"{streams} streams to open",
            )
            for task in tasks:
                if task.done():
                    task.result()  # raises what ended it
            latencies = []
            async with httpx.AsyncClient(base_url=api, timeout=60.0) as other:
                for _ in range(5):
                    started = time.monotonic()
                    answer = await other.get("/v1/tiers", headers=_auth(place.tokens["bob"]))
                    latencies.append(time.monotonic() - started)
                    assert answer.status_code == 200, answer.text
            assert not any(t.done() for t in tasks)  # every stream is still open
            return latencies
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


@integration
def test_four_hundred_open_streams_do_not_stall_another_users_request(
    place: Place, tmp_path: Path
) -> None:
    """One user's 400 follow streams of its own queued run (raised caps, no rate limit) leave
    another user's requests answered while every stream stays open (the latencies are
    printed, not asserted: a busy machine is slower, not wrong)."""
    limits = {
        "EVALQ_GATEWAY_STREAMS_PER_PRINCIPAL": "400",
        "EVALQ_GATEWAY_STREAMS": "400",
        "EVALQ_GATEWAY_RATE": "0",
    }
    with gateway(place, tmp_path / "gateway.log", **limits) as served:
        latencies = asyncio.run(_latencies_beside_streams(served.api, place, 400))
    print(f"bob's GET /v1/tiers beside 400 open streams: {[round(s, 3) for s in latencies]} s")
    assert len(latencies) == 5


@integration
def test_open_streams_are_capped_per_principal_and_in_all(place: Place, tmp_path: Path) -> None:
    caps = {"EVALQ_GATEWAY_STREAMS_PER_PRINCIPAL": "2", "EVALQ_GATEWAY_STREAMS": "3"}
    timeout = httpx.Timeout(30.0, read=None)
    with (
        gateway(place, tmp_path / "gateway.log", **caps) as served,
        httpx.Client(base_url=served.api, timeout=timeout) as http,
        ExitStack() as held,
    ):

        def follow(user: str) -> httpx.Response:
            path = f"/v1/runs/{place.runs[user]}/results"
            request = http.build_request(
                "GET", path, params={"follow": "true"}, headers=_auth(place.tokens[user])
            )
            response = http.send(request, stream=True)
            held.callback(response.close)
            if response.status_code != 200:
                response.read()
            return response

        first, second = follow("alice"), follow("alice")
        assert (first.status_code, second.status_code) == (200, 200)
        mine = _one_line_refusal(follow("alice"), 429, 3)
        assert mine == (
            "too many streams: alice has 2 results streams open on this gateway (at most 2); "
            "close one first"
        )
        refused = _cli(place, served.api, place.tokens["alice"], "results", place.runs["alice"],
                       "--follow")  # fmt: skip
        assert refused.returncode == 3, refused.stderr
        assert refused.stderr.strip() == f"error: {mine}"
        assert follow("bob").status_code == 200
        everyone = _one_line_refusal(follow("bob"), 429, 3)
        assert everyone.startswith("too many streams: the gateway has 3 results streams open")
        # a stream the caller hangs up on gives its slot back
        first.close()
        wait_for(lambda: follow("alice").status_code == 200, 30, "alice's slot to come back")


@integration
def test_requests_beyond_a_principals_rate_are_refused_429(place: Place, tmp_path: Path) -> None:
    """A user's bucket of 3 requests refilling once every 20 s: the fourth request is refused
    with Retry-After, another user's and an admin's (a higher limit) are not, and the CLI exits
    3 with the refusal's line when the wait is longer than it waits out."""
    limits = {
        "EVALQ_GATEWAY_RATE": "0.05",
        "EVALQ_GATEWAY_BURST": "60",
        "EVALQ_GATEWAY_ADMIN_RATE": "1000",
    }
    with (
        gateway(place, tmp_path / "gateway.log", **limits) as served,
        httpx.Client(base_url=served.api, timeout=30.0) as http,
    ):
        alice, bob, root = (_auth(place.tokens[p]) for p in ("alice", "bob", "root"))
        answered = [http.get("/v1/tiers", headers=alice) for _ in range(4)]
        assert [a.status_code for a in answered[:3]] == [200] * 3
        refusal = _one_line_refusal(answered[3], 429, 3)
        assert refusal.startswith("rate limited: alice sent more than 0.05 requests a second")
        assert 15 <= int(answered[3].headers["Retry-After"]) <= 20
        assert http.get("/v1/tiers", headers=bob).status_code == 200
        assert {http.get("/v1/tiers", headers=root).status_code for _ in range(30)} == {200}
        cli = _cli(place, served.api, place.tokens["alice"], "tiers", "list")
        assert cli.returncode == 3, cli.stderr
        assert cli.stderr.strip().startswith("error: rate limited: alice sent more than")
        # without a token, requests are limited by the caller's address (and not audited)
        anonymous = [http.get("/v1/tiers").status_code for _ in range(4)]
        assert anonymous == [401, 401, 401, 429]


@integration
def test_the_python_client_waits_out_a_short_rate_limit(place: Place, tmp_path: Path) -> None:
    limits = {"EVALQ_GATEWAY_RATE": "4", "EVALQ_GATEWAY_BURST": "0.5"}  # 2 at once, 4 a second
    with gateway(place, tmp_path / "gateway.log", **limits) as served:
        refused = [
            httpx.get(f"{served.api}/v1/tiers", headers=_auth(place.tokens["bob"])).status_code
            for _ in range(6)
        ]
        assert 429 in refused
        caller = RemoteClient(served.api, place.tokens["bob"])
        try:
            assert all(caller.tiers() == {"ds": {"validation": Tier.VIEWABLE}} for _ in range(8))
        finally:
            caller.close()


def _rss(pid: int) -> int:
    """The resident memory of process ``pid``, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@integration
def test_a_39_mb_body_is_refused_413_without_being_read(place: Place, tmp_path: Path) -> None:
    ids = b"1," * (39 * 1024 * 1024 // 2)
    body = b'{"eval": "spy", "dataset": "ds", "split": "validation", "ids": [' + ids + b"1]}"
    headers = {**_auth(place.tokens["alice"]), "Content-Type": "application/json"}

    def chunks() -> Iterator[bytes]:  # no Content-Length: the gateway counts what it reads
        for start in range(0, len(body), 1 << 20):
            yield body[start : start + (1 << 20)]

    with gateway(place, tmp_path / "gateway.log") as served:
        before = _rss(served.process.pid)
        for content in (body, chunks()):
            answer = httpx.post(
                f"{served.api}/v1/runs", content=content, headers=headers, timeout=60.0
            )
            refusal = _one_line_refusal(answer, 413, 2)
            assert refusal == "request body too large: the gateway takes at most 1048576 bytes"
        anonymous = httpx.post(f"{served.api}/v1/runs", content=body, timeout=60.0)
        _one_line_refusal(anonymous, 413, 2)
        grown = _rss(served.process.pid) - before
        print(f"the gateway's RSS beside three 39 MB bodies: {grown / 2**20:+.1f} MiB")
        assert grown < 20 * 1024 * 1024, f"the gateway grew by {grown / 2**20:.1f} MiB"
        # a body under the limit still gets through
        small = httpx.post(
            f"{served.api}/v1/runs",
            json={"eval": "spy", "dataset": "ds", "split": "validation", "ids": [1, 2]},
            headers=_auth(place.tokens["alice"]),
            timeout=60.0,
        )
        assert small.status_code == 200, small.text


@integration
def test_a_user_sees_no_other_principals_budget(place: Place, tmp_path: Path) -> None:
    place.operator.set_budget("ds", "validation", runs=100, samples=None, max_samples_per_run=None)
    for user in ("alice", "bob"):
        place.operator.set_budget(
            "ds", "validation", runs=10, samples=None, max_samples_per_run=None, caller=user
        )
    with gateway(place, tmp_path / "gateway.log") as served:
        seen = httpx.get(f"{served.api}/v1/budgets", headers=_auth(place.tokens["alice"])).json()
        assert {(b["dataset"], b["split"], b["caller"]) for b in seen} == {
            ("ds", "validation", None),
            ("ds", "validation", "alice"),
        }
        shown = _cli(place, served.api, place.tokens["alice"], "budget", "show", "--json")
        assert shown.returncode == 0, shown.stderr
        assert "bob" not in shown.stdout
        assert {b["caller"] for b in json.loads(shown.stdout)} == {None, "alice"}
        every = _cli(place, served.api, place.tokens["root"], "budget", "show", "--json")
        assert {b["caller"] for b in json.loads(every.stdout)} == {None, "alice", "bob"}
        tokens = ("budget", "set", "ds", "validation", "--tokens", "900", "--principal", "bob")
        assert _cli(place, served.api, place.tokens["alice"], *tokens).returncode == 3
        assert _cli(place, served.api, place.tokens["root"], *tokens).returncode == 0
        every = _cli(place, served.api, place.tokens["root"], "budget", "show", "--json")
        (bob,) = [b for b in json.loads(every.stdout) if b["caller"] == "bob"]
        assert (bob["tokens_total"], bob["tokens_used"], bob["tokens_left"]) == (900, 0, 900)


@integration
def test_an_open_stream_ends_when_its_token_is_revoked(place: Place, tmp_path: Path) -> None:
    ended = threading.Event()
    with gateway(place, tmp_path / "gateway.log") as served:
        path = f"{served.api}/v1/runs/{place.runs['carol']}/results"
        timeout = httpx.Timeout(30.0, read=None)
        headers = _auth(place.tokens["carol"])
        with httpx.stream(
            "GET", path, params={"follow": "true"}, headers=headers, timeout=timeout
        ) as stream:
            assert stream.status_code == 200

            lines: list[str] = []

            def read() -> None:
                lines.extend(stream.iter_lines())
                ended.set()

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            assert place.operator.revoke_tokens("carol") == 1
            wait_for(ended.is_set, 30, "carol's stream to end")
            # it says why it ended: a stream that just stopped reads as the run's end
            last = json.loads(lines[-1])
            assert last == {"error": "unauthorized: unknown or revoked token", "exit_code": 3}


@integration
def test_a_body_is_not_read_before_its_token_is_known(place: Place, tmp_path: Path) -> None:
    """FastAPI parses a JSON body before it resolves the token: 32 unauthenticated 1 MiB
    bodies at a time held another user's request for 1.8-2.4 s (the attack review). A body
    that is not even JSON tells apart who reads it first: the token check (401) or the parser
    (422)."""
    garbage = b"{not json" * 1000
    with gateway(place, tmp_path / "gateway.log") as served:
        url = f"{served.api}/v1/runs"
        for headers in ({}, _auth("evalq_not-a-token")):
            answer = httpx.post(url, content=garbage, headers=headers, timeout=30.0)
            assert _one_line_refusal(answer, 401, 3).startswith("unauthorized: ")
        known = httpx.post(url, content=garbage, headers=_auth(place.tokens["alice"]), timeout=30)
        assert known.status_code == 422
        # a body Starlette cannot parse (compressed) is refused in the same one-line shape
        zipped = {
            **_auth(place.tokens["alice"]), "Content-Encoding": "gzip",
            "Content-Type": "application/json",
        }  # fmt: skip
        packed = httpx.post(url, content=gzip.compress(b'{"eval": "spy"}'), headers=zipped)
        assert _one_line_refusal(packed, 400, 2) == "There was an error parsing the body"


@integration
def test_one_principal_s_requests_in_flight_are_capped(place: Place, tmp_path: Path) -> None:
    """Under its rate, one user kept 45 report renderings in flight and held all of the
    route threads: another user's request took 14.8 s (the attack review). Beyond its cap a
    principal's request is refused at once; another user is answered."""
    report = f"/v1/runs/{place.runs['alice']}/report"
    limits = {"EVALQ_GATEWAY_INFLIGHT": "2", "EVALQ_GATEWAY_RATE": "0"}
    with gateway(place, tmp_path / "gateway.log", **limits) as served, \
            httpx.Client(base_url=served.api, timeout=60.0) as http:  # fmt: skip
        alice = _auth(place.tokens["alice"])
        with ThreadPoolExecutor(16) as pool:
            sent = [pool.submit(http.get, report, headers=alice) for _ in range(16)]
            other = http.get("/v1/tiers", headers=_auth(place.tokens["bob"]))
            answers = [request.result() for request in sent]
        assert other.status_code == 200
        refused = [a for a in answers if a.status_code == 429]
        assert refused, [a.status_code for a in answers]
        assert _one_line_refusal(refused[0], 429, 3).startswith(
            "too many requests: alice has 2 requests in flight on this gateway"
        )
        assert all(a.status_code in (200, 429) for a in answers)
