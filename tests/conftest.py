"""Fixtures: a real redis-server on a free port and real Celery worker subprocesses."""

from __future__ import annotations

import gc
import re
import subprocess
import sys
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from celery import Celery

from evalq.producer.operations.redis_server import RedisServer
from evalq.producer.operations.workers import LocalWorkers, WorkerProcess
from evalq.producer.service.client import Client
from evalq.shared.access.roles import Role
from evalq.shared.connection import connect
from evalq.shared.evaluation import load_plugins
from evalq.shared.queue.celery_app import create_app
from evalq.shared.settings import Settings
from tests.helpers import NOWHERE, REPO, cli_env, cli_in_process, fork_server, gateway, wait_for
from tests.zygote import WORKER


class ForkedWorkers(LocalWorkers):
    """Workers forked by the fork server when only their ``EVALQ_*`` variables differ from its
    environment (and no launcher or working directory is asked for); others are started as
    :class:`LocalWorkers` starts them."""

    def _spawn(self, index: int) -> WorkerProcess:
        if not self.launcher and self.cwd is None:
            forked = fork_server(WORKER).spawn(self.arguments(), self._env, self.log_path(index))
            if forked is not None:
                return forked
        return super()._spawn(index)


@dataclass
class Stack:
    """A Redis server, a producer-side app and client, and (maybe) workers."""

    server: RedisServer
    settings: Settings
    app: Celery
    client: redis.Redis
    workers: list[LocalWorkers]
    log_dir: Path
    crashes_expected: bool = False

    def start_workers(
        self, queues: str = "infer,score", url: str | None = None, **env: str
    ) -> LocalWorkers:
        """One more worker process with the test plugins and batches of 16, plus ``env``,
        talking to ``url`` (default: the server's)."""
        workers = ForkedWorkers(
            url or self.server.url,
            queues=queues,
            env={
                **cli_env(self.server.url),
                "EVALQ_MAX_BATCH": "16",
                "EVALQ_ARCHIVE_URL": self.settings.archive_url,
                **env,
            },
            log_dir=self.log_dir / f"w{len(self.workers)}",
        )
        workers.log_dir.mkdir(parents=True, exist_ok=True)  # type: ignore[union-attr]
        self.workers.append(workers.start(self.app))
        return workers

    def stop_workers(self) -> None:
        """Stop every worker set at once (each one's warm shutdown takes a second or two)."""
        with ThreadPoolExecutor(max(1, len(self.workers))) as stopping:
            list(stopping.map(LocalWorkers.stop, self.workers))
        self.workers = []

    def worker_log(self) -> str:
        return "".join(p.read_text() for p in sorted(self.log_dir.glob("w*/worker-*.log")))

    def wait_logged(self, text: str, count: int = 1, timeout: float = 60.0) -> str:
        """The workers' log once it holds ``text`` at least ``count`` times: a worker logs
        what it did after doing it, so a test that saw the effect waits for the line."""
        wait_for(lambda: self.worker_log().count(text) >= count, timeout, f"{text!r} logged")
        return self.worker_log()

    def assert_no_task_crashed(self) -> None:
        """No batch raised out of evalq's code (per-sample errors are records, not crashes):
        a batch task logs such a job as ``ERROR/ForkPoolWorker-N] Error: ...``
        (:func:`evalq.worker.batches.run_job`)."""
        if not self.crashes_expected:
            assert not re.search(r"ForkPoolWorker-\d+\] Error: ", self.worker_log())


REDIS_FIXTURES = frozenset({"stack", "fresh_stack", "redis_only", "served", "door"})
"""Fixtures that start a redis-server (and some, workers)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that takes a fixture with a redis-server is an integration test, so that
    ``-m "not integration"`` never starts one, whatever a module forgot to mark."""
    for item in items:
        if REDIS_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


class _FastLayer:
    """Whether the test being set up or run is of the fast layer (not ``integration``)."""

    now = False


_start = RedisServer.start


def _guarded_start(self: RedisServer, timeout: float = 10.0) -> RedisServer:
    if _FastLayer.now:
        raise AssertionError(
            "this test starts a redis-server: mark it integration (the fast layer starts none)"
        )
    return _start(self, timeout)


RedisServer.start = _guarded_start  # type: ignore[method-assign]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A fast-layer test that starts a redis-server, itself or through a fixture, fails."""
    _FastLayer.now = item.get_closest_marker("integration") is None


