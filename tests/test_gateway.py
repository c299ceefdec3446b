"""The trust boundary, end to end: a real redis-server running the ACL file ``evalq acl`` writes,
workers holding only the ``worker`` credential, the gateway (``evalq serve``) on uvicorn on a
free port, and the ``evalq`` CLI holding only a token (its ``EVALQ_REDIS_URL`` points nowhere)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from evalq.producer.operations.acl import write_acl
from evalq.producer.operations.redis_server import RedisServer, free_port
from evalq.producer.operations.workers import LocalWorkers
from evalq.producer.service.client import Client
from evalq.shared.access.policy import Tier
from evalq.shared.access.roles import Role
from evalq.shared.connection import connect
from evalq.shared.keys import AUDIT, DATASETS, PRIORITIES, TOKENS, RunKeys, budget_key, tiers_key
from evalq.shared.models import RunStatus
from evalq.shared.queue.celery_app import create_app
from evalq.shared.settings import Settings
from evalq.shared.store.reader import ResultReader
from tests.helpers import (
    NOWHERE,
    REPO,
    audit_entries,
    cli_in_process,
    gateway,
    labelled_rows,
    wait_for,
    write_rows,
)

pytestmark = pytest.mark.integration

PASSWORDS = {
    "EVALQ_ACL_GATEWAY_PASSWORD": "gateway-password-1",
    "EVALQ_ACL_WORKER_PASSWORD": "worker-password-22",
    "EVALQ_ACL_MONITOR_PASSWORD": "monitor-password-333",
}
HIDDEN = "HIDDEN-ROW"


@dataclass
class Door:
    """Everything behind the gateway, and the tokens in front of it."""

    server: RedisServer
    root: Path
    api: str
    admin_token: str
    alice: str
    bob: str
    operator: Client

    def url(self, user: str) -> str:
        return _url(self.server, user)

    def redis(self, user: str) -> redis.Redis:
        return connect(self.url(user), retries=0)

    def _env(self, token: str, home: Path | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("EVALQ_")}
        env.update(
            PYTHONPATH=str(REPO),
            EVALQ_API_URL=self.api,
            EVALQ_TOKEN=token,
            EVALQ_REDIS_URL=NOWHERE,
            HF_HOME=str(home or self.root / "caller-hf"),
            HF_DATASETS_CACHE=str((home or self.root / "caller-hf") / "datasets"),
        )
        return env

    def cli(
        self, token: str, *args: str, home: Path | None = None, own_process: bool = False
    ) -> subprocess.CompletedProcess[str]:
        """``evalq ARGS`` through the gateway, holding ``token`` and no Redis URL that works:
        run in this process (:func:`tests.helpers.cli_in_process`) for what a command answers;
        in a process of its own when told, or with ``home``, the caller's Hugging Face cache
        (``datasets`` reads it once, at import)."""
        if home is None and not own_process:
            return cli_in_process(self._env(token), *args)
        return subprocess.run(
            [sys.executable, "-c", "from evalq.shared.cli import main; main()", *args],
            env=self._env(token, home), cwd=REPO, capture_output=True, text=True, timeout=120,
            check=False,
        )  # fmt: skip


def _url(server: RedisServer, user: str) -> str:
    """The URL of ACL user ``user`` (gateway, worker, monitor) of ``server``."""
    password = PASSWORDS[f"EVALQ_ACL_{user.upper()}_PASSWORD"]
    return f"redis://{user}:{password}@127.0.0.1:{server.port}/0"


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Door]:
    root = tmp_path_factory.mktemp("door")
    saved = {k: os.environ.get(k) for k in PASSWORDS}
    os.environ.update(PASSWORDS)
    try:
        write_acl(root / "users.acl")
    finally:
        for key, value in saved.items():
            os.environ.pop(key) if value is None else os.environ.update({key: value})
    server = RedisServer(root / "redis", appendonly=True, aclfile=root / "users.acl").start()
    settings = Settings(
        redis_url=_url(server, "gateway"), plugins=("tests.plugins",), principal="op"
    )
    operator = Client(settings)
    data = root / "data"
    write_rows(data, "validation", labelled_rows(30))
    write_rows(data, "test", labelled_rows(10))
    hidden = [{**row, "text": f"{HIDDEN} {row['text']}"} for row in labelled_rows(20)]
    write_rows(data, "hidden", hidden)
    operator.add_dataset("ds", str(data))
    operator.set_tier("ds", "validation", Tier.VIEWABLE)
    operator.set_tier("ds", "test", Tier.NO_ACCESS)
    operator.set_tier("ds", "hidden", Tier.NON_VIEWABLE)
    tokens = {p: operator.create_token(p, r) for p, r in
              [("root", Role.ADMIN), ("alice", Role.USER), ("bob", Role.USER)]}  # fmt: skip
    workers = LocalWorkers(
        _url(server, "worker"),
        env={"EVALQ_PLUGINS": "tests.plugins", "PYTHONPATH": str(REPO), "EVALQ_MAX_BATCH": "16"},
        log_dir=root / "workers",
    )
    (root / "workers").mkdir()
    workers.start(create_app(settings))
    try:
        # no per-principal rate: the module's tests send alice's requests in bursts on purpose
        # (every route three times, a fuzzer), and a 429 answers before any route runs, which
        # let them pass without reaching the routes and failed the next test's first request;
        # the rate itself is tests/test_gateway_limits.py's
        unlimited = {"EVALQ_GATEWAY_RATE": "0", "EVALQ_GATEWAY_ADMIN_RATE": "0"}
        with gateway(_url(server, "gateway"), root / "gateway.log", **unlimited) as (api, _):
            yield Door(server, root, api, tokens["root"], tokens["alice"], tokens["bob"], operator)
    finally:
        workers.stop()
        operator.close()
        server.stop()


def _run_id(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    return str(json.loads(result.stdout.splitlines()[0])["run_id"])


def test_a_user_token_submits_watches_and_streams_results(door: Door, tmp_path: Path) -> None:
    followed = door.cli(door.alice, "submit", "spy", "--dataset", "ds", "--split", "validation",
                        "--limit", "20", "--follow", "--json")  # fmt: skip
    run_id = _run_id(followed)
    last = json.loads(followed.stdout.splitlines()[-1])
    assert (last["status"], set(last["aggregate"])) == ("completed", {"correct", "saw_label"})
    rows = door.cli(door.alice, "results", run_id).stdout.splitlines()
    assert sorted(json.loads(r)["sample_id"] for r in rows) == list(range(20))
    assert all("scores" in json.loads(r) for r in rows)
    streamed = door.cli(door.alice, "results", run_id, "--follow")
    assert streamed.returncode == 0
    assert len(streamed.stdout.splitlines()) == 20
    status = json.loads(door.cli(door.alice, "status", run_id, "--json").stdout)
    assert (status["principal"], status["tier"]) == ("alice", "viewable")
    listed = json.loads(door.cli(door.alice, "runs", "--json").stdout)
    assert {r["principal"] for r in listed} == {"alice"}
    report = tmp_path / "r.html"
    assert door.cli(door.alice, "report", run_id, "--out", str(report)).returncode == 0
    assert "<html" in report.read_text()
    # the principal comes from the token, whatever the caller's environment says
    assert door.operator.status(run_id).meta.principal == "alice"


def test_refusals_exit_3_change_nothing_and_are_audited(door: Door, tmp_path: Path) -> None:
    mine = _run_id(door.cli(door.bob, "submit", "spy", "--dataset", "ds", "--split", "validation",
                            "--limit", "5", "--json"))  # fmt: skip
    gateway = door.redis("gateway")
    keys = [DATASETS, TOKENS, tiers_key("ds"), budget_key("ds", "validation")]
    before = {k: gateway.dump(k) for k in keys}
    policy = tmp_path / "p.yaml"
    policy.write_text("datasets: {ds: {test: {tier: viewable}}}\n")
    audited = len(audit_entries(gateway))
    refused = [
        ("submit", "spy", "--dataset", "ds", "--split", "test"),
        ("submit", "spy", "--data", str(door.root / "data"), "--split", "test"),
        ("submit", "spy", "--dataset", "ds", "--split", "validation", "--admin"),
        ("submit", "spy", "--dataset", "ds", "--split", "validation", "--priority", "high"),
        ("tiers", "set", "ds", "test", "viewable"),
        ("budget", "set", "ds", "validation", "--runs", "100000"),
        ("policy", "apply", str(policy)),
        ("datasets", "add", "mine", "--data", str(door.root / "data")),
        ("tokens", "create", "eve", "--role", "admin"),
        ("tokens", "list"),
        ("audit",),
        ("purge", "--run", mine),
        ("purge", "--older-than", "1s"),
        ("cancel", mine),
        ("status", mine),
        ("results", mine),
    ]
    for i, args in enumerate(refused):
        # the first in its own process (nothing but the one line on stderr, from start-up to
        # exit), the others in this one: the same command, environment, status and output
        result = door.cli(door.alice, *args, own_process=i == 0)
        assert result.returncode == 3, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert result.stderr.startswith(("error: forbidden: ", "error: tier refused: ")), args
    unknown = door.cli(door.alice, "submit", "spy", "--dataset", "nope", "--split", "test")
    assert (unknown.returncode, unknown.stderr.strip()) == (2, "error: unknown dataset 'nope'")
    bad = door.cli("evalq_not-a-token", "runs")
    assert (bad.returncode, bad.stderr.strip()) == (
        3,
        "error: unauthorized: unknown or revoked token",
    )
    assert {k: gateway.dump(k) for k in keys} == before
    assert door.operator.status(mine).meta.status is not RunStatus.CANCELLED
    entries = audit_entries(gateway)[audited:]
    refusals = [e for e in entries if e["action"] == "refused"]
    assert [e["who"] for e in refusals] == ["alice"] * len(refused) + ["anonymous"]
    assert all(json.loads(e["after"])["reason"] for e in refusals)
    # a missing split is named as such (exit 2), not as a tier refusal
    typo = door.cli(door.alice, "submit", "spy", "--dataset", "ds", "--split", "valdation")
    assert typo.returncode == 2
    assert typo.stderr.strip() == (
        "error: dataset 'ds' has no split 'valdation' (splits: hidden, test, validation)"
    )


def test_no_alias_of_a_held_out_file_yields_its_rows(door: Door, tmp_path: Path) -> None:
    held_out = door.root / "data" / "test.jsonl"
    alias = tmp_path / "alias"
    alias.mkdir()
    (alias / "train.jsonl").symlink_to(held_out)
    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / "train.jsonl").write_bytes(held_out.read_bytes())
    # a caller cannot name a path at all
    for folder in (alias, tmp_path / "copy"):
        result = door.cli(door.alice, "submit", "spy", "--data", str(folder), "--split", "train")
        assert result.returncode == 3
        assert "not a registered dataset" in result.stderr
    # an admin cannot register a link or a copy of a registered split under another name
    for name, folder in (("alias", alias), ("copy", tmp_path / "copy")):
        result = door.cli(door.admin_token, "datasets", "add", name, "--data", str(folder))
        assert result.returncode == 2, result.stderr
        assert "has the same content as ds/test" in result.stderr
    # nor inside one folder: a split that links to its sibling's file
    inside = tmp_path / "inside"
    write_rows(inside, "test", labelled_rows(5))
    (inside / "train.jsonl").symlink_to(inside / "test.jsonl")
    result = door.cli(door.admin_token, "datasets", "add", "inside", "--data", str(inside))
    assert result.returncode == 2
    assert "hold files of the same content" in result.stderr
    listed = json.loads(door.cli(door.alice, "datasets", "list", "--json").stdout)
    assert [d["name"] for d in listed] == ["ds"]
    # a user sees names and splits, not sources: a small file's digest is a label oracle
    assert (listed[0]["data"], set(listed[0]["splits"].values())) == ("", {None})
    assert "sha256" in door.cli(door.admin_token, "datasets", "list", "--json").stdout


def test_the_worker_credential_cannot_touch_policy_and_the_monitor_sees_no_sample(
    door: Door,
) -> None:
    run_id = _run_id(door.cli(door.alice, "submit", "spy", "--dataset", "ds", "--split", "hidden",
                              "--follow", "--json"))  # fmt: skip
    assert door.operator.status(run_id).meta.status is RunStatus.COMPLETED  # workers: worker cred
    worker = door.redis("worker")
    for key in (budget_key("ds", "validation"), tiers_key("ds"), TOKENS, DATASETS, PRIORITIES):
        with pytest.raises(redis.exceptions.NoPermissionError):
            worker.hset(key, "x", "1")
    with pytest.raises(redis.exceptions.NoPermissionError):
        worker.xadd(AUDIT, {"action": "forged"})
    for name in ("team.pidbox", "x.celery.pidbox"):  # names that would match a broker pattern
        assert door.cli(door.admin_token, "tiers", "set", name, "test", "viewable").returncode == 2
    monitor = door.redis("monitor")
    with pytest.raises(redis.exceptions.NoPermissionError):
        monitor.lpush("infer", "forged")
    for key in (RunKeys(run_id).score, RunKeys(run_id).out):
        with pytest.raises(redis.exceptions.NoPermissionError):
            monitor.hgetall(key)
    assert monitor.hget(RunKeys(run_id).meta, "status") == "completed"
    with pytest.raises(redis.exceptions.NoPermissionError):
        monitor.hset(RunKeys(run_id).meta, "status", "queued")


def test_a_non_viewable_submit_leaves_the_callers_cache_empty(door: Door, tmp_path: Path) -> None:
    home = tmp_path / "hf"
    result = door.cli(door.alice, "submit", "spy", "--dataset", "ds", "--split", "hidden",
                      "--follow", home=home)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert not home.exists() or not any(p.is_file() for p in home.rglob("*"))
    assert "aggregate withheld" not in result.stdout  # 20 samples: the aggregate is shown
    refused = door.cli(door.alice, "results", result.stdout.split()[0], home=home)
    assert refused.returncode == 3


def _per_sample(body: str) -> bool:
    return HIDDEN in body or '"sample_id"' in body


def test_every_route_answers_without_5xx_or_hidden_samples(door: Door) -> None:
    run_id = _run_id(door.cli(door.alice, "submit", "spy", "--dataset", "ds", "--split", "hidden",
                              "--follow", "--json"))  # fmt: skip
    schema = httpx.get(f"{door.api}/openapi.json").json()
    headers = {"Authorization": f"Bearer {door.alice}"}
    with httpx.Client(base_url=door.api, headers=headers, timeout=60) as http:
        for path, operations in schema["paths"].items():
            for method in operations:
                url = path.replace("{run_id}", run_id).replace("{dataset}", "ds")
                url = url.replace("{split}", "hidden").replace("{principal}", "alice")
                for params in ({}, {"admin": "true"}, {"follow": "true"}):
                    answer = http.request(method, url, params=params, json={})
                    assert answer.status_code < 500, (method, url, answer.text)
                    assert not _per_sample(answer.text), (method, url, answer.text[:200])


def test_no_page_on_the_gateways_origin_loads_or_runs_a_script_from_elsewhere(door: Door) -> None:
    """The viewer's attack review: FastAPI's /docs and /redoc loaded Swagger UI and ReDoc from
    a CDN onto the origin where the viewer keeps the token (and read it); the HTML report had
    no policy at all."""
    run_id = _run_id(door.cli(door.alice, "submit", "spy", "--dataset", "ds", "--split", "hidden",
                              "--follow", "--json"))  # fmt: skip
    headers = {"Authorization": f"Bearer {door.alice}"}
    with httpx.Client(base_url=door.api, headers=headers, timeout=60) as http:
        for page in ("/docs", "/redoc", "/docs/oauth2-redirect"):
            assert http.get(page).status_code == 404, page
        assert http.get("/openapi.json").status_code == 200
        report = http.get(f"/v1/runs/{run_id}/report")
    assert report.status_code == 200
    policy = report.headers["content-security-policy"]
    assert "default-src 'none'" in policy
    assert "script-src" not in policy
    assert report.headers["x-content-type-options"] == "nosniff"


def test_the_openapi_schema_fuzzed_never_answers_5xx_or_hidden_samples(door: Door) -> None:
    """schemathesis generates requests from the schema (valid and not), sent with a user
    token; half of those naming a run name the user's own non_viewable run."""
    import schemathesis
    from hypothesis import HealthCheck, given, settings

    run_id = _run_id(door.cli(door.alice, "submit", "spy", "--dataset", "ds", "--split", "hidden",
                              "--follow", "--json"))  # fmt: skip
    schema = schemathesis.openapi.from_url(f"{door.api}/openapi.json")
    headers = {"Authorization": f"Bearer {door.alice}"}
    answered: list[int] = []
    for operation in schema.get_all_operations():

        @settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
        @given(case=operation.ok().as_strategy())  # type: ignore[union-attr]
        def check(case: Any) -> None:
            if "run_id" in (case.path_parameters or {}) and len(answered) % 2:
                case.path_parameters["run_id"] = run_id
            response = case.call(base_url=door.api, headers=headers)
            answered.append(response.status_code)
            assert response.status_code < 500, (case.method, case.path, response.text)
            assert not _per_sample(response.text), (case.method, case.path)

        check()
    assert len(answered) > 100


