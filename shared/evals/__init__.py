"""Built-in evaluations, registered whenever plugins are loaded."""

from shared.evals import arithmetic, null, topic

__all__ = ["arithmetic", "null", "topic"]
