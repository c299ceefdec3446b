"""Fixtures: a real redis-server on a free port and real Celery worker subprocesses."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from celery import Celery

from producer.workers import LocalWorkers
from shared.celery_app import create_app
from shared.connection import connect
from shared.evaluation import load_plugins
from shared.redis_server import RedisServer
from shared.settings import Settings
from tests.helpers import cli_env


@dataclass
class Stack:
    """A Redis server, a producer-side app and client, and (maybe) workers."""

    server: RedisServer
    settings: Settings
    app: Celery
    client: redis.Redis
    workers: LocalWorkers
    log_dir: Path
    crashes_expected: bool = False

    def start_workers(self, **env: str) -> LocalWorkers:
        """One worker process with the test plugins and batches of 16, plus ``env``."""
        self.workers = LocalWorkers(
            self.server.url,
            env={**cli_env(self.server.url), "EVALQ_MAX_BATCH": "16", **env},
            log_dir=self.log_dir,
        ).start(self.app)
        return self.workers

    def worker_log(self) -> str:
        return "".join(p.read_text() for p in sorted(self.log_dir.glob("worker-*.log")))

    def assert_no_task_crashed(self) -> None:
        """No batch raised out of evalq's code (per-sample errors are records, not crashes)."""
        if not self.crashes_expected:
            assert "Traceback" not in self.worker_log()


def _stack(root: Path) -> Stack:
    server = RedisServer(root / "redis", appendonly=True).start()
    settings = Settings(redis_url=server.url, plugins=("tests.plugins",))
    load_plugins(settings.plugins)
    app = create_app(settings)
    workers = LocalWorkers(server.url, count=0)
    return Stack(server, settings, app, connect(server.url), workers, root)


def _close(stack: Stack) -> None:
    stack.workers.stop()
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
