"""``python -m evalq.worker``: the same as ``evalq worker``."""

from evalq.worker.commands import main

main()
