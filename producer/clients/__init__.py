"""The one client of the gateway's routes (:class:`~evalq.producer.clients.remote.RemoteClient`)
and its doors: over HTTP with a token, or in this process as the operator
(:mod:`~evalq.producer.clients.inprocess`); :func:`~evalq.producer.clients.api.open_api` picks."""
