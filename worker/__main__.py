"""``python -m worker``: the same as ``evalq worker``."""

from worker.commands import main

main()
