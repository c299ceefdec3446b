"""Isolated inference: a model in a warm subprocess of its own that only ever receives
label-free rows. A candidate that walks the stack and the heap for rows holding labels finds
every label when its inference runs in the worker, and none when it is isolated. Run in its
sandbox, it finds no credential in any process's environment, cannot read the data, the archive
or the caches, and cannot reach Redis; no program a worker starts inherits its secrets."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from evalq.producer.operations.redis_server import RedisServer
from evalq.producer.operations.workers import LocalWorkers
from evalq.producer.service.submit import SubmitRequest, submit
from evalq.shared.connection import connect
from evalq.shared.errors import InputError, ModelHostError, PermanentError
from evalq.shared.evaluation import create, load_plugins
from evalq.shared.isolation import landlock
from evalq.shared.isolation.child_env import child_env
from evalq.shared.queue.celery_app import create_app
from evalq.shared.scorer import ScriptCall
from evalq.shared.services import Services
from evalq.shared.settings import Settings
from evalq.shared.store.reader import ResultReader
from evalq.worker.model_proxy import ModelProxy
from evalq.worker.runtime_pool import RuntimePool
from evalq.worker.script_pool import ScriptPool
from tests.conftest import Stack
from tests.helpers import (
    REPO,
    UNPRIVILEGED,
    cli_env,
    labelled_rows,
    list_splits,
    wait_completed,
    wait_for,
    write_rows,
)
from tests.plugins import FORGED

ROWS = [{"text": "a"}, {"text": "b"}]


@pytest.fixture
def host_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker's environment: the plugins importable, and a Redis URL with a password."""
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setenv("EVALQ_REDIS_URL", "redis://worker:secret@127.0.0.1:1/0")
    load_plugins(["tests.plugins"])


def _proxy(**params: str) -> ModelProxy:
    return ModelProxy(
        create("probe", params), device="cpu", plugins=["tests.plugins"], threads=1, timeout=60
    )


@pytest.mark.integration
@pytest.mark.usefixtures("host_env")
def test_an_isolated_model_runs_elsewhere_without_the_workers_secrets_or_modules() -> None:
    proxy = _proxy().start()
    try:
        seen = proxy.infer(ROWS)
    finally:
        proxy.close()
    assert len(seen) == 2
    assert seen[0]["pid"] != os.getpid()
    assert seen[0]["evalq_env"] == []
    assert seen[0]["dumpable"] == 0
    assert seen[0]["worker_loaded"] is False
    assert seen[0]["fields"] == ["text"]


@pytest.mark.integration
@pytest.mark.usefixtures("host_env")
def test_a_failing_infer_is_an_error_and_a_dead_host_is_replaced() -> None:
    raising = _proxy(fail="raise")
    with pytest.raises(ModelHostError, match="RuntimeError: the probe failed"):
        raising.infer(ROWS)
    with pytest.raises(ModelHostError, match="RuntimeError"):
        raising.infer(ROWS)
    assert raising.started == 1  # an exception in infer() keeps the model loaded
    raising.close()
    exiting = _proxy(fail="exit")
    with pytest.raises(ModelHostError, match=r"the model host exited \(code 3\)"):
        exiting.infer(ROWS)
    with pytest.raises(ModelHostError, match="exited"):
        exiting.infer(ROWS)
    assert exiting.started == 2
    exiting.close()


@pytest.mark.integration
@pytest.mark.usefixtures("host_env")
def test_what_is_not_json_is_a_permanent_error() -> None:
    nonjson = _proxy(fail="nonjson")
    with pytest.raises(PermanentError, match="output not JSON"):
        nonjson.infer(ROWS)
    with pytest.raises(PermanentError, match="sends rows as JSON"):
        nonjson.infer([{"text": object()}])
    nonjson.close()


@pytest.mark.integration
@pytest.mark.usefixtures("host_env")
def test_a_model_that_cannot_load_says_why() -> None:
    missing = ModelProxy(
        create("probe"), device="cpu", plugins=["no_such_plugin"], threads=None, timeout=60
    )
    with pytest.raises(ModelHostError, match="cannot load the model: PluginError"):
        missing.start()


