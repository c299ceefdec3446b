"""Pydantic models for everything that crosses a process boundary: task payloads, run records,
error records, exported results and provenance. Payloads travel as JSON and carry ids only, never
rows.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from evalq.shared.choices import Priority, RunStatus
from evalq.shared.errors import first_line
from evalq.shared.jsontext import from_json, to_json
from evalq.shared.source import stale_note

__all__ = [
    "MAX_MESSAGE_SAMPLES",
    "ErrorRecord",
    "Grade",
    "Metered",
    "Priority",
    "Progress",
    "RunFilter",
    "RunMeta",
    "RunProvenance",
    "RunStatus",
    "SampleResult",
    "SampleState",
    "SampleTask",
    "Stage",
    "Usage",
    "WorkerProvenance",
    "error_record",
    "from_json",
    "scores_values",
    "shown_model",
    "to_json",
    "with_usage",
]

JSONValue = Any


class Stage(StrEnum):
    """The step of the pipeline where a sample's error happened."""

    PAYLOAD = "payload"
    DATA = "data"
    INFER = "infer"
    ENDPOINT = "endpoint"
    """An endpoint model's server (:mod:`evalq.shared.lm.endpoint`), after its retries."""
    BUDGET = "budget"
    """A token budget kept the sample's request from being sent
    (:class:`evalq.shared.errors.TokensExhausted`): unsent, not failed."""
    SCORE = "score"


MAX_MESSAGE_SAMPLES = 2048
"""Most sample ids one message may carry (a fast model's, :mod:`evalq.shared.queue.pace`): at
the largest ids, its body stays within the worker's limit (``evalq.worker.intake``)."""
MAX_SAMPLE_ID = 2**53
"""Sample ids are row indices; this bound keeps them exact in Lua's doubles."""


class SampleTask(BaseModel):
    """The body of one ``evalq.infer`` or ``evalq.score`` message: ids, never row data.

    A message carries a few samples of one run; each sample is still its own unit of work,
    result and error.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    run_id: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    """The run this sample belongs to."""
    eval: str = Field(min_length=1, max_length=128)
    """Registered name of the evaluation."""
    spec: str = Field(min_length=64, max_length=64, pattern=r"^[0-9a-f]{64}$")
    """Fingerprint of the published dataset spec the sample is read from."""
    sample_ids: list[Annotated[int, Field(ge=0, lt=MAX_SAMPLE_ID)]] = Field(
        min_length=1, max_length=MAX_MESSAGE_SAMPLES
    )
    """Row indices of the samples inside the spec's split."""
    solo: bool = False
    """The sample travels alone, to be run in a batch of its own: it was tried before and
    may be one that kills its worker process."""
    _delivery: str | None = PrivateAttr(default=None)

    def delivered_as(self, key: str) -> SampleTask:
        """This payload, named by ``key`` (its message's task id: the same on each delivery of
        the message, never part of its body); returns itself."""
        self._delivery = key
        return self

    @property
    def delivery(self) -> str:
        """What names this message across its deliveries: its task id, or (a payload not read
        from a message) a digest of its ids."""
        if self._delivery is not None:
            return self._delivery
        return hashlib.blake2b(repr(self.sample_ids).encode(), digest_size=8).hexdigest()

    @classmethod
    def parse(cls, kwargs: object) -> SampleTask:
        """A payload from a message's decoded kwargs, strictly: ids are ints (not ``"3"``,
        ``True`` or ``3.0``), nothing is coerced, no other field is allowed."""
        return cls.model_validate(kwargs, strict=True)


class RunMeta(BaseModel):
    """A run's record in ``evalq:{run}:meta``."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    """Unique id, also the hash tag of the run's keys."""
    eval: str
    """Registered name of the evaluation."""
    params: dict[str, str] = Field(default_factory=dict)
    """Evaluation parameters given with ``--param k=v``."""
    model: str | None = None
    """The language model a registered task runs on (``--model``: ``hf/<path or id>[@rev]``,
    canonical), None for a Python evaluation, which owns its model."""
    task: str | None = None
    """A language task's run as JSON (:class:`evalq.shared.lm.run.LanguageRun`: the task as
    registered at submission, the model spec and the few-shot examples); None for a Python
    evaluation."""
    spec: str
    """Fingerprint of the dataset spec."""
    dataset_id: str
    """The registered dataset's name (tiers and budgets are its), or the unregistered source
    an admin evaluated."""
    registered: bool = True
    """``dataset_id`` names a registered dataset; an unregistered source reads as
    ``no_access`` to anyone but an admin."""
    split: str
    """Split evaluated."""
    n: int
    """Number of samples in the run."""
    status: RunStatus
    """Current status."""
    principal: str = ""
    """Who submitted it."""
    admin: bool = False
    """Submitted with --admin: tier and budget were bypassed."""
    charged: bool = False
    """Its run and samples were charged to the split's budget."""
    priority: Priority = Priority.NORMAL
    """Its weight in the fair dispatcher (:mod:`evalq.shared.queue.backlog`)."""
    sweep: str | None = None
    """The id shared by the runs of one ``submit --sweep`` grid."""
    tags: tuple[str, ...] = ()
    """Labels given with ``submit --tag`` (for ``runs --tag``)."""
    rescored_from: str | None = None
    """The run whose stored outputs this run scores (``evalq rescore``): no inference."""
    created: float
    """Unix time of submission."""
    finished: float | None = None
    """Unix time the run reached a terminal status."""
    reason: str | None = None
    """Why the run as a whole failed (e.g. its ``aggregate()`` raised), when it did."""
    archived: float | None = None
    """Unix time its per-sample results moved to the archive (:mod:`evalq.shared.store.archive`)."""

    @property
    def model_shown(self) -> str | None:
        """The model as pages print it: a local folder's absolute path after its provider and
        a colon (``hf:/models/x``), not the canonical ``hf//models/x``."""
        return None if self.model is None else shown_model(self.model)

    @property
    def settings_shown(self) -> str:
        """What the run ran with, as listings show it: its model first (a language task's),
        then its parameters, ``k=v`` each."""
        shown = [f"model={self.model}"] if self.model is not None else []
        return " ".join([*shown, *(f"{k}={v}" for k, v in sorted(self.params.items()))])

    ended_seen: bool = Field(default=False, exclude=True)
    """A producer read the run ended and wrote so in its facts, where no worker can undo it:
    nothing is refunded after that, whatever its state (which workers write) says later."""


