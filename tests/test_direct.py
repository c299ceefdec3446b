"""Direct mode through the gateway's routes: without ``EVALQ_API_URL`` the CLI and
:func:`evalq.open_api` talk to the gateway's app built in their own process
(:mod:`evalq.producer.clients.inprocess`), as the operator: no token, none of the gateway's rate
limits, and a followed stream printed as it comes. Real Redis (and, to follow a run, real
workers)."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from evalq.producer.clients.api import open_api
from evalq.producer.clients.inprocess import URL, AppTransport
from evalq.producer.clients.remote import RemoteClient
from evalq.producer.gateway.app import create_gateway
from evalq.producer.operations.redis_server import RedisServer
from evalq.producer.service.client import Client
from evalq.producer.service.submit import SubmitRequest
from evalq.shared.access.roles import Caller, Role
from evalq.shared.connection import connect
from evalq.shared.errors import UnknownRunError
from evalq.shared.settings import Settings
from tests.conftest import Stack
from tests.helpers import (
    REPO,
    cli_env,
    labelled_rows,
    list_splits,
    wait_completed,
    wait_for,
    write_rows,
)

pytestmark = pytest.mark.integration

FIRST_LINE_WAIT = 60.0
"""Seconds a followed stream may take to print its first line (the run's open samples settle
in well under that on a loaded machine)."""


def test_the_operator_is_answered_by_the_routes_without_a_token(redis_only: RedisServer) -> None:
    settings = Settings(redis_url=redis_only.url, principal="op")
    direct = create_gateway(settings, operator=Caller("op", Role.ADMIN))
    with httpx.Client(base_url=URL, transport=AppTransport(direct)) as http:
        assert http.get("/v1/whoami").json() == {"principal": "op", "role": "admin"}
        assert http.get("/v1/tokens").status_code == 200  # an admin route: the operator's
        with pytest.raises(UnknownRunError, match="no run '0123abcd'"):  # raised, as before
            http.get("/v1/runs/0123abcd")
    served = create_gateway(settings)  # what `evalq serve` runs: the same request needs a token
    with httpx.Client(base_url=URL, transport=AppTransport(served)) as http:
        assert http.get("/v1/whoami").status_code == 401


def test_a_command_s_dropped_client_closes_its_connections(redis_only: RedisServer) -> None:
    """Commands drop their client without closing it; run in a process that goes on (a test,
    a notebook), the client's Redis and broker connections must close when it goes."""
    settings = Settings(redis_url=redis_only.url, principal="op")
    probe = connect(redis_only.url)

    def connections() -> int:
        return len(probe.client_list())

    before = connections()
    for _ in range(3):
        client = open_api(settings)
        assert client.recent(5) == []
        assert connections() > before
        del client
        # the client closes its sockets at once; the server drops a closed one from its list
        # when its event loop reads the close, which may come after the probe's next command
        wait_for(lambda: connections() == before, 10, "the dropped client's connections closed")


def test_the_operator_is_not_held_to_the_gateways_rate_limits(redis_only: RedisServer) -> None:
    """A rate of one request in 1000 s: a caller's second request is refused for longer than
    the client waits (exit 3); the operator's dozens are all answered."""
    settings = Settings(
        redis_url=redis_only.url, principal="op", gateway_rate=0.001, gateway_admin_rate=0.001,
        gateway_burst=1, gateway_inflight=1,
    )  # fmt: skip
    client = open_api(settings)
    try:
        assert isinstance(client, RemoteClient)
        for _ in range(30):
            assert client.recent(5) == []
            assert client.tiers() == {}
    finally:
        client.close()


def test_a_direct_follow_prints_the_first_result_before_the_run_ends(
    stack: Stack, tmp_path: Path
) -> None:
    """``results --follow`` in direct mode writes each result as it is settled: the first
    line comes while the run's gated samples still wait (a response read whole would hold
    every line until the run ended, which it cannot before the gate opens)."""
    write_rows(tmp_path / "data", "validation", labelled_rows(120))
    name = list_splits(stack.client, str(tmp_path / "data"), "validation")
    gate = tmp_path / "gate"
    operator = Client(stack.settings)
    params = {"gate": str(gate), "open_until": "64"}
    request = SubmitRequest(eval="slow", dataset=name, split="validation", params=params)
    run_id = operator.submit(request).run_id
    command = [sys.executable, "-c", "from evalq.shared.cli import main; main()", "results",
               run_id, "--follow"]  # fmt: skip
    with subprocess.Popen(
        command, env=cli_env(stack.server.url), cwd=REPO, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True,
    ) as follow:  # fmt: skip
        assert follow.stdout is not None
        reader = ThreadPoolExecutor(1)
        try:
            try:
                first = reader.submit(follow.stdout.readline).result(timeout=FIRST_LINE_WAIT)
            except TimeoutError:
                raise AssertionError(str(operator.status(run_id).progress)) from None
            assert json.loads(first)["sample_id"] < 64, operator.status(run_id).progress
            assert operator.status(run_id).meta.status.active  # the gated samples still wait
        finally:
            gate.touch()
            reader.shutdown()
        rest = follow.stdout.read()  # from the file read from: it may hold lines past the first
        assert follow.wait(timeout=120) == 0
    wait_completed(stack.client, run_id)
    ids = sorted(json.loads(line)["sample_id"] for line in [first, *rest.splitlines()])
    assert ids == list(range(120))
    operator.close()


