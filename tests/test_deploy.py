"""The documented one-machine deployment: ``evalq up`` as a subprocess on free ports, the user
story through it (a token, a dataset, submits followed, a comparison, a report, Flower's
inspection, a metrics scrape), retention under it, no ``NOPERM`` in any process's log, and a
Ctrl-C that leaves no process behind. Before it, in process: each ACL user can do its own job
(the janitor's sweep as ``worker``, Flower's inspection as ``monitor``), a refused step
names its user and keys, every time, and ``evalq up`` refuses a taken port before it starts
anything."""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from evalq.producer.operations.acl import password_variable, write_acl
from evalq.producer.operations.redis_server import RedisServer, free_port
from evalq.producer.operations.supervise import Supervisor, Unit
from evalq.shared.connection import connect
from evalq.shared.errors import EvalqError, PortInUseError
from evalq.shared.guard import Guard
from evalq.shared.keys import AUDIT, RUNS, RunKeys
from evalq.shared.lm.limits import EndpointLimits
from evalq.shared.queue.broker import Broker
from evalq.shared.queue.celery_app import create_app
from evalq.shared.settings import Settings
from evalq.shared.store.endpoints import EndpointRegistry
from evalq.shared.store.rate import RateLimit, minute_counts
from evalq.shared.store.retention import retain
from evalq.worker.janitor import Janitor
from tests.helpers import REPO, answers, cli_in_process, labelled_rows, wait_for, write_rows

PASSWORDS = {password_variable(role): f"{role}-password-0123" for role in ("gateway", "worker",
             "monitor")}  # fmt: skip
REFUSED = re.compile(r"NOPERM|no permissions", re.IGNORECASE)


