"""Background steps that must not die of one failure: the worker's presence thread and the
gateway's retainer run each step through a :class:`Guard`."""

from __future__ import annotations

import logging
from collections.abc import Callable

import redis

from evalq.shared.errors import first_line

__all__ = ["Guard"]


class Guard:
    """Runs steps and logs their failures to ``log``. A step Redis refuses for the ACL user
    (``NOPERM``) is logged every time it is refused, naming the user and the keys (see
    :func:`evalq.shared.connection.refusal`): rights do not come back by themselves. Any other
    failure (Redis unreachable) is logged once until the step works again."""

    def __init__(self, log: logging.Logger, prefix: str) -> None:
        self._log = log
        self._prefix = prefix
        self._failing: set[str] = set()

    def run(self, what: str, step: Callable[[], object]) -> bool:
        """Run ``step``; False if it failed."""
        try:
            step()
        except redis.exceptions.NoPermissionError as exc:
            self._log.error("%s %s refused: %s", self._prefix, what, first_line(exc))
            self._failing.add(what)
            return False
        except Exception as exc:
            if what not in self._failing:
                self._log.warning("%s %s failed: %s", self._prefix, what, first_line(exc))
            self._failing.add(what)
            return False
        if what in self._failing:
            self._log.info("%s %s works again", self._prefix, what)
        self._failing.discard(what)
        return True