def test_flower_and_metrics_work_with_the_monitor_credential(door: Door, tmp_path: Path) -> None:
    from evalq.producer.operations.metrics import serve
    from tests.test_monitoring import FLOWER_AUTH, _get, _ok

    port = free_port()
    env = {**os.environ, "EVALQ_REDIS_URL": door.url("monitor"), "PYTHONPATH": str(REPO)}
    with (tmp_path / "flower.log").open("wb") as log:
        flower = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "evalq.worker.celery", "flower",
             f"--port={port}", "--address=127.0.0.1", f"--basic-auth={':'.join(FLOWER_AUTH)}",
             "--persistent=False"],
            env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    metrics = serve(door.redis("monitor"), "127.0.0.1", 0)
    try:
        wait_for(lambda: _ok(f"{base}/healthcheck"), 60, "flower to answer")
        run_id = _run_id(door.cli(door.alice, "submit", "spy", "--dataset", "ds",
                                  "--split", "validation", "--follow", "--json"))  # fmt: skip
        workers = wait_for(
            lambda: _get(f"{base}/api/workers?refresh=1", FLOWER_AUTH), 60, "flower's workers"
        )
        assert any(name.startswith("evalq-") for name in workers)

        def tasks_of_the_run() -> list[str]:
            tasks: dict[str, Any] = _get(f"{base}/api/tasks", FLOWER_AUTH)
            shown = [json.dumps([t.get("args"), t.get("kwargs")]) for t in tasks.values()]
            return [s for s in shown if run_id in s]

        assert wait_for(tasks_of_the_run, 60, "the run's tasks in flower")
        scraped = urllib.request.urlopen(f"http://127.0.0.1:{metrics.port}/metrics").read()
        assert f'run="{run_id}"'.encode() in scraped
    finally:
        metrics.close()
        flower.terminate()
        flower.wait(30)


