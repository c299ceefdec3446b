"""What a process hands the evaluations it builds: its settings and its Redis client.

Evaluations never fetch either themselves: the worker makes one :class:`Services` at boot (from
the settings it was started with and the client it opened) and passes it to
:func:`evalq.shared.kinds.evaluation_of`; an evaluation built only to be described (the
producer's, at submission) gets none, and cannot load a model that needs them.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

from evalq.shared.settings import Settings

__all__ = ["Services"]


@dataclass(frozen=True)
class Services:
    """The worker's settings and Redis client, for the evaluations it runs (an endpoint
    model's rate limit, response cache and token spend are kept in that Redis)."""

    settings: Settings
    client: redis.Redis
