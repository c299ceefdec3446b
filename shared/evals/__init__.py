"""Built-in evaluations, registered whenever plugins are loaded."""

from evalq.shared.evals import arithmetic, null, topic

__all__ = ["arithmetic", "null", "topic"]
