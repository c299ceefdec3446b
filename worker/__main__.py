"""``python -m worker``: the same as ``evalq worker``."""

from worker.cli import main

main()
