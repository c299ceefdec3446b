"""Watching a run until it ends: a live rich progress bar on a terminal (samples settled,
inferred, failed, samples/s since submission, elapsed and remaining time), and plain progress
lines when the output is a file or a pipe, where a bar would be cut to pieces."""

from __future__ import annotations

import time

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from evalq.producer.api import Api
from evalq.shared.cli import redis_unreachable
from evalq.shared.errors import GatewayUnreachableError
from evalq.shared.models import Progress as Counts
from evalq.shared.models import RunMeta

__all__ = ["RunBar", "follow", "progress_line"]

LINE_EVERY = 2.0
"""Seconds between plain progress lines (a line is printed only when the counts moved)."""


REDIS_RETRY = 1.0
"""Seconds between two tries to reach Redis while it is down."""

STALL_EVERY = 2.0
"""Seconds between two looks at whether the run is stalled (no live worker, no progress)."""


def _unreachable(exc: Exception) -> bool:
    """Whether ``exc`` is an outage of Redis, or of the gateway (redis is not imported for
    it: following through the gateway loads none of it)."""
    return isinstance(exc, GatewayUnreachableError) or redis_unreachable(exc)


def progress_line(meta: RunMeta, counts: Counts, stalled: str | None = None) -> str:
    """One plain line: ``RUN EVAL SPLIT: 30/100 settled (30%), inferred 40, failed 0, 12.3
    samples/s, running`` (and why it is stalled, when it is)."""
    elapsed = max(time.time() - meta.created, 1e-9)
    share = counts.done / meta.n if meta.n else 1.0
    return (
        f"{meta.run_id} {meta.eval} {meta.split}: {counts.done}/{meta.n} settled ({share:.0%}), "
        f"inferred {counts.inferred}, failed {counts.failed}, "
        f"{counts.done / elapsed:,.1f} samples/s, {meta.status}"
        + (f", stalled: {stalled}" if stalled else "")
    )


class _Stall:
    """Asks the client whether the run is stalled at most every ``STALL_EVERY`` seconds."""

    def __init__(self, client: Api) -> None:
        self._client = client
        self._asked = -STALL_EVERY
        self.reason: str | None = None

    def update(self, meta: RunMeta, counts: Counts) -> str | None:
        if not meta.status.active:
            self.reason = None
        elif time.monotonic() - self._asked >= STALL_EVERY:
            self._asked = time.monotonic()
            try:
                self.reason = self._client.stalled(meta, counts)
            except Exception as exc:
                if not _unreachable(exc):
                    raise
                # through an outage (said by _progress) the reason stays what it was
        return self.reason


def follow(
    client: Api,
    run_id: str,
    console: Console,
    interval: float = 0.2,
    timeout: float | None = None,
) -> RunMeta:
    """Show progress until the run is completed, failed or cancelled; return its record."""
    if console.is_terminal:
        return _bar(client, run_id, console, interval, timeout)
    return _lines(client, run_id, console, interval, timeout)


def _progress(client: Api, run_id: str, console: Console) -> tuple[RunMeta, Counts]:
    """The run's record and counts; through a Redis outage (a restart), say so once and keep
    asking every second."""
    waiting = False
    while True:
        try:
            return client.progress(run_id)
        except Exception as exc:
            if not _unreachable(exc):
                raise
            if not waiting:
                what = "the gateway" if isinstance(exc, GatewayUnreachableError) else "Redis"
                console.print(f"{what} is unreachable; still watching", highlight=False)
                waiting = True
            time.sleep(REDIS_RETRY)


def _ended(meta: RunMeta, deadline: float | None) -> bool:
    return not meta.status.active or (deadline is not None and time.monotonic() > deadline)


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


def _lines(
    client: Api, run_id: str, console: Console, interval: float, timeout: float | None
) -> RunMeta:
    deadline = _deadline(timeout)
    last: tuple[str, Counts, str | None] | None = None
    printed = 0.0
    stall = _Stall(client)
    while True:
        meta, counts = _progress(client, run_id, console)
        ended = _ended(meta, deadline)
        stalled = stall.update(meta, counts)
        state = (meta.status.value, counts, stalled)
        if state != last and (ended or time.monotonic() - printed >= LINE_EVERY):
            line = progress_line(meta, counts, stalled)
            console.print(line, highlight=False, soft_wrap=True)
            last, printed = state, time.monotonic()
        if ended:
            return meta
        time.sleep(interval)


class RunBar(Progress):
    """The live bar of one run: its name, the bar, samples settled of all, the share, inferred
    and failed, samples/s since submission, elapsed and remaining time, and why it is stalled."""

    def __init__(self, meta: RunMeta, console: Console) -> None:
        super().__init__(
            TextColumn(f"[bold]{escape(meta.eval)}[/] {escape(meta.split)}"),
            BarColumn(),
            MofNCompleteColumn(),
            TaskProgressColumn(),
            TextColumn("inferred {task.fields[inferred]}  failed {task.fields[failed]}"),
            TextColumn("{task.fields[rate]:,.1f} samples/s"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[stalled]}", style="yellow", markup=False),
            console=console,
            transient=False,
        )
        self._task = self.add_task("run", total=meta.n, failed=0, inferred=0, rate=0.0, stalled="")

    def show(
        self, meta: RunMeta, counts: Counts, stalled: str | None, now: float | None = None
    ) -> None:
        """Show ``counts`` (and the rate since the run was submitted, at ``now``)."""
        elapsed = max((time.time() if now is None else now) - meta.created, 1e-9)
        self.update(
            self._task,
            completed=counts.done,
            failed=counts.failed,
            inferred=counts.inferred,
            rate=counts.done / elapsed,
            stalled=f"stalled: {stalled}" if stalled else "",
        )


def _bar(
    client: Api, run_id: str, console: Console, interval: float, timeout: float | None
) -> RunMeta:
    meta, _ = _progress(client, run_id, console)
    deadline = _deadline(timeout)
    stall = _Stall(client)
    with RunBar(meta, console) as bar:
        while True:
            meta, counts = _progress(client, run_id, console)
            bar.show(meta, counts, stall.update(meta, counts))
            if _ended(meta, deadline):
                return meta
            time.sleep(interval)
