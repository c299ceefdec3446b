"""evalq's public import path for plugin authors: ``from evalq import Evaluation, register``.

The wheel installs this package as the top-level ``evalq`` (``package-dir`` in
pyproject.toml), so a plugin imports what it needs from one name that is evalq's own; the
objects are those of ``shared`` itself (the same classes, the same registry), re-exported.
"""

from evalq.shared.errors import EvalqError, PermanentError, RetryableError
from evalq.shared.evaluation import Evaluation, Parameters, register
from evalq.shared.failures import FailurePolicy
from evalq.shared.models import RunMeta, RunStatus, SampleResult
from evalq.shared.scorer import ScriptCall, ScriptScorer
from evalq.shared.settings import Settings

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
