"""The contract producers and workers share: settings, models, errors, keys, Lua scripts,
stores, dataset specs, the Evaluation plugin API and the Celery app factory."""

from __future__ import annotations

from typing import TYPE_CHECKING

from evalq.shared.lazy import lazy_exports

if TYPE_CHECKING:
    from evalq.shared.errors import EvalqError, PermanentError, RetryableError
    from evalq.shared.evaluation import Evaluation, register
    from evalq.shared.failures import FailurePolicy
    from evalq.shared.models import RunMeta, RunStatus, SampleResult, SampleTask
    from evalq.shared.settings import Settings, get_settings

__all__ = [
    "EvalqError",
    "Evaluation",
    "FailurePolicy",
    "PermanentError",
    "RetryableError",
    "RunMeta",
    "RunStatus",
    "SampleResult",
    "SampleTask",
    "Settings",
    "get_settings",
    "register",
]

# Each name is imported where it lives the first time it is read (PEP 562): importing this
# package, which every ``evalq.*`` import does, loads none of them (``evalq --help`` and a read
# through the gateway need neither numpy nor Celery).
_WHERE = {
    "EvalqError": "evalq.shared.errors",
    "PermanentError": "evalq.shared.errors",
    "RetryableError": "evalq.shared.errors",
    "Evaluation": "evalq.shared.evaluation",
    "register": "evalq.shared.evaluation",
    "FailurePolicy": "evalq.shared.failures",
    "RunMeta": "evalq.shared.models",
    "RunStatus": "evalq.shared.models",
    "SampleResult": "evalq.shared.models",
    "SampleTask": "evalq.shared.models",
    "Settings": "evalq.shared.settings",
    "get_settings": "evalq.shared.settings",
}


__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
