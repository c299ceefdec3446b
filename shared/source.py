"""Which code a process runs for an evaluation, and whether its file has changed since.

A plugin is imported once; editing its file afterwards changes nothing in a running worker or
gateway until it restarts. :func:`snapshot` takes the source file's sha256 when the class is
registered (the code this process runs); :class:`SourceFile.now` hashes the file again only
when its modification time or size moved, so asking often is cheap.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import os
from dataclasses import dataclass, field

__all__ = ["SourceFile", "snapshot", "stale_note"]

log = logging.getLogger("evalq.plugins")


def _sha256(path: str) -> str | None:
    try:
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()
    except OSError:
        return None


def _stat(path: str) -> tuple[int, int] | None:
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_mtime_ns, found.st_size


@dataclass
class SourceFile:
    """An evaluation's source file and the sha256 it had when this process loaded it."""

    name: str
    """The evaluation's registered name."""
    path: str
    loaded: str
    """sha256 of the file when the class was registered: the code this process runs."""
    _seen: tuple[tuple[int, int] | None, str | None] = field(default=(None, None), repr=False)
    _warned: str | None = field(default=None, repr=False)

    def now(self) -> str | None:
        """sha256 of the file on disk now (None when it cannot be read); hashed again only when
        its modification time or size changed since the last look."""
        stat = _stat(self.path)
        if stat is None:
            return None
        if stat != self._seen[0]:
            self._seen = (stat, _sha256(self.path))
        return self._seen[1]

    def changed(self) -> str | None:
        """The file's sha256 now when it differs from the loaded one, else None."""
        now = self.now()
        return None if now is None or now == self.loaded else now

    def stale(self) -> str | None:
        """:meth:`changed`, and the first time each new content is seen, a warning in this
        process's log (once per change: call it from one place per process)."""
        now = self.changed()
        if now is None:
            return None
        if now != self._warned:
            self._warned = now
            log.warning(
                "evaluation %r runs code %s, but %s is now %s: restart this process to run "
                "the edit",
                self.name,
                self.loaded[:12],
                self.path,
                now[:12],
            )
        return now


def snapshot(name: str, cls: type) -> SourceFile | None:
    """``cls``'s source file as it is now (call it when the class is registered); None when
    the class has no source file."""
    try:
        path = inspect.getsourcefile(cls)
    except TypeError:
        return None
    loaded = None if path is None else _sha256(path)
    if path is None or loaded is None:
        return None
    return SourceFile(name, path, loaded, ((_stat(path)), loaded))


def stale_note(loaded: str, now: str | None) -> str:
    """``code ad84e7a0c470`` and `` (stale: file now 14befa780383)`` when ``now`` differs."""
    note = f"code {loaded[:12]}"
    return note if now is None or now == loaded else f"{note} (stale: file now {now[:12]})"
