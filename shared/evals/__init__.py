"""Built-in evaluations, registered whenever plugins are loaded."""

from shared.evals import null, topic

__all__ = ["null", "topic"]
