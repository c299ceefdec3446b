"""Which door a command goes through: the gateway when ``EVALQ_API_URL`` is set, else the same
gateway's app in this process (direct mode: the operator, holding the Redis URL). Either way
the command talks to the gateway's routes through one client,
:class:`evalq.producer.clients.remote.RemoteClient`; each route acts through the service,
:class:`evalq.producer.service.client.Client`. Importing this module loads neither; :func:`open_api`
loads what the door it opens needs (a gateway's URL: no Redis, Celery nor FastAPI).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from evalq.producer.clients.remote import RemoteClient
    from evalq.shared.settings import Settings

__all__ = ["open_api"]


def open_api(settings: Settings | None = None, admin: bool = False) -> RemoteClient:
    """A :class:`evalq.producer.clients.remote.RemoteClient` of the gateway at ``api_url`` when it
    is set (``redis_url`` is then never read), else of the gateway's app built here for
    ``settings.principal`` as an operator
    (:func:`evalq.producer.clients.inprocess.operator_client`). ``admin`` is ``--admin``: bypass
    tier and budget, read every tier (admins only; audited)."""
    from evalq.shared.settings import get_settings

    settings = settings or get_settings()
    if settings.api_url:
        from evalq.producer.clients.remote import RemoteClient

        token = settings.token.get_secret_value() if settings.token else None
        return RemoteClient(settings.api_url, token, admin)
    from evalq.producer.clients.inprocess import operator_client

    return operator_client(settings, admin)