def pytest_runtest_teardown(item: pytest.Item) -> None:
    _FastLayer.now = False


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test with worker processes shows the end of their log beside its traceback:
    CI keeps nothing else of a run that timed out waiting on them."""
    report: pytest.TestReport = yield
    arguments = getattr(item, "funcargs", {})
    stack = next((a for a in arguments.values() if isinstance(a, Stack)), None)
    if report.failed and stack is not None:
        banner = re.compile(r"^\s*(\.>|-|\*)")  # Celery's start-up banner: its queues
        kept = [line for line in stack.worker_log().splitlines() if not banner.match(line)]
        lines = kept[-WORKER_LOG_TAIL:]
        report.sections.append(("worker log (last lines)", "\n".join(lines)))
    return report


WORKER_LOG_TAIL = 120


def pytest_collection_finish(session: pytest.Session) -> None:
    """Keep what collection imported out of the garbage collector's full collections (their
    objects live as long as the process anyway): one then walks what the tests made, not
    every imported module's objects too (0.16 s each with torch imported, and the worker's
    RuntimePool.close runs one after each test of a batch)."""
    gc.freeze()


def _stack(root: Path) -> Stack:
    server = RedisServer(root / "redis", appendonly=True).start()
    settings = Settings(
        redis_url=server.url, plugins=("tests.plugins",), archive_url=str(root / "archive")
    )
    load_plugins(settings.plugins)
    app = create_app(settings)
    return Stack(server, settings, app, connect(server.url), [], root)


def _close(stack: Stack, stop: Callable[[RedisServer], None] = RedisServer.stop) -> None:
    stack.stop_workers()
    stack.client.close()
    stop(stack.server)


@contextmanager
def shared_stack(root: Path, **env: str) -> Iterator[Stack]:
    """A Redis and one worker (with ``env``) for tests that only add runs, each on data,
    datasets and servers of its own: none kills, restarts or reconfigures a process, or
    reads a count of the whole server. Starting a worker is most of a fresh stack's cost
    (5-7 s on the 2-core machine, 2 s more to stop it)."""
    shared = _stack(root)
    shared.start_workers(**env)
    yield shared
    _close(shared)
    shared.assert_no_task_crashed()


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One Redis and one worker shared by the tests that only add runs."""
    with shared_stack(tmp_path_factory.mktemp("stack")) as shared:
        yield shared


@pytest.fixture
def fresh_stack(tmp_path: Path, stop_later: Callable[[RedisServer], None]) -> Iterator[Stack]:
    """A Redis of its own, with no worker until the test starts one."""
    own = _stack(tmp_path)
    yield own
    _close(own, stop_later)
    own.assert_no_task_crashed()


@pytest.fixture(scope="session")
def stop_later() -> Iterator[Callable[[RedisServer], None]]:
    """Stops a server while the tests go on (Redis acts on SIGTERM at its next 100 ms tick:
    a tenth of a second each test would wait); every stop has ended, and raised nothing, when
    the session does."""
    with ThreadPoolExecutor(2, thread_name_prefix="redis-stop") as stopper:
        stopping: list[Future[None]] = []
        yield lambda server: stopping.append(stopper.submit(server.stop))
        for stop in stopping:
            stop.result()


@pytest.fixture
def redis_only(tmp_path: Path, stop_later: Callable[[RedisServer], None]) -> Iterator[RedisServer]:
    """Just a redis-server, for tests that need no worker."""
    server = RedisServer(tmp_path / "redis").start()
    yield server
    stop_later(server)


@dataclass
class Door:
    """How the CLI reaches evalq: ``redis`` (an operator) or ``gateway`` (a user's token)."""

    name: str
    env: dict[str, str]

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-c", "from evalq.shared.cli import main; main()", *args],
            env=self.env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    def run(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        """What the command answers, run in this process (:func:`cli_in_process`); a test of
        the process itself (a signal, what it imports) uses :meth:`popen`."""
        return cli_in_process({**self.env, **env}, *args)


@pytest.fixture(scope="module")
def served(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """The gateway in front of the shared stack, and a user's token."""
    token = Client(stack.settings).create_token("ux-user", Role.USER)
    log = tmp_path_factory.mktemp("gw") / "gateway.log"
    with gateway(stack.server.url, log) as (api, _):
        yield api, token


@pytest.fixture(params=["redis", "gateway"])
def door(request: pytest.FixtureRequest, stack: Stack) -> Door:
    if request.param == "redis":
        return Door("redis", cli_env(stack.server.url))
    api, token = request.getfixturevalue("served")
    return Door("gateway", cli_env(NOWHERE, EVALQ_API_URL=api, EVALQ_TOKEN=token))


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """The fast layer (``-m "not integration"``) runs in one process unless ``-n`` is given:
    its time is the test modules' imports, which each of xdist's processes pays again (15 s
    in one process, 27 s in two, on the 2-core machine)."""
    given = config.invocation_params.args
    explicit = any(a == "-n" or a.startswith(("-n", "--numprocesses")) for a in given)
    if config.option.markexpr == "not integration" and not explicit:
        config.option.numprocesses = 0
        config.option.dist = "no"


INTEGRATION_ONLY = "\npytestmark = pytest.mark.integration\n"
"""How a test module marks every test in it integration (a line of its own, at top level)."""


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The fast layer does not import a module whose every test it would deselect (one with
    ``pytestmark = pytest.mark.integration``): their imports (Playwright, schemathesis, lm-eval,
    ...) were a tenth of its time."""
    if config.option.markexpr != "not integration" or collection_path.suffix != ".py":
        return None
    if not collection_path.name.startswith("test_"):
        return None
    return INTEGRATION_ONLY in collection_path.read_text(encoding="utf-8") or None