@pytest.mark.integration
@pytest.mark.usefixtures("host_env")
def test_the_runtime_pool_isolates_on_request_and_stops_evicted_hosts() -> None:
    settings = Settings(
        device="cpu", max_models=1, isolate_inference=True, plugins=("tests.plugins",)
    )
    pool = RuntimePool(Services(settings, connect(settings.redis)))
    first = pool.model(create("probe"))(ROWS, [])[0]["pid"]
    assert pool.model(create("probe"))(ROWS, [])[0]["pid"] == first  # warm
    pool.model(create("probe", {"fail": "none"}))  # another spec: evicts the first host
    with pytest.raises(ProcessLookupError):
        os.kill(first, 0)
    pool.close()


def _leaked(stack: Stack, folder: Path, eval_name: str) -> tuple[float, list[object]]:
    rows = labelled_rows(20)
    write_rows(folder, "validation", rows)
    name = list_splits(stack.client, str(folder), "validation")
    request = SubmitRequest(eval=eval_name, dataset=name, split="validation")
    meta = submit(
        stack.client, stack.app, request, principal="tests", archive=stack.settings.archive_url
    )
    wait_completed(stack.client, meta.run_id)
    results = ResultReader(stack.client)
    aggregate = results.aggregate(meta.run_id)
    assert aggregate is not None
    outputs = results.outputs(meta.run_id, list(range(20)))
    return aggregate["leaked"], [outputs[i] for i in range(20)]


@pytest.mark.integration
def test_a_stack_walking_candidate_finds_labels_in_the_worker_and_none_isolated(
    stack: Stack, tmp_path: Path
) -> None:
    leaked, outputs = _leaked(stack, tmp_path / "in", "snoop")
    assert leaked == 1.0  # every label found in the worker's memory
    leaked, outputs = _leaked(stack, tmp_path / "out", "snoop_isolated")
    assert (leaked, set(outputs)) == (0.0, {None})


@pytest.mark.integration
def test_the_operator_setting_isolates_every_evaluation(fresh_stack: Stack, tmp_path: Path) -> None:
    fresh_stack.start_workers(EVALQ_ISOLATE_INFERENCE="1")
    leaked, outputs = _leaked(fresh_stack, tmp_path, "snoop")
    assert (leaked, set(outputs)) == (0.0, {None})


@pytest.mark.integration
def test_an_isolated_model_cannot_read_its_workers_environment_or_memory(
    stack: Stack, tmp_path: Path
) -> None:
    rows = labelled_rows(5)
    write_rows(tmp_path, "validation", rows)
    name = list_splits(stack.client, str(tmp_path), "validation")
    request = SubmitRequest(eval="probe", dataset=name, split="validation")
    meta = submit(
        stack.client, stack.app, request, principal="tests", archive=stack.settings.archive_url
    )
    wait_completed(stack.client, meta.run_id)
    seen = ResultReader(stack.client).outputs(meta.run_id, [0])[0]
    assert seen["ancestors_read"] == []  # the worker's /proc environ and mem: refused
    assert seen["evalq_env"] == []
    assert seen["fields"] == ["text"]  # every loaded evaluation's label fields scrubbed


def test_a_child_gets_only_the_allowlisted_environment(tmp_path: Path) -> None:
    worker = {
        "EVALQ_REDIS_URL": "redis://worker:secret@redis:6379/0",
        "EVALQ_TOKEN": "token",
        "OPENAI_API_KEY": "sk-secret",
        "AWS_SECRET_ACCESS_KEY": "aws-secret",
        "HF_TOKEN": "hf-secret",
        "HF_HOME": "/data/hf",
        "HF_HUB_OFFLINE": "1",
        "HOME": "/home/evalq",
        "TMPDIR": "/tmp/worker",
        "LD_PRELOAD": "/lib/evil.so",
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "CUDA_VISIBLE_DEVICES": "1",
        "PYTHONPATH": f"plugins{os.pathsep}/opt/evalq",
    }
    env = child_env(tmp_path, worker)
    assert env == {
        "HF_HUB_OFFLINE": "1",
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "CUDA_VISIBLE_DEVICES": "1",
        "PYTHONPATH": f"{Path.cwd() / 'plugins'}{os.pathsep}/opt/evalq",
        "HOME": str(tmp_path),
        "TMPDIR": str(tmp_path),
    }


