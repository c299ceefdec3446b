"""Which door a command goes through: the gateway when ``EVALQ_API_URL`` is set, Redis
otherwise (direct mode: operator trust)."""

from __future__ import annotations

from producer.client import Client
from producer.remote import RemoteClient
from shared.settings import Settings, get_settings

__all__ = ["Api", "open_api"]

Api = Client | RemoteClient
"""What the CLI's commands call: the same methods, over Redis or over HTTP."""


def open_api(settings: Settings | None = None, admin: bool = False) -> Api:
    """A :class:`RemoteClient` of the gateway when ``api_url`` is set (``redis_url`` is then
    never read), else a direct :class:`Client`."""
    settings = settings or get_settings()
    if settings.api_url:
        token = settings.token.get_secret_value() if settings.token else None
        return RemoteClient(settings.api_url, token, admin)
    return Client(settings, admin)
