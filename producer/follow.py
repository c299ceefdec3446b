"""Watching a run: a live rich progress bar fed by the run's counters until it ends (samples
settled, inferred, failed, samples/s since submission, elapsed and remaining time)."""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from shared.models import RunMeta
from shared.results import ResultStore
from shared.runs import RunStore

__all__ = ["follow"]


def follow(
    runs: RunStore,
    results: ResultStore,
    run_id: str,
    console: Console,
    interval: float = 0.2,
    timeout: float | None = None,
) -> RunMeta:
    """Show progress until the run is completed, failed or cancelled; return its record."""
    meta = runs.get(run_id)
    deadline = None if timeout is None else time.monotonic() + timeout
    columns = (
        TextColumn(f"[bold]{meta.eval}[/] {meta.split}"),
        BarColumn(),
        MofNCompleteColumn(),
        TaskProgressColumn(),
        TextColumn("inferred {task.fields[inferred]}  failed {task.fields[failed]}"),
        TextColumn("{task.fields[rate]:,.1f} samples/s"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task("run", total=meta.n, failed=0, inferred=0, rate=0.0)
        while True:
            counts = results.progress(run_id)
            elapsed = max(time.time() - meta.created, 1e-9)
            bar.update(
                task,
                completed=counts.done,
                failed=counts.failed,
                inferred=counts.inferred,
                rate=counts.done / elapsed,
            )
            meta = runs.get(run_id)
            if not meta.status.active:
                return meta
            if deadline is not None and time.monotonic() > deadline:
                return meta
            time.sleep(interval)
