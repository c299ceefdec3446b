"""The gateway (``evalq serve``): the HTTP door for callers who are not operators.

It holds the Redis credential and reads the data; a caller holds an API token, and the token
alone says who the caller is (:class:`evalq.shared.access.roles.Caller`). Every route hands the
work to a :class:`evalq.producer.service.client.Client` acting for that principal, so the gateway
applies exactly the rules direct mode does (tiers, floors, budgets:
:mod:`evalq.shared.access.policy`), plus the role and ownership rules of
:mod:`evalq.shared.access.roles` that only a gateway can enforce. A refusal (a bad token, a missing
role, a tier, a budget) answers one line and is appended to the audit stream.

Errors answer ``{"error": "<one line>", "exit_code": N}`` with the exit code the CLI would have
exited with in direct mode; :class:`evalq.producer.clients.remote.RemoteClient` turns them back
into that.

Direct mode is the same app built in the command's process for the operator
(``create_gateway(settings, operator=...)``, :mod:`evalq.producer.clients.inprocess`): no token is
read, no limit applies, and an error is raised in the command rather than answered.

The modules: :mod:`~evalq.producer.gateway.app` builds the FastAPI app (``create_gateway``: its
middleware, error handlers and routers); :mod:`~evalq.producer.gateway.context` holds what every
request shares; :mod:`~evalq.producer.gateway.caller` says who a request's token stands for and
holds it to its limits; :mod:`~evalq.producer.gateway.acting` is the client a route acts through for
that caller; :mod:`~evalq.producer.gateway.errors` turns exceptions into answers. The routers, one
per resource: :mod:`~evalq.producer.gateway.runs`, :mod:`~evalq.producer.gateway.results`,
:mod:`~evalq.producer.gateway.datasets`, :mod:`~evalq.producer.gateway.policy` and
:mod:`~evalq.producer.gateway.tokens`, over the parameter types of
:mod:`~evalq.producer.gateway.params`. Beside them: :mod:`~evalq.producer.gateway.limits` (rate
limits, stream caps, the body limit), :mod:`~evalq.producer.gateway.streams` (results streams on
asyncio) and :mod:`~evalq.producer.gateway.retainer` (the retention thread).

The modules that FastAPI reads (routes and dependencies) do not use ``from __future__ import
annotations``: FastAPI reads their annotations at run time.
"""
