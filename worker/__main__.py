"""``python -m worker``: the same as ``evalq worker``."""

import sys

from producer.cli import main

main(["worker", *sys.argv[1:]])
