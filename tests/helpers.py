"""Test helpers: waiting on conditions with deadlines, test data, running the CLI."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx
import redis
from click.testing import CliRunner

from evalq.producer.operations.redis_server import free_port
from evalq.producer.service.client import Client
from evalq.producer.service.views import RunView
from evalq.shared import cli
from evalq.shared.access.ledger import Ledger
from evalq.shared.access.policy import Tier
from evalq.shared.access.registry import DatasetRegistry
from evalq.shared.access.tiers import TierRegistry
from evalq.shared.cli import main
from evalq.shared.keys import RunKeys
from evalq.shared.models import RunMeta, RunStatus
from evalq.shared.settings import get_settings
from evalq.shared.stats import wilson as wilson_interval
from evalq.shared.store.live import settled_ids
from evalq.shared.store.reader import ResultReader
from evalq.shared.store.runs import RunStore
from tests.plugins import predict
from tests.zygote import CLI, Started, Zygote, base_env

T = TypeVar("T")
REPO = Path(__file__).resolve().parent.parent


def wilson(right: int, n: int) -> tuple[float, float, float]:
    """The fraction ``right / n`` with its 95% Wilson interval
    (:func:`evalq.shared.stats.wilson`)."""
    return (right / n, *wilson_interval(right, n))


def wait_for(probe: Callable[[], T], timeout: float = 60.0, what: str = "condition") -> T:
    """Poll ``probe`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def record_run(client: redis.Redis, meta: RunMeta, ids: list[int], archive: str = "") -> None:
    """Record and open ``meta`` through the stores as submit does (charged when
    ``meta.charged``), its results to be archived under ``archive``."""
    RunStore(client).create(meta, ids, archive or str(Path(tempfile.gettempdir(), "evalq-archive")))
    Ledger(client).reserve(meta)


def charge_run(  # noqa: PLR0917
    client: redis.Redis, dataset: str, split: str, run_id: str, samples: int, who: str
) -> None:
    """Record and open a charged run of ``samples`` samples by ``who`` on ``dataset/split``
    (raises :class:`evalq.shared.errors.BudgetExhaustedError` as submit would)."""
    meta = RunMeta(
        run_id=run_id, eval="spy", spec="0" * 64, dataset_id=dataset, split=split, n=samples,
        status=RunStatus.QUEUED, created=0.0, principal=who, charged=True,
    )  # fmt: skip
    record_run(client, meta, list(range(samples)))


def ended_view(reader: Client, run_id: str) -> RunView:
    """The run's status as ``reader`` sees it once its end shows (a reader who does not see
    a held-out run's timing sees its end from the next second on)."""

    def ended() -> RunView | None:
        view = reader.status(run_id)
        return None if view.meta.status.active else view

    found = wait_for(ended, 10, "the end to show")
    assert found is not None
    return found


def wait_completed(client: redis.Redis, run_id: str, timeout: float = 90.0) -> None:
    """Wait until the run's status is ``completed``; fail after ``timeout`` seconds."""
    runs = RunStore(client)
    wait_for(lambda: runs.get(run_id).status is RunStatus.COMPLETED, timeout, f"run {run_id}")


def wait_ended(client: redis.Redis, run_id: str, timeout: float = 120.0) -> RunStatus:
    """Wait until the run is no longer queued or running; return its status."""
    runs = RunStore(client)

    def ended() -> RunStatus | None:
        status = runs.get(run_id).status
        return None if status.active else status

    status = wait_for(ended, timeout, f"run {run_id} to end")
    assert status is not None
    return status


def assert_settled_once(
    client: redis.Redis, run_id: str, n: int, ended: RunStatus = RunStatus.COMPLETED
) -> None:
    """The run ``ended`` (completed) with each of its ``n`` samples settled exactly once: one
    score or one error (never both), counted once, and listed once in the settled stream (in
    the archive's timeline, once the run is archived)."""
    runs, results = RunStore(client), ResultReader(client)
    assert runs.get(run_id).status is ended
    found = list(results.results(run_id))
    scored = {r.sample_id for r in found if r.scores is not None}
    failed = {r.sample_id for r in found if r.error is not None}
    assert not scored & failed
    assert scored | failed == {r.sample_id for r in found}
    assert len(found) == n
    progress = results.progress(run_id)
    assert progress.scored == len(scored)
    assert progress.failed == len(failed)
    archive = results.archive(run_id)
    if archive is None:
        entries: Any = client.xrange(RunKeys(run_id).settled)
        streamed = [i for _, fields in entries for i in settled_ids(fields)]
        if results.archive(run_id) is None:  # not sealed while read
            assert sorted(streamed) == sorted(scored | failed)
            return
        archive = results.archive(run_id)
    assert archive is not None
    assert sum(count for _, count in archive.manifest["timeline"]) == n


def write_rows(folder: Path, split: str, rows: list[dict[str, object]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{split}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def dataset_name(folder: str | Path) -> str:
    """The name the tests register ``folder`` under."""
    return "t-" + hashlib.sha1(str(Path(folder).resolve()).encode()).hexdigest()[:12]


def list_splits(client: object, folder: str | Path, *splits: str, tier: str = "viewable") -> str:
    """Register ``folder`` and list its ``splits`` with ``tier`` (unlisted splits are
    no_access); return the dataset's name."""
    name = dataset_name(folder)
    DatasetRegistry(client).add(name, str(folder), who="tests")  # type: ignore[arg-type]
    registry = TierRegistry(client)  # type: ignore[arg-type]
    for split in splits:
        registry.set(name, split, Tier(tier), who="tests")
    return name


def register_splits(client: object, root: Path, name: str, *splits: str) -> None:
    """Register a dataset ``name`` with ``splits`` (a few rows each, written under ``root``):
    tiers, budgets and policies attach only to registered splits."""
    for split in splits:
        write_rows(root / name, split, labelled_rows(3))
    DatasetRegistry(client).add(name, str(root / name), who="tests")  # type: ignore[arg-type]


def audit_entries(client: object, run_id: str | None = None) -> list[dict[str, str]]:
    """The audit stream's entries, oldest first (only those of ``run_id`` when given)."""
    raw = client.xrange("evalq:audit") or []  # type: ignore[attr-defined]
    entries = [{str(k): str(v) for k, v in (fields or {}).items()} for _, fields in raw]
    return [e for e in entries if run_id is None or e.get("run") == run_id]


def labelled_rows(n: int, salt: str | None = None) -> list[dict[str, object]]:
    """Rows with a label the spy gets right about a third of the time, and a secret field.

    Without a ``salt`` each call's texts are its own (one content is registered as one split
    only): a unique 9-character tag after the sample number keeps ``len(text) % 3``, the spy's
    prediction, and the number the ``slow`` eval reads as the second word."""
    tag = "" if salt is not None else f" {uuid.uuid4().hex[:8]}"
    rows: list[dict[str, object]] = []
    for i in range(n):
        text = f"sample {salt or ''}{i}{tag} " + "x" * (i % 7)
        rows.append({"text": text, "label": (i * 7) % 3, "secret": f"s{i}"})
    return rows


def expected_accuracy(rows: list[dict[str, object]]) -> float:
    return sum(predict(str(r["text"])) == r["label"] for r in rows) / len(rows)


UNPRIVILEGED = [
    sys.executable,
    "-c",
    "import os, sys; from evalq.shared.isolation.privilege import drop_capabilities; "
    "drop_capabilities(); "
    "os.execv(sys.argv[1], sys.argv[1:])",
]
"""A launcher (:class:`evalq.producer.operations.workers.LocalWorkers`) that runs its command line
with every capability given up for good: a process of uid 0 then is what one of an ordinary user
is."""


NOWHERE = "redis://must-not-be-read.invalid:1/0"
"""A Redis URL for a process that must not read Redis itself (a gateway client, the fork server)."""


_SERVERS: dict[tuple[str, frozenset[tuple[str, str]]], Zygote] = {}


def fork_server(program: str) -> Zygote:
    """A fork server of ``program`` (tests/zygote.py) started with this process's environment
    as it is now (:func:`cli_env`'s, but for its ``EVALQ_*`` variables), as a process started
    now would import with it: libraries this process imports set variables of their own
    (lm-eval ``HF_XET_HIGH_PERFORMANCE``, scikit-learn ``KMP_DUPLICATE_LIB_OK``, torch's
    compiler ``TORCHINDUCTOR_CACHE_DIR``), and a test may set one with ``monkeypatch``. One per
    environment seen, each kept until pytest exits (it reports its processes' exits)."""
    ambient = cli_env(NOWHERE)
    key = (program, frozenset(base_env(ambient).items()))
    if key not in _SERVERS:
        _SERVERS[key] = Zygote(program, ambient)
    return _SERVERS[key]


def cli_env(redis_url: str, **extra: str) -> dict[str, str]:
    env = {**os.environ, "EVALQ_REDIS_URL": redis_url, "EVALQ_PLUGINS": "tests.plugins"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.pop("EVALQ_BROKER_URL", None)
    env.update(extra)
    return env


def evalq(redis_url: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run the real ``evalq`` console entry point in a subprocess."""
    return subprocess.run(
        [sys.executable, "-c", "from evalq.shared.cli import main; main()", *args],
        env=cli_env(redis_url, **env),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def evalq_in_process(redis_url: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """:func:`evalq` run in this process: the same entry point, environment, exit status and
    output, without an interpreter's start-up (most of a second a call). For what a command
    answers; a test of what a process imports, or of a process killed, uses :func:`evalq`."""
    return cli_in_process(cli_env(redis_url, **env), *args)


def cli_in_process(env: Mapping[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """The ``evalq`` console entry point run in this process with ``env`` as its whole
    environment (restored after), its settings read afresh; its exit status and output. Its
    consoles are as wide as ``COLUMNS`` says, else 80 (what rich gives a process whose output
    is not a terminal: it reads ``COLUMNS`` once, when a console is made)."""
    columns = env.get("COLUMNS", "")
    for console in (cli.out, cli.err):
        console.width = int(columns) if columns.isdigit() else 80
    changes: dict[str, str | None] = {k: v for k, v in env.items() if os.environ.get(k) != v}
    changes.update({k: None for k in os.environ if k not in env})
    with CliRunner().isolation(env=changes) as (stdout, stderr, _):
        get_settings.cache_clear()
        try:
            main(list(args))
            code = 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
        finally:
            get_settings.cache_clear()
        out, err = stdout.getvalue().decode(), stderr.getvalue().decode()
    return subprocess.CompletedProcess(["evalq", *args], code, out, err)


def answers(url: str) -> bool:
    """Whether ``url`` answers 200 now."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@contextmanager
def gateway(redis_url: str, log: Path, **settings: str) -> Iterator[tuple[str, Started]]:
    """``evalq serve`` on a free port with the test plugins and ``settings`` (``EVALQ_*``; none
    inherited from the test's environment; its runs archived beside ``log`` unless
    ``EVALQ_ARCHIVE_URL`` is given), until the block ends; yields its base URL once it
    answers, and its process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVALQ_")}
    env.update(
        {
            "EVALQ_REDIS_URL": redis_url,
            "EVALQ_PLUGINS": "tests.plugins",
            "PYTHONPATH": str(REPO),
            "EVALQ_ARCHIVE_URL": str(log.parent / "archive"),
        }
    )
    env.update(settings)
    port = free_port()
    log.write_bytes(b"")
    argv = ["serve", "--port", str(port)]
    process: Started | None = fork_server(CLI).spawn(argv, env, log)
    if process is None:
        with log.open("ab") as out:
            process = subprocess.Popen(
                [sys.executable, "-c", "from evalq.shared.cli import main; main()", *argv],
                env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
    api = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: answers(f"{api}/openapi.json"), 60, "the gateway to answer")
        yield api, process
    finally:
        process.terminate()
        process.wait(30)


class Server:
    """The test server (:mod:`tests.openai_server`) in its own process; ``control`` and
    ``stats`` talk to it."""

    def __init__(self, log: Path, key: str | None, model_dir: Path | None = None) -> None:
        """``key``: the one key it accepts (None: any); ``model_dir``: a real model it serves
        (it answers log-likelihoods then) instead of the fake."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "tests.openai_server", "--port", str(self.port)]
        if key is not None:
            command += ["--key", key]
        if model_dir is not None:
            command += ["--model-dir", str(model_dir)]
        self._log = log.open("w")
        self.process = subprocess.Popen(command, cwd=REPO, stdout=self._log, stderr=self._log)
        wait_for(self._up, 60, "the endpoint server")

    @property
    def base(self) -> str:
        return f"{self.url}/v1"

    def _up(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"the endpoint server exited with {self.process.returncode}")
        try:
            return httpx.get(f"{self.url}/stats", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def control(self, **settings: Any) -> None:
        httpx.post(f"{self.url}/control", json=settings, timeout=10).raise_for_status()

    def stats(self) -> dict[str, Any]:
        reply = httpx.get(f"{self.url}/stats", timeout=10)
        reply.raise_for_status()
        return dict(reply.json())

    def stop(self) -> None:
        self.process.kill()
        self.process.wait(30)
        self._log.close()
