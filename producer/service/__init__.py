"""The service: every operation on runs, data and policy as one principal, with the policy
applied to every read (:class:`~evalq.producer.service.client.Client` and its parts: submitting,
rescoring, resuming, views of runs, per-sample reads, comparisons, the report's data, policy files,
sweeps). The gateway's routes call it; nothing here renders or speaks HTTP."""