def test_shards_cut_by_the_label_show_a_user_no_per_shard_counts(
    door: Door, tmp_path: Path
) -> None:
    """A kmeans routing on the label, by an evaluation with no label fields, would make the
    report's per-shard counts a label histogram of the rows (differenced run by run: each row's
    label); on a non_viewable split a user's report withholds them, an admin's shows them."""
    kmeans = ("--routing", "kmeans", "--route-field", "label", "--shards", "3",
              "--router-sample", "20")  # fmt: skip
    run_id = _run_id(door.cli(door.alice, "submit", "churn", "--dataset", "ds", "--split",
                              "hidden", *kmeans, "--follow", "--json"))  # fmt: skip
    user, admin = tmp_path / "user.html", tmp_path / "admin.html"
    assert door.cli(door.alice, "report", run_id, "--out", str(user)).returncode == 0
    assert 'data-chart="shards"' not in user.read_text()
    assert "per-sample results are not readable" in user.read_text()
    made = door.cli(door.admin_token, "report", run_id, "--admin", "--out", str(admin))
    assert made.returncode == 0, made.stderr
    assert 'data-chart="shards"' in admin.read_text()


def test_re_pinning_cannot_move_held_out_content_to_another_split(
    door: Door, tmp_path: Path
) -> None:
    swap = tmp_path / "swap"
    swap.mkdir()
    for split, target in (("validation", "test"), ("test", "validation"), ("hidden", "hidden")):
        (swap / f"{split}.jsonl").symlink_to(door.root / "data" / f"{target}.jsonl")
    result = door.cli(door.admin_token, "datasets", "add", "ds", "--data", str(swap))
    assert result.returncode == 2
    assert "has the same content as ds/" in result.stderr
    source = door.operator.datasets()[0].splits["validation"]
    assert [Path(f.path).name for f in source.files] == ["validation.jsonl"]  # type: ignore[union-attr]


