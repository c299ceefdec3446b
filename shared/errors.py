"""The one exception tree of evalq.

Everything evalq raises on purpose derives from :class:`EvalqError`. Two branches decide what a
worker does with a failure: :class:`RetryableError` is tried again, :class:`PermanentError` ends
the sample with a terminal error record. ``exit_code`` is what the CLI exits with: 1 error,
2 bad input, 3 refused by policy, 4 a followed run ended ``failed`` or ``cancelled``, 130
the person stopped following a run (Ctrl-C).
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "BadResponse",
    "BudgetExhaustedError",
    "ComparisonError",
    "DataError",
    "DetachedError",
    "EndpointError",
    "EvalqError",
    "ForbiddenError",
    "GatewayUnreachableError",
    "GraderError",
    "InputError",
    "ModelHostError",
    "OutputTooLarge",
    "OverReported",
    "ParamError",
    "PayloadError",
    "PermanentError",
    "PluginError",
    "PolicyError",
    "PolicyRefusedError",
    "RateLimited",
    "Refused",
    "RemoteError",
    "RetryableError",
    "RoutingError",
    "RunNotCompletedError",
    "RunTooLarge",
    "SampleIdError",
    "ScriptError",
    "ServerError",
    "ShardMismatchError",
    "SourceUnreachableError",
    "SpecError",
    "SplitNotFoundError",
    "StoreError",
    "ThrottledError",
    "TierRefusedError",
    "Timeout",
    "TokensExhausted",
    "TooLarge",
    "UnauthorizedError",
    "UnknownDatasetError",
    "UnknownEvalError",
    "UnknownRunError",
    "Unreachable",
    "first_line",
]


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its class name when the message is empty):
    how a foreign error is shown to a person or stored in an error record."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


class EvalqError(Exception):
    """Base of every error evalq raises on purpose; its message is one line for a person."""

    exit_code = 1


class RetryableError(EvalqError):
    """A failure that may pass if the same work is tried again (a connection, a timeout)."""


class PermanentError(EvalqError):
    """A failure that will repeat on every try; the sample ends with a terminal error."""


class StoreError(RetryableError):
    """Redis could not be reached or answered unexpectedly."""


class UnconfirmedWriteError(StoreError):
    """A write that must survive a failover was made, but the master was lost before a
    replica was seen to hold it: it may be lost. Every such write may be made again."""


class InputError(PermanentError):
    """Something the user gave is wrong; nothing was enqueued or charged."""

    exit_code = 2


class UnknownEvalError(InputError):
    """No evaluation is registered under that name in this process."""

    def __init__(self, name: str, known: list[str]) -> None:
        listed = ", ".join(known) or "none"
        super().__init__(
            f"unknown evaluation '{name}' (registered: {listed}; plugins come from EVALQ_PLUGINS)"
        )
        self.name = name
        self.known = known

    def on(self, component: str) -> str:
        """The message as ``component`` (``the gateway``) says it: which process lacks it."""
        listed = ", ".join(self.known) or "none"
        return (
            f"{component} has no evaluation '{self.name}' (it loads: {listed}; plugins come "
            f"from EVALQ_PLUGINS on {component})"
        )


class ParamError(InputError):
    """A parameter the evaluation does not declare, a required one missing, or a value that
    is not of its declared type."""


class PortInUseError(InputError):
    """A port evalq was told to listen on is taken by another process."""


class UnknownDatasetError(InputError):
    """No dataset is registered under that name."""


class UnknownRunError(InputError):
    """No run with that id exists in this Redis."""

    @classmethod
    def named(cls, run_id: object) -> UnknownRunError:
        """``no run 'X'``, the id quoted as Python writes it: one line, whatever it holds."""
        return cls(f"no run {str(run_id)!r}")


class SampleIdError(InputError):
    """A sample id is malformed or outside the split."""


class DataError(InputError):
    """The dataset given with --data cannot be read as asked."""


class SplitNotFoundError(DataError):
    """The dataset has no split of that name."""


class SourceUnreachableError(DataError):
    """The dataset source (the Hugging Face Hub, a path) cannot be reached."""


class SpecError(PermanentError):
    """A published dataset spec is missing, malformed or does not match its fingerprint."""


class RoutingError(SpecError):
    """A spec's routing does not verify: re-fitting it from its own source gave other centroids."""


class ShardMismatchError(SpecError):
    """A shard rebuilt on this worker holds other rows than the first worker recorded."""


class ScriptError(PermanentError):
    """A script scorer failed on one sample: it raised, timed out, crashed or exited."""


class ModelHostError(EvalqError):
    """Isolated inference failed: ``infer()`` raised in its subprocess, or the subprocess could
    not load the model, died or timed out (tried again like any failed inference)."""


