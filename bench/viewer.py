"""The viewer on a million-sample archived run, measured in Chromium: the time from a page's
navigation to the run page's first meaningful paint (its facts, progress and aggregates with
their intervals drawn: the viewer's ``evalq:run`` performance mark) and to the first page of
its samples (``evalq:samples``), each over fresh page loads with the token in the tab's
session. Beside them, the browser's first contentful paint and the samples route alone over
HTTP.

The run (the null model over ``--samples`` rows, one worker) is made once and kept under
``--dir`` with its Redis (AOF on) and archive, and reused by later runs of the bench.

    python -m bench.viewer [--samples N] [--dir DIR] [--loads K]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from bench.scale import write_dataset
from evalq.producer.operations.redis_server import RedisServer, free_port
from evalq.producer.operations.workers import LocalWorkers
from evalq.producer.service.client import Client
from evalq.producer.service.submit import SubmitRequest
from evalq.shared.access.policy import Tier
from evalq.shared.access.registry import DatasetRegistry
from evalq.shared.access.roles import Role
from evalq.shared.access.tiers import TierRegistry
from evalq.shared.connection import connect
from evalq.shared.errors import UnknownRunError
from evalq.shared.queue.celery_app import create_app
from evalq.shared.settings import Settings

REPO = Path(__file__).resolve().parent.parent
PRINCIPAL = "bench-viewer"


def _wait(probe: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not probe():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} after {timeout}s")
        time.sleep(0.2)


def the_run(root: Path, samples: int, settings: Settings) -> tuple[str, str]:
    """The archived run of ``samples`` samples kept under ``root`` (made if missing), and a
    token of its principal."""
    state = root / "run.json"
    client = Client(settings)
    try:
        if state.exists():
            kept = json.loads(state.read_text())
            try:
                if kept["samples"] == samples and client.status(kept["run_id"]).meta.archived:
                    return kept["run_id"], kept["token"]
            except UnknownRunError:
                pass
        data = write_dataset(root / "data", samples)
        store = connect(settings.redis_url)
        DatasetRegistry(store).add("viewer", str(data), who="bench")
        TierRegistry(store).set("viewer", "validation", Tier.VIEWABLE, who="bench")
        store.close()
        workers = LocalWorkers(
            settings.redis_url,
            env={"EVALQ_ARCHIVE_URL": settings.archive_url, "EVALQ_TASK_EVENTS": "false",
                 "EVALQ_MAX_BATCH": "256"},
        ).start(create_app(settings))  # fmt: skip
        try:
            started = time.perf_counter()
            run_id = client.submit(
                SubmitRequest(eval="null", dataset="viewer", split="validation")
            ).run_id
            _wait(lambda: client.status(run_id).meta.archived, 3600, "archived run")
            print(f"made run {run_id}: {samples:,} samples archived in "
                  f"{time.perf_counter() - started:.0f} s", file=sys.stderr)  # fmt: skip
        finally:
            workers.stop()
        token = client.create_token(PRINCIPAL, Role.USER)
        state.write_text(json.dumps({"samples": samples, "run_id": run_id, "token": token}))
        return run_id, token
    finally:
        client.close()


def measure(api: str, run_id: str, token: str, loads: int) -> dict[str, list[float]]:
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    found: dict[str, list[float]] = {"run": [], "run_fcp": [], "samples": [], "samples_fcp": []}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=chromium, args=["--no-sandbox", "--disable-gpu", "--no-first-run"]
        )
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(f"{api}/#/runs")
        page.fill("#token", token)
        page.click("#sign-in button[type=submit]")
        page.locator("#who .principal").wait_for()
        for k in range(loads):
            for name, where, mark in (
                ("run", f"#/runs/{run_id}", "evalq:run"),
                ("samples", f"#/runs/{run_id}/samples", "evalq:samples"),
            ):
                page.goto(f"{api}/?load={name}{k}{where}")  # a fresh document each time
                page.wait_for_function(
                    "mark => performance.getEntriesByName(mark).length > 0",
                    arg=mark,
                    timeout=60_000,
                )
                at = page.evaluate(
                    "mark => [performance.getEntriesByName(mark)[0].startTime, "
                    "(performance.getEntriesByName('first-contentful-paint')[0] || {}).startTime]",
                    mark,
                )
                found[name].append(at[0] / 1000)
                found[f"{name}_fcp"].append((at[1] or 0) / 1000)
        page.screenshot(path=str(Path(os.environ.get("TMPDIR", "/tmp")) / "viewer-1m.png"))
        browser.close()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/evalq-bench-viewer"))
    parser.add_argument("--loads", type=int, default=5)
    args = parser.parse_args()
    root: Path = args.dir
    root.mkdir(parents=True, exist_ok=True)
    server = RedisServer(root / "redis", appendonly=True).start()
    try:
        settings = Settings(
            redis_url=server.url, archive_url=str(root / "archive"), principal=PRINCIPAL
        )
        run_id, token = the_run(root, args.samples, settings)
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("EVALQ_")}
        env.update(EVALQ_REDIS_URL=server.url, EVALQ_ARCHIVE_URL=settings.archive_url,
                   PYTHONPATH=str(REPO))  # fmt: skip
        with (root / "gateway.log").open("wb") as log:
            gateway = subprocess.Popen(
                [sys.executable, "-c", "from evalq.shared.cli import main; main()",
                 "serve", "--port", str(port)],
                env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        api = f"http://127.0.0.1:{port}"
        try:
            _wait(lambda: _answers(f"{api}/openapi.json"), 60, "gateway")
            headers = {"Authorization": f"Bearer {token}"}
            with httpx.Client(base_url=api, headers=headers, timeout=60) as http:
                route = []
                for _ in range(args.loads):
                    started = time.perf_counter()
                    http.get(f"/v1/runs/{run_id}/samples", params={"limit": 50}).raise_for_status()
                    route.append(time.perf_counter() - started)
                total = http.get(f"/v1/runs/{run_id}/samples", params={"limit": 1}).json()["total"]
                stats = http.get(f"/v1/runs/{run_id}").json()["stats"]
                metric = sorted(stats)[0]
                asked: dict[str, float] = {}
                for name, params in ((f"sort=-{metric}", {"sort": f"-{metric}"}),
                                     ("failed=true", {"failed": "true"}),
                                     ("offset=500000", {"offset": 500_000})):  # fmt: skip
                    started = time.perf_counter()
                    http.get(f"/v1/runs/{run_id}/samples", params=params).raise_for_status()
                    asked[name] = time.perf_counter() - started
            found = measure(api, run_id, token, args.loads)
        finally:
            gateway.terminate()
            gateway.wait(30)
    finally:
        server.stop()
    print(f"run {run_id}: {total:,} samples, archived; {args.loads} fresh loads each")
    for name, label in (("run", "run page, first meaningful paint"),
                        ("samples", "first page of samples shown")):  # fmt: skip
        values = found[name]
        print(f"{label}: median {statistics.median(values):.3f} s, first {values[0]:.3f} s, "
              f"max {max(values):.3f} s (first contentful paint median "
              f"{statistics.median(found[name + '_fcp']):.3f} s)")  # fmt: skip
    print(f"GET /v1/runs/{{run}}/samples?limit=50 alone: median {statistics.median(route):.3f} s, "
          f"first {route[0]:.3f} s")  # fmt: skip
    for name, seconds in asked.items():
        print(f"GET /v1/runs/{{run}}/samples?{name} (once): {seconds:.3f} s")


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


if __name__ == "__main__":
    main()