def test_a_token_or_url_with_stray_characters_is_one_line_that_never_shows_the_token(
    door: Door,
) -> None:
    spaced = door.cli(door.alice + "\n", "runs")
    assert spaced.returncode == 0, spaced.stderr  # surrounding whitespace is not the token's
    for bad in (door.alice + "é", door.alice[:10] + " " + door.alice[10:]):
        result = door.cli(bad, "runs")
        assert result.returncode == 2
        assert result.stderr.strip() == (
            "error: EVALQ_TOKEN is malformed (a token is letters, digits, '_' and '-')"
        )
        assert door.alice[6:] not in result.stderr


def test_a_path_that_is_no_file_nor_folder_is_an_input_error(door: Door) -> None:
    result = door.cli(door.admin_token, "datasets", "add", "devnull", "--data", "/dev/null")
    assert result.returncode == 2
    assert result.stderr.strip() == "error: /dev/null is neither a regular file nor a folder"


def test_an_admin_meters_a_new_caller_apart_and_revokes_it(door: Door) -> None:
    made = door.cli(door.admin_token, "tokens", "create", "carol", "--role", "user", "--json")
    assert made.returncode == 0, made.stderr
    carol = json.loads(made.stdout)["token"]
    assert "carol" in door.cli(door.admin_token, "tokens", "list").stdout
    assert carol not in json.dumps(door.redis("gateway").hgetall(TOKENS))  # only its digest
    metered = door.cli(door.admin_token, "budget", "set", "ds", "validation",
                       "--principal", "carol", "--runs", "1")  # fmt: skip
    assert metered.stdout.strip() == (
        "ds/validation for carol: runs 1/1 left, samples unlimited, max per run unlimited"
    )
    submit = ("submit", "spy", "--dataset", "ds", "--split", "validation", "--limit", "5")
    assert door.cli(carol, *submit).returncode == 0
    again = door.cli(carol, *submit)
    assert again.returncode == 3
    assert again.stderr.strip() == (
        "error: budget refused: ds/validation for carol has no runs left (1 in all)"
    )
    assert door.cli(door.bob, *submit).returncode == 0  # another caller is not carol's budget
    revoked = door.cli(door.admin_token, "tokens", "revoke", "carol")
    assert revoked.stdout.strip() == "revoked 1 token(s) of carol"
    assert door.cli(carol, "runs").returncode == 3


