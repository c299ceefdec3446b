"""Loading evalq's Lua scripts: each store registers the scripts it owns from here.

A script lives beside the code that owns it, in ``<package>/lua/<name>.lua`` (the store's in
``shared/store/lua/``, the fair dispatcher's in ``shared/queue/lua/``, the budget's, tiers'
and registry's in ``shared/access/lua/``), and opens with a header naming exactly the keys and
arguments its caller passes. Key names are spelled in :mod:`evalq.shared.keys` only: a script gets
its keys from its caller, and one that names keys as it goes (the fair dispatcher, for each
principal and run it serves) gets their templates; run statuses are spelled in
:class:`evalq.shared.choices.RunStatus` only, put in front of every script as the table
``STATUS``. ``shared/store/lua/prelude.lua`` holds the helper functions more than one script
needs; it is put in front of every script, so a rule such as "a run's first write moves it from
queued to running" is written once; a package's own ``lua/prelude.lua`` (the fair dispatcher's,
in ``shared/queue/lua/``) goes in front of that package's scripts only. How a run and a sample
move between their states is drawn in ``docs/states.md``.

A script whose writes must survive a failover is registered ``confirmed``: each call returns
only once a replica holds its effects (:func:`evalq.shared.connection.confirmed`).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from importlib import resources
from typing import Any, cast

import redis
from redis.client import Pipeline
from redis.commands.core import Script
from redis.exceptions import NoScriptError

from evalq.shared.choices import RunStatus
from evalq.shared.connection import confirmed

__all__ = ["flatten", "register"]

STORE = "evalq.shared.store"


def _read(package: str, name: str) -> str:
    return resources.files(package).joinpath("lua", f"{name}.lua").read_text(encoding="utf-8")


def _statuses() -> str:
    """The Lua table ``STATUS`` of the run statuses, from :class:`RunStatus`: a script spells
    ``STATUS.RUNNING``, never ``'running'``."""
    members = ", ".join(f"{status.name} = '{status.value}'" for status in RunStatus)
    return f"local STATUS = {{{members}}}\n"


@cache
def _source(package: str, name: str) -> str:
    parts = [_statuses(), _read(STORE, "prelude")]
    if package != STORE and resources.files(package).joinpath("lua", "prelude.lua").is_file():
        parts.append(_read(package, "prelude"))
    return "\n".join([*parts, _read(package, name)])


class _Script(Script):
    """A script that runs on whichever server a call reaches: redis-py answers a server that
    lacks it (``NoScriptError``: a promoted replica, a restart) with ``SCRIPT LOAD`` and a
    second ``EVALSHA``, which a failover between the two can send to different servers (a
    burst of submits near a failover failed with a raw ``NoScriptError``); a second miss runs
    it with ``EVAL``, its source in the same command, which also loads it there."""

    def __call__(self, keys: Any = None, args: Any = None, client: Any = None) -> Any:
        try:
            return super().__call__(keys, args, client)
        except NoScriptError:
            if isinstance(client, Pipeline):  # queued: its caller's pipeline loads it again
                raise
            target = self.registered_client if client is None else client
            keys, args = list(keys or []), list(args or [])
            return target.eval(cast(str, self.script), len(keys), *keys, *args)


class _Confirmed(_Script):
    """A script whose calls return once :func:`confirm` has waited for its replicas."""

    def __call__(self, keys: Any = None, args: Any = None, client: Any = None) -> Any:
        if client is not None:  # in a caller's pipeline: the caller confirms
            return super().__call__(keys, args, client)
        run = super().__call__
        return confirmed(
            cast(redis.Redis, self.registered_client), lambda one: run(keys, args, one)
        )


def register(client: redis.Redis, package: str, name: str, *, confirmed: bool = False) -> Script:
    """The script ``name`` of ``package`` (``evalq.shared.store``, ``evalq.shared.queue``, ...),
    with the prelude, registered on ``client``; Redis runs it by its SHA and loads it again by
    itself
    after a restart (a promoted replica has none loaded). ``confirmed``: each call waits for
    the client's replicas (see the module)."""
    if confirmed:
        return _Confirmed(client, _source(package, name))
    return _Script(client, _source(package, name))


def flatten(values: Mapping[Any, str | int]) -> list[Any]:
    """``{key: value}`` as the flat ``key1, value1, key2, value2, ...`` the scripts take."""
    return [item for pair in values.items() for item in pair]
