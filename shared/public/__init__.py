"""evalq's public import path for plugin authors: ``from evalq import Evaluation, register``.

The wheel installs this package as the top-level ``evalq`` (``package-dir`` in
pyproject.toml), so a plugin imports what it needs from one name that is evalq's own; the
objects are those of ``shared`` itself (the same classes, the same registry), re-exported.
"""

from shared.errors import EvalqError, PermanentError, RetryableError
from shared.evaluation import Evaluation, Parameters, register
from shared.failures import FailurePolicy
from shared.models import RunMeta, RunStatus, SampleResult
from shared.scorer import ScriptCall, ScriptScorer
from shared.settings import Settings

__all__ = [
    "EvalqError",
    "Evaluation",
    "FailurePolicy",
    "Parameters",
    "PermanentError",
    "RetryableError",
    "RunMeta",
    "RunStatus",
    "SampleResult",
    "ScriptCall",
    "ScriptScorer",
    "Settings",
    "register",
]
