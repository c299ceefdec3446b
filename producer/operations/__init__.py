"""Running evalq: the local stack (`evalq up`: Redis, workers, gateway, Flower, supervised), Redis
ACLs, Prometheus metrics, and the demos."""
