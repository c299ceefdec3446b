"""Watching a run until it ends: a live rich progress bar on a terminal (samples settled,
inferred, failed, samples/s since submission, elapsed and remaining time), and plain progress
lines when the output is a file or a pipe, where a bar would be cut to pieces."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Protocol

from rich.console import Console, RenderableType
from rich.markup import escape
from rich.measure import Measurement
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Column, Table
from rich.text import Text

from evalq.shared.cli import redis_unreachable
from evalq.shared.errors import GatewayUnreachableError
from evalq.shared.models import Progress as Counts
from evalq.shared.models import RunMeta

__all__ = ["RunBar", "Watched", "follow", "progress_line"]


class Watched(Protocol):
    """What following a run reads: the CLI's client of the gateway's routes, or the demos'
    service client beside their private Redis."""

    def progress(self, run_id: str) -> tuple[RunMeta, Counts]: ...

    def stalled(self, meta: RunMeta, progress: Counts) -> str | None: ...


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

    def __init__(self, client: Watched) -> None:
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
    client: Watched,
    run_id: str,
    console: Console,
    interval: float = 0.2,
    timeout: float | None = None,
) -> RunMeta:
    """Show progress until the run is completed, failed or cancelled; return its record."""
    if console.is_terminal:
        return _bar(client, run_id, console, interval, timeout)
    return _lines(client, run_id, console, interval, timeout)


def _progress(client: Watched, run_id: str, console: Console) -> tuple[RunMeta, Counts]:
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
    client: Watched, run_id: str, console: Console, interval: float, timeout: float | None
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


BAR_WIDTH = (10, 40)
"""The bar's graphic: shown only where this many columns are left for it, at most this many."""


class RunBar(Progress):
    """The live bar of one run, made to fit the terminal at every refresh: samples settled of
    all, inferred and failed, samples/s since submission, then as far as they fit the run's
    eval and split, the share, elapsed and remaining time and the bar's graphic (what does not
    fit is left out, never cut: a number shows whole or not at all). Where even the counts and
    the rate do not fit one line, they wrap, word by word. Why the run is stalled goes on a
    line of its own."""

    def __init__(self, meta: RunMeta, console: Console) -> None:
        # most important first; each shown whole or left out
        self._parts: dict[str, ProgressColumn] = {
            "counts": MofNCompleteColumn(),
            "failed": TextColumn("inferred {task.fields[inferred]}  failed {task.fields[failed]}"),
            "rate": TextColumn("{task.fields[rate]:,.1f} samples/s"),
            "name": TextColumn(f"[bold]{escape(meta.eval)}[/] {escape(meta.split)}"),
            "share": TaskProgressColumn(),
            "elapsed": TimeElapsedColumn(),
            "remaining": TimeRemainingColumn(),
        }
        super().__init__(console=console, transient=False)
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

    def get_renderables(self) -> Iterable[RenderableType]:
        tasks = [task for task in self.tasks if task.visible]
        if not tasks:  # rich asks once before the task is added
            return
        yield self._table(tasks, self.console.width)
        for task in tasks:
            if task.fields.get("stalled"):
                yield Text(task.fields["stalled"], style="yellow")

    def _table(self, tasks: list[Task], width: int) -> Table:
        """One row a task, of the parts that fit ``width`` (columns one apart), in the order
        name, bar, counts, share, inferred and failed, rate, elapsed, remaining."""
        needed = {
            key: max((self._width(column(task)) for task in tasks), default=0)
            for key, column in self._parts.items()
        }
        shown: list[str] = []
        used = -1  # no space before the first column
        for key in self._parts:
            if used + 1 + needed[key] > width:
                break
            shown.append(key)
            used += 1 + needed[key]
        if len(shown) < 3:  # not even the counts and the rate on one line: wrap them
            return self._wrapped(tasks)
        columns: list[ProgressColumn] = [self._parts[key] for key in _ORDER if key in shown]
        room = min(BAR_WIDTH[1], width - used - 1)
        if len(shown) == len(self._parts) and room >= BAR_WIDTH[0]:  # the first part left out
            columns.insert(1, BarColumn(bar_width=room))
        table = Table.grid(
            *(column.get_table_column().copy() for column in columns), padding=(0, 1)
        )
        for task in tasks:
            table.add_row(*(column(task) for column in columns))
        return table

    def _wrapped(self, tasks: list[Task]) -> Table:
        table = Table.grid(Column(overflow="fold"))
        for task in tasks:
            parts = [self._parts[key](task) for key in ("counts", "failed", "rate")]
            table.add_row(Text(" ").join(p for p in parts if isinstance(p, Text)))
        return table

    def _width(self, renderable: RenderableType) -> int:
        return Measurement.get(self.console, self.console.options, renderable).maximum


_ORDER = ("name", "counts", "share", "failed", "rate", "elapsed", "remaining")
"""The order the parts of :class:`RunBar` that fit are shown in (the bar after the name)."""


def _bar(
    client: Watched, run_id: str, console: Console, interval: float, timeout: float | None
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
