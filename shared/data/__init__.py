"""Datasets as small specs: the spec and its fingerprint, loading a split (local files, the Hub),
and routing samples to shards."""
