"""The Lua scripts that make evalq's multi-key writes atomic, registered once per client.

Each script lives in ``shared/lua/<name>.lua`` with a header naming every key and argument; the
wrappers here are the only callers and turn replies into typed values.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

import redis

from shared.keys import RunKeys

__all__ = ["Scripts"]


@cache
def _source(name: str) -> str:
    return resources.files("shared").joinpath("lua", f"{name}.lua").read_text(encoding="utf-8")


def _flatten(values: dict[int, str]) -> list[str | int]:
    flat: list[str | int] = []
    for sample_id, value in values.items():
        flat += [sample_id, value]
    return flat


class Scripts:
    """evalq's Lua scripts bound to one Redis client (or pipeline)."""

    def __init__(self, client: redis.Redis) -> None:
        self._record_outputs = client.register_script(_source("record_outputs"))
        self._settle = client.register_script(_source("settle"))

    def record_outputs(
        self, keys: RunKeys, outputs: dict[int, str], client: redis.Redis | None = None
    ) -> int:
        """HSETNX each output; return how many were newly written."""
        return int(
            self._record_outputs(
                keys=[keys.out, keys.progress, keys.meta], args=_flatten(outputs), client=client
            )
        )

    def settle(
        self, keys: RunKeys, kind: str, values: dict[int, str], client: redis.Redis | None = None
    ) -> tuple[int, bool]:
        """Write terminal scores (``kind='score'``) or errors (``'err'``) once per sample.

        Returns how many were written and whether this caller must finalize the run.
        """
        written, finalize = self._settle(
            keys=[keys.score, keys.err, keys.progress, keys.meta],
            args=[kind, *_flatten(values)],
            client=client,
        )
        return int(written), bool(finalize)