class GraderError(PermanentError):
    """A grader model gave no verdict on a sample (its request failed, or its run's token
    budget could not take it): the sample fails at the ``score`` stage."""


class PayloadError(PermanentError):
    """A task message is not a valid evalq payload."""


class PluginError(PermanentError):
    """A plugin module could not be imported or registers something invalid."""


class ArchiveUnreadableError(EvalqError):
    """A run's archive (named by its record) cannot be read from this machine."""


class ComparisonError(InputError):
    """Runs that cannot be compared sample by sample (other datasets, splits or specs)."""


class PolicyError(InputError):
    """A tier or budget setting (or a policy file) is invalid."""


class PolicyRefusedError(EvalqError):
    """A split's tier or budget refuses the request; final, never worth retrying."""

    exit_code = 3


class TierRefusedError(PolicyRefusedError):
    """The split's tier does not allow this (``no_access``, aggregates only, too few samples)."""


class LabelRefusedError(PolicyRefusedError):
    """A task would show the model a field that a registered task or a loaded evaluation calls
    a label (label fields belong to the split, not to the task that names them)."""


class UnauthorizedError(PolicyRefusedError):
    """The gateway was given no token, or one it does not know (revoked, mistyped)."""


class ForbiddenError(PolicyRefusedError):
    """The caller's role does not allow this (an admin operation, another principal's run)."""


class GatewayUnreachableError(EvalqError):
    """The gateway (``EVALQ_API_URL``) cannot be reached."""


class RemoteError(EvalqError):
    """An error the gateway answered with: its one-line message and its exit code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class RunNotCompletedError(EvalqError):
    """A run that was followed to its end ended ``failed`` or ``cancelled``."""

    exit_code = 4


class DetachedError(EvalqError):
    """A person stopped following a run (Ctrl-C); the run goes on without them."""

    exit_code = 130

    def __init__(self, run_id: str) -> None:
        super().__init__(
            f"detached: run {run_id} goes on (evalq watch {run_id}, evalq cancel {run_id})"
        )


class BudgetExhaustedError(PolicyRefusedError):
    """The split's budget has too few runs or samples left, or the run exceeds the per-run cap."""

    def __init__(self, message: str, limit: str) -> None:
        super().__init__(message)
        self.limit = limit


class ThrottledError(EvalqError):
    """The gateway refuses a caller for now: too many requests a second, or too many streams
    open; not audited (a flood would grow the audit stream), worth retrying later."""

    exit_code = 3

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        """Seconds after which the same request would be admitted (None: unknown)."""


class OutputTooLarge(PermanentError):
    """A sample's output (or a grader's grade) is larger than a worker stores
    (``EVALQ_MAX_OUTPUT_BYTES``)."""


class RunTooLarge(PermanentError):
    """A going run's outputs would take more of Redis than a worker lets one run hold
    (``EVALQ_MAX_RUN_BYTES``)."""


class TokensExhausted(PermanentError):
    """A token budget (``budget set --tokens``) has too few tokens left for a request, with
    none held by requests in flight that could give some back: the request is not sent, and
    its sample ends unsent (recorded at the ``budget`` stage, left out of the run's numbers,
    its charge given back)."""

    stage: ClassVar[str] = "budget"


class EndpointError(PermanentError):
    """A request that could not be answered after its retries: its sample's terminal error,
    recorded at the ``endpoint`` stage with the class's name as its kind."""

    stage: ClassVar[str] = "endpoint"
    retryable: ClassVar[bool] = True


class RateLimited(EndpointError):
    """429 Too Many Requests, every try."""


class Timeout(EndpointError):
    """No answer within the timeout, every try."""


class ServerError(EndpointError):
    """5xx, every try."""


class Unreachable(EndpointError):
    """The server could not be reached (refused, reset, DNS), every try."""


class BadResponse(EndpointError):
    """An answer that is not the API's JSON (no text, no usage of the right shape)."""


class OverReported(BadResponse):
    """An answer reporting more tokens than its request can use: more prompt tokens than
    :meth:`GenerationRequest.most_prompt_tokens` or more completion tokens than were asked
    for. A token budget held the request's worst case and is charged that (the request was
    served), never the count reported; the output is not kept, since its usage would say what
    no budget was charged (the review read 25,219 prompt tokens on a sample charged 2,923).
    Not retried: a server that counts so counts so again."""

    retryable = False


class TooLarge(BadResponse):
    """An answer longer than a worker reads: more than an output may take
    (``EVALQ_MAX_OUTPUT_BYTES``) and the answer's envelope. Read no further than that, never
    stored; not retried (the attack review's server answered 4 MB a request, every time)."""

    retryable = False


class Refused(EndpointError):
    """A 4xx other than 429: the request or the key is wrong; not retried."""

    retryable = False