@pytest.mark.usefixtures("host_env")
def test_a_scorer_process_runs_with_the_allowlist_and_is_not_dumpable() -> None:
    scorer = create("script_scored").scorer
    assert scorer is not None
    pool = ScriptPool(scorer, 1)
    try:
        pid = int(pool.call(ScriptCall(argv=["pid"])))
        dumpable = pool.call(ScriptCall(argv=["dumpable"]))
        environ = Path(f"/proc/{pid}/environ").read_bytes().decode()
    finally:
        pool.close()
    assert dumpable == "0"
    assert "EVALQ_" not in environ
    assert "secret" not in environ
    assert f"PYTHONPATH={REPO}" in environ.split("\0")


PASSWORD = "walker-password-7d3e91"
"""The Redis password of the worker the candidate attacks (an ACL user of the test's Redis)."""


@dataclass
class Walk:
    """What the ``walker`` candidate saw from its sandbox, and what the test knows."""

    seen: dict[str, Any]
    scorer_pids: set[int]
    """The worker's warm scorer processes that were alive before the walk and after it."""
    sandbox_log: list[str]
    forged: list[str]
    """The worker log's lines holding what the candidate wrote to its stderr."""


def _descendants(root: int) -> list[int]:
    """``root`` and every process under it, from each process's parent in ``/proc``."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if entry.name.isdigit():
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    tree = [root]
    for pid in tree:
        tree += [child for child, parent in parents.items() if parent == pid]
    return tree


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _worker_user(client: redis.Redis) -> None:
    """A Redis user ``worker`` with a real password (so a leaked credential is findable)."""
    client.acl_setuser(
        "worker", enabled=True, passwords=[f"+{PASSWORD}"], keys=["*"], channels=["*"],
        commands=["+@all"],
    )  # fmt: skip


@pytest.fixture(scope="module")
def walk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Walk]:
    """A worker holding a Redis password in its environment, run as an ordinary user runs it
    (no capability: a container's user has none), with warm scorer processes left by a first
    run; then an isolated candidate walks ``/proc`` and tries the first run's data file, the
    archive, the Hugging Face cache and Redis."""
    root = tmp_path_factory.mktemp("walk")
    server = RedisServer(root / "redis").start()
    client = connect(server.url)
    _worker_user(client)
    settings = Settings(
        redis_url=server.url, plugins=("tests.plugins",), archive_url=str(root / "archive")
    )
    app = create_app(settings)
    hf = root / "hf"
    workers = LocalWorkers(
        f"redis://worker:{PASSWORD}@127.0.0.1:{server.port}/0",
        env={**cli_env(server.url), "EVALQ_ARCHIVE_URL": settings.archive_url, "HF_HOME": str(hf)},
        log_dir=root,
        launcher=UNPRIVILEGED,
    )
    workers.start(app)
    try:
        data = write_rows(root / "data", "validation", labelled_rows(20))
        name = list_splits(client, str(root / "data"), "validation")
        request = SubmitRequest(eval="script_scored", dataset=name, split="validation")
        scored = submit(client, app, request, principal="tests", archive=str(root / "archive"))
        wait_completed(client, scored.run_id)
        scores = ResultReader(client).scores(scored.run_id).values()
        scorer_pids = {int(score["scorer_pid"]) for score in scores}
        archived = wait_for(
            lambda: next(Path(settings.archive_url).rglob("*.parquet"), None),
            what="the first run's archive",
        )
        cached = next(path for path in sorted(hf.rglob("*")) if path.is_file())
        params = {
            "pids": ",".join(map(str, _descendants(workers.processes[0].pid))),
            "needle": PASSWORD,
            "data": str(data),
            "archive": settings.archive_url,
            "archive_file": str(archived),
            "hf": str(hf),
            "hf_file": str(cached),
            "port": str(server.port),
        }
        request = SubmitRequest(eval="walker", dataset=name, split="validation", params=params)
        walked = submit(client, app, request, principal="tests", archive=str(root / "archive"))
        wait_completed(client, walked.run_id)
        seen = ResultReader(client).outputs(walked.run_id, [0])[0]
        alive = {pid for pid in scorer_pids if _alive(pid)}
        log = (root / "worker-0.log").read_text().splitlines()
        yield Walk(
            seen, alive, [line for line in log if "sandbox=" in line],
            [line for line in log if FORGED in line],
        )  # fmt: skip
    finally:
        workers.stop()
        client.close()
        server.stop()


@pytest.mark.integration
def test_an_isolated_candidate_finds_no_credential_in_any_process(walk: Walk) -> None:
    assert walk.scorer_pids  # warm all along: started by the first run, alive after the walk
    assert walk.seen["found"] == []  # no EVALQ_ variable, no password, in any environ or cmdline


@pytest.mark.integration
def test_an_isolated_candidate_cannot_write_a_line_of_its_worker_s_log(walk: Walk) -> None:
    """The host's stderr was the worker's log file: a candidate wrote a line dressed as the
    worker's own (the attack review). Its stderr is relayed, quoted and marked as the host's."""
    (line,) = walk.forged
    assert not line.startswith("[2026-01-01")
    assert "wrote: '[2026-01-01 00:00:00,000: ERROR/MainProcess] FORGED" in line


@pytest.mark.integration
@pytest.mark.skipif(landlock.abi() < 4, reason="needs Landlock ABI 4 (Linux 6.7+)")
def test_an_isolated_candidate_reads_no_data_archive_or_cache_and_reaches_no_redis(
    walk: Walk,
) -> None:
    assert walk.seen["access"] == {
        "data": "denied: PermissionError",
        "archive": "denied: PermissionError",
        "archive_file": "denied: PermissionError",
        "hf": "denied: PermissionError",
        "hf_file": "denied: PermissionError",
        "redis": "denied: PermissionError",
    }
    assert (walk.seen["listed"], walk.seen["readable"]) == (0, [])  # nothing of /proc at all
    assert len(walk.sandbox_log) == 1
    assert "sandbox=seccomp,landlock,landlock-tcp" in walk.sandbox_log[0]


def test_the_redis_url_can_come_from_a_file_instead_of_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = tmp_path / "redis-url"
    secret.write_text("redis://worker:from-a-file@redis:6379/0\n")
    monkeypatch.delenv("EVALQ_REDIS_URL", raising=False)
    monkeypatch.setenv("EVALQ_REDIS_URL_FILE", str(secret))
    settings = Settings()
    assert (settings.redis_url, settings.broker) == ("redis://worker:from-a-file@redis:6379/0",) * 2
    monkeypatch.setenv("EVALQ_REDIS_URL", "redis://other")
    with pytest.raises(InputError, match="not both"):
        Settings()
    monkeypatch.delenv("EVALQ_REDIS_URL")
    secret.write_text("\n")
    with pytest.raises(InputError, match="is empty"):
        Settings()
    monkeypatch.setenv("EVALQ_REDIS_URL_FILE", str(tmp_path / "missing"))
    with pytest.raises(InputError, match="cannot read EVALQ_REDIS_URL_FILE"):
        Settings()


@pytest.mark.integration
def test_a_worker_reading_its_url_from_a_file_holds_no_password_in_its_environment(
    fresh_stack: Stack, tmp_path: Path
) -> None:
    _worker_user(fresh_stack.client)
    secret = tmp_path / "redis-url"
    secret.write_text(f"redis://worker:{PASSWORD}@127.0.0.1:{fresh_stack.server.port}/0")
    secret.chmod(0o600)
    workers = fresh_stack.start_workers(EVALQ_REDIS_URL_FILE=str(secret))
    write_rows(tmp_path / "data", "validation", labelled_rows(5))
    name = list_splits(fresh_stack.client, str(tmp_path / "data"), "validation")
    request = SubmitRequest(eval="spy", dataset=name, split="validation")
    meta = submit(
        fresh_stack.client, fresh_stack.app, request, principal="tests",
        archive=fresh_stack.settings.archive_url,
    )  # fmt: skip
    wait_completed(fresh_stack.client, meta.run_id)
    clients = fresh_stack.client.client_list()
    assert any(entry.get("user") == "worker" for entry in clients)  # it logged in as worker
    for pid in _descendants(workers.processes[0].pid):
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        assert PASSWORD.encode() not in environ
        assert b"EVALQ_REDIS_URL=" not in environ
