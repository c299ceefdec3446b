"""The contract producers and workers share: settings, models, errors, keys, Lua scripts,
stores, dataset specs, the Evaluation plugin API and the Celery app factory."""

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