def test_a_gateway_whose_redis_is_down_answers_one_line_and_recovers(door: Door) -> None:
    """And nothing written before the restart is lost: Redis replays the AOF's transactions and
    script effects as ``default``, which the ACL file must leave able to run them."""

    def runs() -> list[tuple[str, str, int]]:
        views = door.operator.recent(1000)
        return [(v.meta.run_id, v.meta.status.value, v.progress.scored) for v in views]

    runs_before = runs()
    assert runs_before
    with pytest.raises(redis.exceptions.AuthenticationError):
        redis.Redis(port=door.server.port).ping()  # no password: refused
    door.server.stop()
    try:
        down = door.cli(door.alice, "runs")
        assert down.returncode == 1
        assert down.stderr.strip() == "error: the gateway cannot reach its Redis; try again"
    finally:
        door.server.start()
    wait_for(lambda: door.cli(door.alice, "runs").returncode == 0, 60, "the gateway to recover")
    assert runs() == runs_before
    log = (door.server.data_dir / "redis.log").read_text()
    assert "NOPERM" not in log


def test_a_user_does_not_choose_or_see_a_non_viewable_runs_samples(door: Door) -> None:
    chosen = door.cli(door.alice, "submit", "spy", "--dataset", "ds", "--split", "hidden",
                      "--ids", "0,1,2,3,4")  # fmt: skip
    assert chosen.returncode == 3
    assert "its samples are drawn by the server" in chosen.stderr
    drawn: list[list[int]] = []
    for _ in range(3):
        run_id = _run_id(door.cli(door.alice, "submit", "spy", "--dataset", "ds", "--split",
                                  "hidden", "--limit", "6", "--follow", "--json"))  # fmt: skip
        ids = [r.sample_id for r in ResultReader(door.redis("gateway")).results(run_id)]
        assert len(set(ids)) == 6
        assert all(0 <= i < 20 for i in ids)
        drawn.append(ids)
        for args in (("status", run_id, "--json"), ("runs", "--json")):
            shown = door.cli(door.alice, *args).stdout
            assert "sample_ids" not in shown
            assert json.dumps(ids) not in shown
    assert drawn != [list(range(6))] * 3  # not the split's head (odds of that: ~1e-12)