def shown_model(model: str) -> str:
    """A canonical model spec as pages print it: ``hf//models/x`` (a folder's absolute path
    after ``hf/``) as ``hf:/models/x``; anything else as it is."""
    provider, sep, rest = model.partition("/")
    return f"{provider}:{rest}" if sep and rest.startswith("/") else model


class RunFilter(BaseModel):
    """Which runs ``runs`` lists: every condition given must hold (a plain model, here and not in
    the run store, so that a client of the gateway filters without importing redis)."""

    model_config = ConfigDict(frozen=True)

    eval: str | None = None
    dataset: str | None = None
    sweep: str | None = None
    tag: str | None = None
    status: RunStatus | None = None
    model: str | None = None
    """The model spec a language task's run names (as canonical, e.g. ``hf/org/name``)."""
    split: str | None = None
    principal: str | None = None
    """Who submitted it (a user lists only its own runs whatever this says)."""

    def matches(self, meta: RunMeta) -> bool:
        """Whether ``meta`` passes every condition given."""
        return (
            (self.eval is None or meta.eval == self.eval)
            and (self.dataset is None or meta.dataset_id == self.dataset)
            and (self.sweep is None or meta.sweep == self.sweep)
            and (self.tag is None or self.tag in meta.tags)
            and (self.status is None or meta.status is self.status)
            and (self.model is None or meta.model == self.model)
            and (self.split is None or meta.split == self.split)
            and (self.principal is None or meta.principal == self.principal)
        )


class Progress(BaseModel):
    """Counters of a run, bumped only when a per-sample write actually happened."""

    inferred: int = 0
    """Samples with an output."""
    scored: int = 0
    """Samples with a score."""
    failed: int = 0
    """Samples with a terminal error."""
    recovered: int = 0
    """Samples the janitor sent again because their messages were lost."""
    prompt_tokens: int = 0
    """A language model's tokens read, over the outputs stored (each counted once)."""
    completion_tokens: int = 0
    """A language model's tokens generated, over the outputs stored."""
    cached: int = 0
    """Outputs an endpoint's response cache answered (their tokens are not counted above:
    nothing was requested)."""
    grader_prompt_tokens: int = 0
    """A grader model's tokens read, over the scores stored (a ``model_graded`` task)."""
    grader_completion_tokens: int = 0
    """A grader model's tokens generated, over the scores stored."""
    touched: float | None = Field(default=None, exclude=True)
    """Unix time (Redis clock) of the run's last stored output or settled sample."""

    @property
    def done(self) -> int:
        """Samples that reached a terminal state."""
        return self.scored + self.failed


class ErrorRecord(BaseModel):
    """The terminal error of one sample."""

    stage: Stage
    """Where it failed."""
    kind: str
    """Exception class name."""
    message: str
    """One line for a person."""

    @property
    def stage_kind(self) -> str:
        """Its stage and exception class, e.g. ``infer/RuntimeError``: how failures count."""
        return f"{self.stage.value}/{self.kind}"


def error_record(stage: Stage, exc: BaseException) -> ErrorRecord:
    """A sample's terminal error record at ``stage`` (or the stage the error names: an
    endpoint's), from what was raised."""
    named = getattr(exc, "stage", None)
    where = Stage(named) if named in set(Stage) else stage
    return ErrorRecord(stage=where, kind=type(exc).__name__, message=first_line(exc))


class SampleState(StrEnum):
    """Where one sample is: waiting, or settled with a score or a terminal error."""

    PENDING = "pending"
    SCORED = "scored"
    FAILED = "failed"


