"""Fixtures: a real redis-server on a free port and real Celery worker subprocesses."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from celery import Celery

from producer.redis_server import RedisServer
from producer.workers import LocalWorkers
from shared.celery_app import create_app
from shared.connection import connect
from shared.evaluation import load_plugins
from shared.settings import Settings
from tests.helpers import cli_env


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
        workers = LocalWorkers(
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
        for workers in self.workers:
            workers.stop()
        self.workers = []

    def worker_log(self) -> str:
        return "".join(p.read_text() for p in sorted(self.log_dir.glob("w*/worker-*.log")))

    def assert_no_task_crashed(self) -> None:
        """No batch raised out of evalq's code (per-sample errors are records, not crashes):
        celery-batches logs such a batch as ``ERROR/ForkPoolWorker-N] Error: ...``."""
        if not self.crashes_expected:
            assert not re.search(r"ForkPoolWorker-\d+\] Error: ", self.worker_log())


WORKER_FIXTURES = frozenset({"stack", "fresh_stack"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that takes a fixture with worker processes is an integration test, so that
    ``-m "not integration"`` never starts a worker, whatever a module forgot to mark."""
    for item in items:
        if WORKER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


def _stack(root: Path) -> Stack:
    server = RedisServer(root / "redis", appendonly=True).start()
    settings = Settings(
        redis_url=server.url, plugins=("tests.plugins",), archive_url=str(root / "archive")
    )
    load_plugins(settings.plugins)
    app = create_app(settings)
    return Stack(server, settings, app, connect(server.url), [], root)


def _close(stack: Stack) -> None:
    stack.stop_workers()
    stack.client.close()
    stack.server.stop()


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One Redis and one worker shared by the tests that only add runs."""
    shared = _stack(tmp_path_factory.mktemp("stack"))
    shared.start_workers()
    yield shared
    _close(shared)
    shared.assert_no_task_crashed()


@pytest.fixture
def fresh_stack(tmp_path: Path) -> Iterator[Stack]:
    """A Redis of its own, with no worker until the test starts one."""
    own = _stack(tmp_path)
    yield own
    _close(own)
    own.assert_no_task_crashed()


@pytest.fixture
def redis_only(tmp_path: Path) -> Iterator[RedisServer]:
    """Just a redis-server, for tests that need no worker."""
    with RedisServer(tmp_path / "redis") as server:
        yield server