def test_a_user_sweeps_compares_and_rescores_its_own_runs_only(door: Door, tmp_path: Path) -> None:
    swept = door.cli(door.alice, "submit", "slow_score", "--dataset", "ds", "--split",
                     "validation", "--limit", "20", "--sweep", "score_ms=1,2", "--tag", "gw",
                     "--json")  # fmt: skip
    assert swept.returncode == 0, swept.stderr
    found = json.loads(swept.stdout)
    for run_id in found["run_ids"]:
        assert door.cli(door.alice, "watch", run_id).returncode == 0
    listed = json.loads(door.cli(door.alice, "runs", "--sweep", found["sweep"], "--json").stdout)
    assert sorted(v["run_id"] for v in listed) == sorted(found["run_ids"])
    compared = door.cli(door.alice, "compare", "--sweep", found["sweep"], "--json")
    assert compared.returncode == 0, compared.stderr
    assert json.loads(compared.stdout)["baseline"] == found["run_ids"][0]
    refused = door.cli(door.bob, "compare", *found["run_ids"])
    assert refused.returncode == 3
    assert "belongs to another principal" in refused.stderr
    bobs = door.cli(door.bob, "runs", "--sweep", found["sweep"], "--json").stdout
    assert json.loads(bobs) == []
    calls = tmp_path / "calls"
    rescored = door.cli(door.alice, "rescore", found["run_ids"][0], "--eval", "spy_close",
                        "--param", f"calls={calls}", "--follow", "--json")  # fmt: skip
    assert rescored.returncode == 0, rescored.stderr
    assert json.loads(rescored.stdout.splitlines()[-1])["status"] == "completed"
    assert not calls.exists()
    refused = door.cli(door.bob, "rescore", found["run_ids"][0], "--eval", "spy_close")
    assert refused.returncode == 3


