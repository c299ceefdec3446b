"""Loading evalq's Lua scripts: each store registers the scripts it owns from here.

A script lives in ``shared/lua/<name>.lua`` and opens with a header naming every key and
argument. ``prelude.lua`` holds the helper functions more than one script needs; it is put in
front of every script, so a rule such as "a run's first write moves it from queued to running"
is written once.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

import redis
from redis.commands.core import Script

__all__ = ["register"]


def _read(name: str) -> str:
    return resources.files("shared").joinpath("lua", f"{name}.lua").read_text(encoding="utf-8")


@cache
def _source(name: str) -> str:
    return _read("prelude") + "\n" + _read(name)


def register(client: redis.Redis, name: str) -> Script:
    """The script ``name`` (with the prelude) registered on ``client``; Redis runs it by its
    SHA and loads it again by itself after a restart."""
    return client.register_script(_source(name))
