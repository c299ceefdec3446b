"""evalq's public import path for plugin authors: ``from evalq import Evaluation, register``;
``register_scorer`` (with ``ScorerOptions``) for a YAML task's Python scorer; ``run`` to try an
evaluation in this process on a handful of rows (:mod:`evalq.shared.trial`); ``open_api`` for
the client a script drives evalq with (the gateway's routes: over HTTP, or in its own process
for an operator).

The wheel installs this package as the top-level ``evalq`` (``package-dir`` in
pyproject.toml), so a plugin imports what it needs from one name that is evalq's own; the
objects are those of ``shared`` itself (the same classes, the same registry), re-exported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from evalq.shared.lazy import lazy_exports

if TYPE_CHECKING:
    from evalq.producer.clients.api import open_api
    from evalq.shared.errors import EvalqError, PermanentError, RetryableError
    from evalq.shared.evaluation import Evaluation, Parameters, register
    from evalq.shared.failures import FailurePolicy
    from evalq.shared.lm.scorers import ScorerOptions, register_scorer
    from evalq.shared.models import RunMeta, RunStatus, SampleResult
    from evalq.shared.scorer import ScriptCall, ScriptScorer
    from evalq.shared.settings import Settings
    from evalq.shared.trial import Trial, run

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
    "ScorerOptions",
    "ScriptCall",
    "ScriptScorer",
    "Settings",
    "Trial",
    "open_api",
    "register",
    "register_scorer",
    "run",
]

# Each name is imported where it lives the first time it is read (PEP 562): importing this
# package, which every ``evalq.*`` import does, loads none of them (``evalq --help`` and a read
# through the gateway need neither numpy nor Celery).
_WHERE = {
    "EvalqError": "evalq.shared.errors",
    "PermanentError": "evalq.shared.errors",
    "RetryableError": "evalq.shared.errors",
    "Evaluation": "evalq.shared.evaluation",
    "Parameters": "evalq.shared.evaluation",
    "register": "evalq.shared.evaluation",
    "FailurePolicy": "evalq.shared.failures",
    "RunMeta": "evalq.shared.models",
    "RunStatus": "evalq.shared.models",
    "SampleResult": "evalq.shared.models",
    "ScriptCall": "evalq.shared.scorer",
    "ScriptScorer": "evalq.shared.scorer",
    "Settings": "evalq.shared.settings",
    "Trial": "evalq.shared.trial",
    "run": "evalq.shared.trial",
    "register_scorer": "evalq.shared.lm.scorers",
    "ScorerOptions": "evalq.shared.lm.scorers",
    "open_api": "evalq.producer.clients.api",
}


__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