@pytest.fixture(scope="module")
def acl_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A redis-server running the ACL file ``evalq acl`` writes."""
    root = tmp_path_factory.mktemp("acl")
    write_acl(root / "users.acl", PASSWORDS)
    with RedisServer(root / "redis", aclfile=root / "users.acl") as server:
        yield server


def _url(server: RedisServer, role: str) -> str:
    return f"redis://{role}:{PASSWORDS[password_variable(role)]}@127.0.0.1:{server.port}/0"


@pytest.mark.integration
def test_the_janitor_sweeps_and_flower_inspects_under_their_own_users(
    acl_server: RedisServer,
) -> None:
    worker = Settings(redis_url=_url(acl_server, "worker"), keep_runs_days=1, audit_days=1)
    app = create_app(worker)
    client = connect(worker.redis_url, retries=0)
    broker = Broker(app, connect(worker.broker, retries=0))
    try:
        Janitor(client, broker, app, worker).sweep()  # was: NOPERM on evalq:audit
    finally:
        broker.close()
        client.close()
    monitor = create_app(Settings(redis_url=_url(acl_server, "monitor")))
    assert monitor.control.inspect(timeout=0.2).stats() is None  # no worker; was: NOPERM
    with pytest.raises(redis.exceptions.NoPermissionError):  # the monitor writes no queue
        connect(_url(acl_server, "monitor"), retries=0).lpush("infer", "forged")


@pytest.mark.integration
def test_a_worker_limits_endpoint_calls_but_cannot_list_an_endpoint(
    acl_server: RedisServer,
) -> None:
    operator = connect(_url(acl_server, "gateway"), retries=0)
    url = "http://127.0.0.1:9/v1"
    EndpointRegistry(operator).set(url, EndpointLimits(requests_per_minute=60), who="ops")
    worker = connect(_url(acl_server, "worker"), retries=0)
    listed = EndpointRegistry(worker).get(url)
    assert listed == EndpointLimits(requests_per_minute=60)
    rate = RateLimit(worker, url, listed)
    assert rate.take(10) == 0.0
    assert rate.take(10) > 0.0  # one a second: the next waits
    rate.adjust(-5)
    rate.count(requests=1, tokens=10)
    monitor = connect(_url(acl_server, "monitor"), retries=0)
    assert minute_counts(monitor, [url])[url]["requests"] >= 1
    with pytest.raises(redis.exceptions.NoPermissionError):  # was a way to any server
        EndpointRegistry(worker).set(url, EndpointLimits(), who="worker")


@pytest.mark.integration
def test_a_refused_step_names_its_user_and_keys_every_time(
    acl_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    worker = connect(_url(acl_server, "worker"), retries=0)
    settings = Settings(redis_url=_url(acl_server, "worker"), keep_runs_days=1)
    guard = Guard(logging.getLogger("evalq.test"), "retention")
    with caplog.at_level(logging.ERROR, logger="evalq.test"):
        for _ in range(3):
            assert not guard.run("pass", lambda: retain(worker, settings))
    lines = [r.getMessage() for r in caplog.records]
    assert (
        lines
        == [
            "retention pass refused: NOPERM: Redis user 'worker' may not XTRIM evalq:audit: "
            "this user has no permissions to access one of the keys used as arguments"
        ]
        * 3
    )
    with worker.pipeline(transaction=True) as pipe:  # in a transaction, the refused command
        pipe.hset(RunKeys("ab").meta, "status", "running")
        pipe.unlink(RunKeys("ab").facts, RunKeys("ab").meta)
        with pytest.raises(redis.exceptions.NoPermissionError) as refused:
            pipe.execute()
    assert str(refused.value).startswith(
        f"NOPERM: Redis user 'worker' may not UNLINK {RunKeys('ab').facts} {RunKeys('ab').meta}: "
    )


@dataclass
class Up:
    """A running ``evalq up`` and what it printed."""

    process: subprocess.Popen[bytes]
    root: Path
    printed: Path
    api: str
    flower: str
    metrics: str

    def admin_token(self) -> str:
        found = re.search(r"admin token: (\S+)", self.printed.read_text())
        assert found is not None, self.printed.read_text()
        return found.group(1)

    def operator(self) -> redis.Redis:
        """The gateway user, from the URL file ``evalq up`` wrote for the operator."""
        return connect((self.root / "secrets" / "gateway.url").read_text().strip(), retries=0)

    def cli(self, token: str, *args: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("EVALQ_")}
        env.update(PYTHONPATH=str(REPO), EVALQ_API_URL=self.api, EVALQ_TOKEN=token)
        return subprocess.run(
            [sys.executable, "-c", "from evalq.shared.cli import main; main()", *args],
            env=env, cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip

    def flower_get(self, path: str) -> Any:
        auth = base64.b64encode((self.root / "secrets" / "flower.auth").read_bytes().strip())
        request = urllib.request.Request(f"{self.flower}{path}")
        request.add_header("Authorization", f"Basic {auth.decode()}")
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def logs(self) -> dict[Path, str]:
        files = [*sorted((self.root / "logs").glob("*.log")), self.root / "redis" / "redis.log"]
        return {path: path.read_text(errors="replace") for path in files}


def test_a_process_that_keeps_exiting_is_restarted_after_a_doubling_delay_then_left_down(
    tmp_path: Path,
) -> None:
    """The supervisor's clock is the caller's: each check is given its time."""
    starts: list[float] = []
    running = False

    def start() -> None:
        nonlocal running
        if len(starts) == 2:
            starts.append(-1.0)
            raise EvalqError("port 1 (redis) is in use")
        starts.append(0.0)
        running = True

    def poll() -> int | None:
        nonlocal running
        was, running = running, False
        return 3 if was else None

    running = True
    log = tmp_path / "worker-0.log"
    supervisor = Supervisor([Unit("worker 0", log, poll, start)], now=0.0)
    times = (1.0, 1.5, 2.0, 2.5, 4.5, 5.0, 9.0, 17.0, 17.5, 18.0, 200.0)
    said = {t: supervisor.check(t) for t in times}
    exited = f"worker 0 exited with status 3 (its log: {log})"
    assert said == {
        1.0: [f"{exited}; restarting it in 1s"],
        1.5: [],
        2.0: ["worker 0 restarted"],
        2.5: [f"{exited}; restarting it in 2s"],
        4.5: ["worker 0 restarted"],
        5.0: [f"{exited}; restarting it in 4s"],
        9.0: [
            f"worker 0 did not start: port 1 (redis) is in use (its log: {log}); "
            "restarting it in 8s"
        ],
        17.0: ["worker 0 restarted"],
        17.5: [f"error: {exited}; it exited 5 times within 60s: left down (Ctrl-C stops the rest)"],
        18.0: [],
        200.0: [],  # never started again
    }
    assert len(starts) == 4
    assert supervisor.left_down == ["worker 0"]


def test_a_process_that_ran_a_minute_is_restarted_after_a_second(tmp_path: Path) -> None:
    codes = iter([1, None, None, 1])
    unit = Unit("metrics", tmp_path / "m.log", lambda: next(codes), lambda: None)
    supervisor = Supervisor([unit], now=0.0)
    assert supervisor.check(0.5) == [
        f"metrics exited with status 1 (its log: {unit.log}); restarting it in 1s"
    ]
    assert supervisor.check(1.5) == ["metrics restarted"]
    assert supervisor.check(30.0) == []
    assert supervisor.check(61.5) == []
    assert supervisor.check(70.0) == [
        f"metrics exited with status 1 (its log: {unit.log}); restarting it in 1s"
    ]


@pytest.fixture
def taken() -> Iterator[int]:
    """A loopback port something else listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


