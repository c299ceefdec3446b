"""Built-in evaluations, registered whenever plugins are loaded."""

from shared.evals import topic

__all__ = ["topic"]
