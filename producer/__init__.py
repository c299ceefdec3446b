"""evalq producer: submit, follow and export runs; the CLI; the demo."""

from producer.submit import SubmitRequest, submit

__all__ = ["SubmitRequest", "submit"]