@pytest.mark.integration
def test_a_redis_server_is_not_started_on_a_taken_port(taken: int, tmp_path: Path) -> None:
    with pytest.raises(PortInUseError, match=f"port {taken} \\(redis\\) is in use"):
        RedisServer(tmp_path, port=taken).start()


@pytest.mark.integration
@pytest.mark.parametrize("flag", ["port", "flower-port", "metrics-port", "redis-port"])
def test_evalq_up_refuses_a_taken_port_before_it_starts_anything(
    flag: str, taken: int, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVALQ_")}
    others = {name: free_port() for name in ("port", "flower-port", "metrics-port")}
    ports = {**others, flag: taken}
    done = cli_in_process(
        env, "up", "--dir", str(tmp_path / "stack"),
        *(f"--{name}={port}" for name, port in ports.items()),
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert f"port {taken} (" in done.stderr
    assert f"--{flag}) is in use" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "stack").exists()  # no secrets written, no Redis started


def _descendants(pid: int) -> set[int]:
    """The processes below ``pid``, from /proc."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _up_env(**settings: str) -> dict[str, str]:
    """This environment without its ``EVALQ_`` settings, the repository on ``PYTHONPATH``,
    the test plugins and ``settings``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVALQ_")}
    env.update(PYTHONPATH=str(REPO), EVALQ_PLUGINS="tests.plugins", **settings)
    return env


@contextmanager
def _evalq_up(root: Path, env: dict[str, str], *args: str, cwd: Path = REPO) -> Iterator[Up]:
    """``evalq up --dir root/stack`` on free ports, started from ``cwd``, once it says it has
    started everything; Ctrl-C after (when it still runs), which must end it with status 0."""
    ports = {name: free_port() for name in ("port", "flower-port", "metrics-port")}
    printed = root / f"up-{len(list(root.glob('up-*.out')))}.out"
    with printed.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-c", "from evalq.shared.cli import main; main()", "up",
             "--dir", str(root / "stack"), *args,
             *(f"--{name}={port}" for name, port in ports.items())],
            env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    stack = Up(
        process, root / "stack", printed, f"http://127.0.0.1:{ports['port']}",
        f"http://127.0.0.1:{ports['flower-port']}", f"http://127.0.0.1:{ports['metrics-port']}",
    )  # fmt: skip

    def started() -> bool:
        assert process.poll() is None, printed.read_text()
        return "Ctrl-C stops everything." in printed.read_text()

    try:
        wait_for(started, 180, "evalq up to start everything")
        yield stack
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            assert process.wait(120) == 0, printed.read_text()


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    """``evalq up`` with the test plugins, free ports, the janitor's (and retainer's) interval
    at 0.5 s, runs kept a day and audit entries 8.6 s."""
    env = _up_env(
        EVALQ_STALL_AFTER="2", EVALQ_KEEP_RUNS_DAYS="1", EVALQ_AUDIT_DAYS="0.0001",
        EVALQ_MAX_BATCH="16",
    )  # fmt: skip
    with _evalq_up(tmp_path_factory.mktemp("up"), env, "--workers", "2") as stack:
        yield stack


