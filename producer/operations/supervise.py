"""What ``evalq up`` does when one of its processes exits on its own: start it again, after a
back-off (1 s, doubling to 30 s while it keeps dying soon after each start), saying so in one
line each time; a process that exits :data:`GIVE_UP` times within :data:`WINDOW` seconds is
reported in one line and left down. Only the caller (Ctrl-C) stops the others.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from evalq.shared.errors import EvalqError

__all__ = ["FIRST_DELAY", "GIVE_UP", "MOST_DELAY", "WINDOW", "Supervisor", "Unit", "kill_group"]

FIRST_DELAY = 1.0
"""Seconds before the first restart of a process that exited."""
MOST_DELAY = 30.0
"""The longest wait before a restart (the delay doubles while the process keeps dying)."""
WINDOW = 60.0
"""A process that ran this long before it exited starts again after :data:`FIRST_DELAY`."""
GIVE_UP = 5
"""Exits within :data:`WINDOW` seconds after which a process is left down."""


def kill_group(pid: int) -> None:
    """SIGKILL what is left of the session (process group) led by ``pid``, a process that has
    exited: a worker's pool processes outlive a SIGKILLed worker."""
    with contextlib.suppress(ProcessLookupError, PermissionError):  # nothing left of it
        os.killpg(pid, signal.SIGKILL)


@dataclass
class Unit:
    """One supervised process: ``poll`` is its exit status (None while it runs), ``start``
    starts it again (raising :class:`EvalqError` when it cannot)."""

    name: str
    log: Path
    poll: Callable[[], int | None]
    start: Callable[[], object]
    started: float = 0.0
    exits: list[float] = field(default_factory=list)
    streak: int = 0
    due: float | None = None
    """When it is to be started again; None while it runs (or is left down)."""
    down: bool = False


class Supervisor:
    """Watches :class:`Unit` s; :meth:`check` restarts those due and returns what to say."""

    def __init__(self, units: list[Unit], now: float) -> None:
        self.units = units
        for unit in units:
            unit.started = now

    @property
    def left_down(self) -> list[str]:
        """The processes given up on."""
        return [unit.name for unit in self.units if unit.down]

    def check(self, now: float) -> list[str]:
        """Note the processes that exited since the last check and start those whose back-off
        is over; one line for each thing that happened."""
        said: list[str] = []
        for unit in self.units:
            if unit.down:
                continue
            if unit.due is None:
                code = unit.poll()
                if code is not None:
                    said.append(self._exited(unit, f"exited with status {code}", now))
            if unit.due is not None and now >= unit.due:
                said.extend(self._start(unit, now))
        return said

    def _exited(self, unit: Unit, how: str, now: float) -> str:
        unit.exits = [t for t in unit.exits if now - t < WINDOW] + [now]
        unit.streak = 1 if now - unit.started >= WINDOW else unit.streak + 1
        if len(unit.exits) >= GIVE_UP:
            unit.down = True
            return (
                f"error: {unit.name} {how} (its log: {unit.log}); it exited {len(unit.exits)} "
                f"times within {WINDOW:.0f}s: left down (Ctrl-C stops the rest)"
            )
        delay = min(MOST_DELAY, FIRST_DELAY * 2 ** (unit.streak - 1))
        unit.due = now + delay
        return f"{unit.name} {how} (its log: {unit.log}); restarting it in {delay:.0f}s"

    def _start(self, unit: Unit, now: float) -> list[str]:
        unit.due = None
        unit.started = now
        try:
            unit.start()
        except EvalqError as exc:
            return [self._exited(unit, f"did not start: {exc}", now)]
        return [f"{unit.name} restarted"]