class Usage(BaseModel):
    """The tokens a language model read and wrote for one sample."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prompt_tokens: int = Field(ge=0)
    completion_tokens: int = Field(ge=0)
    cached: bool = False
    """Answered from the response cache (``submit --cache``): no request made, nothing
    charged; the counts are those of the request that was."""

    def stored(self) -> str:
        """The JSON text a sample's usage is stored as, apart from its output (its own field
        and Parquet column, :mod:`evalq.shared.store`): the counts, ``cached`` only when true."""
        return to_json(self.model_dump(exclude_defaults=True))


@dataclass(frozen=True)
class Metered:
    """An output with the tokens it took, as a language evaluation's ``infer()`` answers it:
    the worker stores ``output`` and ``usage`` apart (a plain output, whatever its shape, is
    never read as usage)."""

    output: Any
    usage: Usage


def with_usage(output: Any, usage: Usage) -> Metered:
    """An output with the tokens it took (see :class:`Metered`)."""
    return Metered(output, usage)


class Grade(BaseModel):
    """What a grader model said of one sample's output (a ``model_graded`` task), stored beside
    its scores: the grader, what it read (the row's prompt, the output and the target), its
    answer, and its tokens (apart from the model under test's)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    grader: str
    """The grader's model spec, e.g. ``openai/judge``."""
    prompt: str
    verdict: str
    """The grader's answer, whose last ``GRADE: C`` or ``GRADE: I`` is the verdict."""
    usage: Usage

    def stored(self) -> str:
        """The JSON text a sample's grade is stored as, apart from its scores (its own field
        and Parquet column)."""
        return to_json(self.model_dump())


def scores_values(texts: Sequence[str]) -> list[dict[str, float]]:
    """The metrics of stored scores' JSON ``texts``, parsed as one JSON array: one call of the
    JSON parser for all of them, not one each (a stored text is one JSON value, as
    :func:`to_json` wrote it; a text that is not makes the count differ, and that raises)."""
    if not texts:
        return []
    joined = ",".join(texts)
    values = from_json(f"[{joined}]")
    if len(values) != len(texts):
        raise ValueError(f"{len(texts)} stored scores read as {len(values)} values")
    return list(values)


class SampleResult(BaseModel):
    """One sample's row in an export."""

    sample_id: int
    """Row index in the split."""
    output: JSONValue = None
    """What ``infer()`` returned, if it ran (a language model's generated text, cut at its
    first stop sequence)."""
    usage: Usage | None = None
    """A language model's tokens for this sample."""
    scores: dict[str, float] | None = None
    """What ``score()`` returned, if it ran."""
    grade: Grade | None = None
    """What the grader model said (a ``model_graded`` task)."""
    error: ErrorRecord | None = None
    """The terminal error, if the sample failed."""
    input: dict[str, JSONValue] | None = None
    """The sample's row, labels included (``results --with-input``: readers with per-sample
    access only)."""
    target: JSONValue = None
    """A page's sample read with its row (``with_input``): the row's target (a language task's
    target field; a Python evaluation's one label field, or its label fields' values)."""
    prompt: str | list[dict[str, str]] | None = None
    """A page's language-task sample read with its row (``with_input``): the prompt with its
    few-shot examples as the model read it (a ``chat`` task on an ``hf/`` model: the text its
    tokenizer's chat template made), or the messages an endpoint ``chat`` task sent
    (:meth:`evalq.shared.lm.run.LanguageRun.shown_prompt`)."""
    logged: dict[str, JSONValue] | None = None
    """A page's lm-eval sample read with its row (``with_input``): what lm-eval's
    ``--log_samples`` logs beside the output's arguments and responses: its filtered
    responses (by filter) and its target, as the task's code gives them."""

    @property
    def state(self) -> SampleState:
        """Scored, failed or still pending."""
        if self.scores is not None:
            return SampleState.SCORED
        return SampleState.PENDING if self.error is None else SampleState.FAILED


class WorkerProvenance(BaseModel):
    """What one worker ran a run's inference with."""

    model_config = ConfigDict(frozen=True)

    host: str
    device: str
    python: str
    packages: dict[str, str]
    """Package -> version (``not installed`` when absent)."""
    evaluation: str
    """The evaluation: its class's module and name, or `task NAME` for a registered task."""
    source_sha256: str
    """sha256 of the evaluation's source file as the worker loaded it: the code it ran
    (``unknown`` when it has none); for a registered language task, its spec's digest."""
    source_now: str | None = None
    """sha256 of that file on disk when the worker recorded this, when it differs: the worker
    ran code older than the file (it was edited after the worker started)."""
    weights: str | None = None
    """A language model's weights as this worker loaded them: ``sha256:<hex>`` of a local
    folder's weight, config and tokenizer files, or ``git:<commit>`` of a Hub model."""

    @property
    def code(self) -> str:
        """``code ad84e7a0c470``, and `` (stale: file now 14befa780383)`` when stale."""
        return stale_note(self.source_sha256, self.source_now)


class RunProvenance(BaseModel):
    """A run's provenance, as ``status --json`` carries it."""

    spec: str
    """The dataset spec fingerprint (which rows the sample ids are)."""
    workers: list[WorkerProvenance]
