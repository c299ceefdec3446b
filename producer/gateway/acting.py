"""The client a route acts through for its caller (:data:`Act`), with the checks only a gateway
makes: the admin flag is an admin's, a user's runs are its own, admin operations need the
role (:mod:`evalq.shared.access.policy`)."""

from typing import Annotated

from fastapi import Depends

from evalq.producer.gateway.caller import Who
from evalq.producer.gateway.context import Context, Shared
from evalq.producer.service.client import Client
from evalq.shared.access.roles import (
    Caller,
    admit_admin_flag,
    admit_owner,
    require_admin,
    sees_sources,
)

__all__ = ["Act", "Acting", "acting"]


class Acting:
    """A request's caller and the :class:`Client` acting for it. The checks run when a route
    asks for the client: after FastAPI validated the request (a bad request answers 422
    before any refusal), on the thread the route reads on (a results stream's own)."""

    def __init__(self, who: Caller, context: Context) -> None:
        self.who = who
        self._context = context

    def client(self, admin: bool = False) -> Client:
        """A client for the caller; ``admin`` (bypass tier and budget) is an admin's only."""
        context = self._context
        return Client(
            context.settings,
            admit_admin_flag(self.who, admin),
            principal=self.who.principal,
            client=context.store,
            app=context.celery,
            sees_sources=sees_sources(self.who),
        )

    def owned(self, *run_ids: str, admin: bool = False) -> Client:
        """:meth:`client`, once each of ``run_ids`` is known to be the caller's (an admin's:
        any run)."""
        acting = self.client(admin)
        for run_id in run_ids:
            admit_owner(self.who, run_id, acting.owner(run_id))
        return acting

    def admin(self, what: str) -> Client:
        """:meth:`client` for an admin operation, ``what`` as a refusal names it."""
        require_admin(self.who, what)
        return self.client()


async def acting(who: Who, context: Shared) -> Acting:
    """The request's :class:`Acting` (on the event loop: it reads nothing)."""
    return Acting(who, context)


Act = Annotated[Acting, Depends(acting)]
"""A route's parameter receiving its :class:`Acting`."""