def _run_id(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    return str(json.loads(result.stdout.splitlines()[0])["run_id"])


@pytest.mark.integration
def test_the_user_story_runs_through_evalq_up_with_retention_and_no_refusal(
    up: Up, tmp_path: Path
) -> None:
    admin = up.admin_token()
    operator = up.operator()
    data = tmp_path / "data"
    write_rows(data, "validation", labelled_rows(40))
    assert up.cli(admin, "datasets", "add", "ds", "--data", str(data)).returncode == 0
    registered: Any = operator.xrevrange(AUDIT, count=1)  # the newest entry now
    assert up.cli(admin, "tiers", "set", "ds", "validation", "viewable").returncode == 0
    made = up.cli(admin, "tokens", "create", "alice", "--role", "user", "--json")
    assert made.returncode == 0, made.stderr
    alice = json.loads(made.stdout)["token"]
    submit = ("submit", "spy", "--dataset", "ds", "--split", "validation", "--limit", "30",
              "--follow", "--json")  # fmt: skip
    old, new = _run_id(up.cli(alice, *submit)), _run_id(up.cli(alice, *submit))
    compared = up.cli(alice, "compare", old, new, "--json")
    assert compared.returncode == 0, compared.stderr
    assert json.loads(compared.stdout)["baseline"] == old
    report = tmp_path / "report.html"
    made_report = up.cli(alice, "report", old, new, "--out", str(report))
    assert made_report.returncode == 0, made_report.stderr
    assert "<html" in report.read_text()

    workers = up.flower_get("/api/workers")
    assert len([w for w in workers if w.startswith("evalq-")]) == 2
    inspected = up.flower_get("/api/workers?refresh=1")  # stats, conf, registered, queues...
    assert all("stats" in inspected[w] and "registered" in inspected[w] for w in workers)
    scraped = urllib.request.urlopen(f"{up.metrics}/metrics", timeout=30).read().decode()
    assert f'run="{old}"' in scraped

    # retention, by the gateway: a run submitted two days ago goes (with its archive folder),
    # audit entries older than 8.6 s go
    archive = up.root / "archive" / old
    wait_for(archive.exists, 60, "the run's archive")
    operator.zadd(RUNS, {old: float(operator.time()[0]) - 2 * 86400})

    def purged() -> bool:
        return not operator.exists(RunKeys(old).facts) and not archive.exists()

    wait_for(purged, 60, "the old run to be purged")
    assert operator.exists(RunKeys(new).facts)

    def trimmed() -> bool:
        oldest: Any = operator.xrange(AUDIT, count=1)
        return not oldest or int(oldest[0][0].split("-")[0]) > int(registered[0][0].split("-")[0])

    wait_for(trimmed, 60, "the oldest audit entries to be trimmed")
    for path, text in up.logs().items():
        assert not REFUSED.search(text), (path, REFUSED.findall(text)[:3])


@pytest.mark.integration
def test_ctrl_c_stops_every_process_evalq_up_started(up: Up) -> None:
    children = _descendants(up.process.pid)
    assert len(children) >= 6  # redis, gateway, metrics, flower, two workers (and pools)
    up.process.send_signal(signal.SIGINT)
    assert up.process.wait(120) == 0
    wait_for(lambda: not any(_alive(pid) for pid in children), 60, "every child to be gone")
    assert up.printed.read_text().rstrip().endswith("stopped")


def _child(up: Up, name: str) -> int | None:
    """The pid of ``evalq up``'s own child whose command line has the argument ``name``
    (``serve``, ``evalq.worker``, ``flower``) or whose command is ``name`` (``redis-server``),
    or None when it has none."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            argv = (stat.parent / "cmdline").read_bytes().split(b"\0")
            command = (stat.parent / "comm").read_text().strip()
        except OSError:
            continue
        named = name.encode() in argv or command == name
        if parent == up.process.pid and named and _alive(int(stat.parent.name)):
            return int(stat.parent.name)
    return None


@pytest.mark.integration
def test_evalq_up_restarts_a_killed_worker_and_gateway_and_keeps_one_admin_token(
    tmp_path: Path,
) -> None:
    env = _up_env(EVALQ_STALL_AFTER="2", EVALQ_MAX_BATCH="16")
    data, gate = tmp_path / "data", tmp_path / "gate"
    write_rows(data, "validation", labelled_rows(128))
    with _evalq_up(tmp_path, env, "--workers", "1") as up:
        admin = up.admin_token()
        assert up.cli(admin, "datasets", "add", "ds", "--data", str(data)).returncode == 0
        assert up.cli(admin, "tiers", "set", "ds", "validation", "viewable").returncode == 0
        submit = ("submit", "slow", "--dataset", "ds", "--split", "validation", "--param",
                  f"gate={gate}", "--param", "open_until=64", "--json")  # fmt: skip
        run = _run_id(up.cli(admin, *submit))

        def status() -> Any:
            shown = up.cli(admin, "status", run, "--json")
            assert shown.returncode == 0, shown.stderr
            return json.loads(shown.stdout)

        wait_for(lambda: status()["progress"]["inferred"] >= 64, 120, "the open samples")
        worker, gateway = _child(up, "evalq.worker"), _child(up, "serve")
        assert worker is not None
        assert gateway is not None
        os.kill(worker, signal.SIGKILL)  # held at the gate: its samples are taken, not done
        os.kill(gateway, signal.SIGKILL)

        def back() -> bool:
            again = _child(up, "evalq.worker"), _child(up, "serve")
            return None not in again and not {worker, gateway} & set(again)

        wait_for(back, 10, "a new worker and a new gateway")
        wait_for(lambda: answers(f"{up.api}/openapi.json"), 120, "the new gateway to answer")
        redis_pid = _child(up, "redis-server")
        assert redis_pid is not None
        os.kill(redis_pid, signal.SIGKILL)
        wait_for(lambda: _child(up, "redis-server") not in {None, redis_pid}, 10, "a new Redis")
        gate.touch()
        wait_for(lambda: status()["status"] == "completed", 180, "the run to complete")
        assert status()["progress"]["scored"] == 128
        printed = up.printed.read_text()
        assert "worker 0 exited with status -9" in printed
        assert "the gateway exited with status -9" in printed
        assert "worker 0 restarted" in printed
        assert "the gateway restarted" in printed
        assert "redis-server exited with status -9" in printed
        assert "redis-server restarted" in printed
        assert "stopping the rest" not in printed
    with _evalq_up(tmp_path, env, "--workers", "1") as again:  # the same folder
        assert again.admin_token() == admin
        listed = again.cli(admin, "tokens", "list", "--json")
        assert listed.returncode == 0, listed.stderr
        assert [t["principal"] for t in json.loads(listed.stdout)] == ["admin"]
    kept = tmp_path / "stack" / "secrets" / "admin.token"
    assert kept.stat().st_mode & 0o777 == 0o600


@pytest.mark.integration
def test_evalq_up_beside_a_folder_named_evalq_loads_a_plugin_that_imports_evalq(
    tmp_path: Path,
) -> None:
    """A clone named ``evalq`` in the folder ``evalq up`` starts from shadowed the installed
    package in Flower (Celery puts the working directory on ``sys.path`` to load its app):
    ``cannot import name 'Evaluation' from 'evalq'``, Flower exited 2 and ``evalq up`` 1."""
    here, plugins = tmp_path / "here", tmp_path / "plugins"
    (here / "evalq").mkdir(parents=True)
    (here / "evalq" / "__init__.py").write_text("")
    plugins.mkdir()
    (plugins / "shadow_eval.py").write_text("from evalq import Evaluation\n\nBASE = Evaluation\n")
    env = _up_env()
    env.update(PYTHONPATH=f"{REPO}{os.pathsep}{plugins}", EVALQ_PLUGINS="shadow_eval")
    with _evalq_up(tmp_path, env, cwd=here) as up:
        workers = up.flower_get("/api/workers?refresh=1")
        assert len([w for w in workers if w.startswith("evalq-")]) == 1
        assert _child(up, "flower") is not None
    for path, text in up.logs().items():
        assert "cannot import" not in text, (path, text[-2000:])
