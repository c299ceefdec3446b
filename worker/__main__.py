"""``python -m worker``: the same as ``evalq worker``."""

from producer.cli import main

main(["worker", *__import__("sys").argv[1:]])