def test_run_counts_are_one_route_both_modes_and_the_cli_call(
    redis_only: RedisServer, tmp_path: Path
) -> None:
    """``GET /v1/runs/counts`` (one route over ``Client.run_counts``): the operator counts
    everyone's runs (or one principal's) through ``evalq api`` in direct mode, a user only its
    own through the gateway's app with its token, whatever principal it asks for."""
    settings = Settings(redis_url=redis_only.url, plugins=("tests.plugins",), principal="op")
    client = Client(settings)
    write_rows(tmp_path / "data", "validation", labelled_rows(4))
    name = list_splits(client._direct.redis, str(tmp_path / "data"), "validation")
    request = SubmitRequest(eval="slow", dataset=name, split="validation")
    alice, bob = (Client(settings, principal=who) for who in ("alice", "bob"))
    first = alice.submit(request).run_id
    queued = alice.submit(request).run_id
    bob.submit(request)
    alice.cancel(first)

    def direct(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-c", "from evalq.shared.cli import main; main()", "api"]
        env = cli_env(redis_only.url, EVALQ_PRINCIPAL="op")
        env.pop("EVALQ_API_URL", None)
        return subprocess.run(
            [*command, *args], env=env, capture_output=True, text=True, check=False
        )

    everyone = direct("/v1/runs/counts")
    assert (everyone.returncode, json.loads(everyone.stdout)) == (0, {"queued": 2, "cancelled": 1})
    hers = direct("/v1/runs/counts", "-f", "principal=alice", "-f", "status=queued")
    assert json.loads(hers.stdout) == {"queued": 1}
    refused = direct("/v1/runs/counts", "-f", "principal")
    assert (refused.returncode, refused.stderr.strip()) == (
        2, "error: --field 'principal': expected KEY=VALUE"
    )  # fmt: skip
    stream = direct(f"/v1/runs/{queued}/events")  # a stream that never ends (no worker)
    assert (stream.returncode, stream.stderr.strip()) == (
        2, f"error: /v1/runs/{queued}/events answers no single JSON value (its answer is "
        "text/event-stream)",
    )  # fmt: skip
    token = client.create_token("alice", Role.USER)
    served = create_gateway(settings)
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=URL, transport=AppTransport(served), headers=headers) as http:
        assert http.get("/v1/runs/counts").json() == {"queued": 1, "cancelled": 1}
        assert http.get("/v1/runs/counts", params={"principal": "bob"}).json() == {}


def test_comparing_one_run_says_why_in_both_modes(redis_only: RedisServer, tmp_path: Path) -> None:
    """One run is refused by the service's own check (exit 2, its words), in direct mode and
    through the gateway alike, not by the route's request bounds."""
    settings = Settings(redis_url=redis_only.url, plugins=("tests.plugins",), principal="alice")
    client = Client(settings)
    write_rows(tmp_path / "data", "validation", labelled_rows(4))
    name = list_splits(client._direct.redis, str(tmp_path / "data"), "validation")
    run_id = client.submit(SubmitRequest(eval="slow", dataset=name, split="validation")).run_id
    command = [sys.executable, "-c", "from evalq.shared.cli import main; main()", "compare", run_id]
    env = cli_env(redis_only.url, EVALQ_PRINCIPAL="alice")
    env.pop("EVALQ_API_URL", None)
    direct = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    why = "compare needs two or more different runs"
    assert (direct.returncode, direct.stderr.strip()) == (2, f"error: {why}")
    token = client.create_token("alice", Role.USER)
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(
        base_url=URL, transport=AppTransport(create_gateway(settings)), headers=headers
    ) as http:
        answer = http.get("/v1/compare", params={"run": run_id})
    assert (answer.status_code, answer.json()["error"], answer.json()["exit_code"]) == (400, why, 2)