def test_a_user_sees_no_spec_fingerprint_and_no_data_path(door: Door, tmp_path: Path) -> None:
    """A run's spec fingerprint hashes its data file's path and digest: with the path, an
    oracle for guessed labels of a small held-out file. A user sees it blank, and an error
    that names a data file shows the user ``<path>`` (the gateway logs it whole)."""
    data = tmp_path / "gone"
    write_rows(data, "validation", labelled_rows(10))
    door.operator.add_dataset("gone", str(data))
    door.operator.set_tier("gone", "validation", Tier.VIEWABLE)
    run_id = _run_id(door.cli(door.alice, "submit", "spy", "--dataset", "gone", "--split",
                              "validation", "--follow", "--json"))  # fmt: skip
    mine = json.loads(door.cli(door.alice, "status", run_id, "--json").stdout)
    assert (mine["spec"], mine["provenance"]["spec"]) == ("", "")
    root = json.loads(door.cli(door.admin_token, "status", run_id, "--json").stdout)
    assert len(root["spec"]) == 64
    assert root["spec"] not in door.cli(door.alice, "runs", "--json").stdout
    for file in data.iterdir():
        file.unlink()
    missing = door.cli(door.alice, "results", run_id, "--with-input")
    assert missing.returncode != 0
    assert "<path>" in missing.stderr
    assert str(data) not in missing.stderr
