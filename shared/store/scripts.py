"""Loading evalq's Lua scripts: each store registers the scripts it owns from here.

A script lives beside the code that owns it, in ``<package>/lua/<name>.lua`` (the store's in
``shared/store/lua/``, the fair dispatcher's in ``shared/queue/lua/``, the budget's, tiers'
and registry's in ``shared/access/lua/``), and opens with a header naming exactly the keys and
arguments its caller passes. Key names are spelled in :mod:`shared.keys` only: a script gets
its keys from its caller, and one that names keys as it goes (the fair dispatcher, for each
principal and run it serves) gets their templates. ``shared/store/lua/prelude.lua`` holds the
helper functions more than one script needs; it is put in front of every script, so a rule
such as "a run's first write moves it from queued to running" is written once.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from importlib import resources
from typing import Any

import redis
from redis.commands.core import Script

__all__ = ["flatten", "register"]


def _read(package: str, name: str) -> str:
    return resources.files(package).joinpath("lua", f"{name}.lua").read_text(encoding="utf-8")


@cache
def _source(package: str, name: str) -> str:
    return _read("shared.store", "prelude") + "\n" + _read(package, name)


def register(client: redis.Redis, package: str, name: str) -> Script:
    """The script ``name`` of ``package`` (``shared.store``, ``shared.queue``, ...), with the
    prelude, registered on ``client``; Redis runs it by its SHA and loads it again by itself
    after a restart."""
    return client.register_script(_source(package, name))


def flatten(values: Mapping[Any, str | int]) -> list[Any]:
    """``{key: value}`` as the flat ``key1, value1, key2, value2, ...`` the scripts take."""
    return [item for pair in values.items() for item in pair]
