"""What evalq keeps in Redis and beside it, each store owning its Lua scripts (``lua/``): runs,
per-sample results (live, spilled, archived), worker presence, the audit stream, retention,
provenance, and the Parquet archive."""
