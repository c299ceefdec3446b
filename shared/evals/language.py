"""Registered language tasks on a language model: the evaluation a run of ``evalq submit TASK
--model hf/...`` gets.

The run's record carries everything (:class:`evalq.shared.lm.run.LanguageRun`: the task as it was
registered, the model spec, the few-shot examples), so a worker builds the evaluation from the
record alone; a Python evaluation's run is built by name, as before (:func:`evaluation_of`).
Runs of different tasks on one model share the worker's warm copy of it (:meth:`model_key`).

``infer()`` answers each output with its token usage (:func:`evalq.shared.models.with_usage`),
which the worker stores beside it; a multiple-choice output is each choice's summed
log-likelihood, in the choices' order.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from evalq.shared.connection import connect
from evalq.shared.errors import GraderError, PermanentError, first_line
from evalq.shared.evaluation import Evaluation, Graded, create
from evalq.shared.lm.endpoint import ENVELOPE_BYTES, EndpointModel
from evalq.shared.lm.limits import EndpointLimits
from evalq.shared.lm.request import GenerationRequest, Prompt
from evalq.shared.lm.run import LanguageRun
from evalq.shared.lm.spec import ModelSpec, canonical, identity
from evalq.shared.models import Grade, RunMeta, Usage, with_usage
from evalq.shared.settings import get_settings
from evalq.shared.store.rate import RateLimit
from evalq.shared.store.responses import ResponseCache
from evalq.shared.store.runs import RunStore
from evalq.shared.store.spend import RunMeter, TokenSpend

if TYPE_CHECKING:
    from evalq.shared.lm.hf import HFModel
    from evalq.shared.lm.request import Generation

__all__ = [
    "ENDPOINT_ROWS_PER_CALL",
    "LanguageEvaluation",
    "endpoint_model",
    "evaluation_of",
    "language_run",
    "sample_seed",
]


ENDPOINT_ROWS_PER_CALL = 256
"""Rows an endpoint model's ``infer()`` takes at once (a message's most): its requests go out
``concurrency`` at a time whatever the batch, and each call's last wave leaves slots idle
(``bench/endpoint.py``: 0.79 of lm-eval's rate in calls of 64 rows, 0.93-0.96 in one call)."""


_METERS = 1024
"""Runs whose token meter an endpoint model keeps (oldest dropped first)."""


def sample_seed(run_id: str, sample_id: int) -> int:
    """A sample's sampling seed, from its run and its id alone: a redelivered or resumed
    sample draws the same tokens, whichever batch and worker it lands in."""
    digest = hashlib.sha256(f"{run_id}/{sample_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


class LanguageEvaluation(Evaluation):
    """A registered task (:class:`evalq.shared.lm.task.TaskSpec`) on a model
    (:class:`evalq.shared.lm.spec.ModelSpec`); one subclass per run record (:meth:`of`)."""

    run: ClassVar[LanguageRun]
    isolatable: ClassVar[bool] = False
    _graders: EndpointModel | None = None

    @classmethod
    def of(cls, name: str, run: LanguageRun) -> type[LanguageEvaluation]:
        """The evaluation of task ``name`` as ``run`` records it."""
        scorer = run.task.scorer_spec
        kind = "choices" if run.task.choices is not None else "text"
        attributes = {
            "name": name,
            "run": run,
            "label_fields": run.task.label_fields,
            "metric_ranges": dict(scorer.metrics),
            "output_kind": f"language-{kind}",
            "rows_per_call": ENDPOINT_ROWS_PER_CALL if run.model.endpoint is not None else None,
        }
        return type(f"LanguageEvaluation[{name}]", (cls,), attributes)

    def model_key(self) -> str:
        return self.run.model_key()

    def weights(self) -> str:
        return identity(self.run.model)

    def definition(self) -> str:
        return self.run.task.digest

    def described(self) -> str:
        return f"task {self.name}"

    def load(self, device: str) -> HFModel | EndpointModel:
        if self.run.model.endpoint is not None:
            return endpoint_model(self.run.model, self.run.cache)
        from evalq.shared.lm.hf import HFModel  # torch: only where a model runs

        return HFModel.load(self.run.model, device)

    def infer(self, model: Any, rows: list[dict[str, Any]]) -> list[Any]:
        return self.infer_samples(model, rows, [("", -1)] * len(rows))

    def infer_samples(
        self, model: Any, rows: list[dict[str, Any]], samples: list[tuple[str, int]]
    ) -> list[Any]:
        prompts = [
            self.prompt(model, row, sample_id)
            for row, (_, sample_id) in zip(rows, samples, strict=True)
        ]
        if self.run.task.generate is None:
            texts = [p for p in prompts if isinstance(p, str)]
            if len(texts) != len(prompts):
                raise PermanentError("multiple-choice tasks run on hf/ models only")
            return self._choose(model, rows, texts)
        config = self.run.task.generate
        requests = [
            GenerationRequest(
                prompt, config.max_new_tokens, tuple(config.stop), config.temperature,
                config.top_p, seed=sample_seed(run_id, sample_id),
            )
            for prompt, (run_id, sample_id) in zip(prompts, samples, strict=True)
        ]  # fmt: skip
        return [
            g
            if isinstance(g, Exception)
            else with_usage(
                g.text,
                Usage(
                    prompt_tokens=g.prompt_tokens,
                    completion_tokens=g.completion_tokens,
                    cached=g.cached,
                ),
            )
            for g in self._generated(model, requests, [run_id for run_id, _ in samples])
        ]

    @staticmethod
    def _generated(
        model: HFModel | EndpointModel, requests: list[GenerationRequest], runs: list[str]
    ) -> list[Generation | Exception]:
        """The model's generations; an endpoint's each metered by its run's token budget."""
        if isinstance(model, EndpointModel):
            return list(model.generate(requests, runs))
        return list(model.generate(requests))

    def prompt(self, model: HFModel | EndpointModel, row: dict[str, Any], sample_id: int) -> Prompt:
        """The text the model reads for ``row`` (label-free) and its few-shot examples
        (:meth:`evalq.shared.lm.run.LanguageRun.prompt`, which the views show)."""
        return self.run.prompt(row, sample_id, model)

    def _choose(self, model: HFModel, rows: list[dict[str, Any]], prompts: list[str]) -> list[Any]:
        """Each row's choices' log-likelihoods after its prompt, all rows' in one call."""
        from evalq.shared.lm.request import ChoiceRequest

        per_row = [self.run.task.continuations(row) for row in rows]
        requests = [
            ChoiceRequest(prompt, continuation)
            for prompt, continuations in zip(prompts, per_row, strict=True)
            for continuation in continuations
        ]
        scores = iter(model.loglikelihood(requests))
        outputs: list[Any] = []
        for prompt, continuations in zip(prompts, per_row, strict=True):
            mine = [next(scores) for _ in continuations]
            read = len(continuations) * len(model.encode(prompt)) + sum(s.tokens for s in mine)
            usage = Usage(prompt_tokens=read, completion_tokens=0)
            outputs.append(with_usage([s.logprob for s in mine], usage))
        return outputs

    def grade(
        self, run_id: str, rows: Mapping[int, dict[str, Any]], outputs: Mapping[int, Any]
    ) -> dict[int, Graded | Exception]:
        """A ``model_graded`` task's samples graded by its grader, all at once, through the
        fleet's client: its rate limit, the run's response cache when asked for, and the run's
        token budget (the grader's tokens are counted apart from the model under test's)."""
        task, grader = self.run.task, self.run.task.grader
        if grader is None:
            return {}
        graded: dict[int, Graded | Exception] = {}
        prompts: dict[int, str] = {}
        for sample_id, row in rows.items():
            try:
                prompts[sample_id] = task.grader_text(row, outputs[sample_id])
            except Exception as exc:
                graded[sample_id] = exc
        if not prompts:
            return graded
        requests = [
            GenerationRequest((("user", text),), grader.max_new_tokens, (), seed=0)
            for text in prompts.values()
        ]
        try:  # the grader delisted, Redis gone, ...: every sample of the batch says why
            model = self._grader()
            answers = model.generate(requests, [run_id] * len(requests))
        except Exception as exc:
            failed = GraderError(f"grader {grader.model}: {first_line(exc)}")
            return graded | dict.fromkeys(prompts, failed)
        for (sample_id, text), got in zip(prompts.items(), answers, strict=True):
            if isinstance(got, Exception):
                graded[sample_id] = GraderError(f"grader {grader.model}: {first_line(got)}")
                continue
            usage = Usage(
                prompt_tokens=got.prompt_tokens, completion_tokens=got.completion_tokens,
                cached=got.cached,
            )  # fmt: skip
            verdict = Grade(grader=grader.model, prompt=text, verdict=got.text, usage=usage)
            graded[sample_id] = (task.score(got.text, rows[sample_id]), verdict)
        return graded

    def _grader(self) -> EndpointModel:
        """The grader's endpoint model in this process, made on first use."""
        grader = self.run.task.grader
        assert grader is not None
        if self._graders is None:
            spec = canonical(ModelSpec.parse(grader.model, grader.model_args))
            self._graders = endpoint_model(spec, self.run.cache)
        return self._graders

    def score(self, row: dict[str, Any], output: Any) -> dict[str, float]:
        """The task's scorer on the output (stored without its usage)."""
        return self.run.task.score(output, row)


def endpoint_model(spec: ModelSpec, cache: bool = False) -> EndpointModel:
    """The endpoint model ``spec`` names, on this worker: its server must be listed in the
    policy, with the key variable the spec names when it names one (checked again here: the
    listing may have changed since the run was submitted); the key is this process's value of
    the variable the entry names, and nothing when the entry names none or the variable is
    unset (no ``Authorization`` header; never a default variable: a key goes only where the
    operator said). The rate limit is the fleet's, in Redis, and so is the response cache when
    the run asked for it (``cache``)."""
    url = spec.endpoint
    if url is None:
        raise PermanentError(f"model {spec}: not an endpoint model")
    settings = get_settings()
    client = connect(settings.redis)
    rate = RateLimit(client, url, EndpointLimits())
    refused = rate.refresh(spec.args)
    if refused is not None:
        raise PermanentError(refused)
    variable = rate.limits.api_key_env
    key = (os.environ.get(variable) or None) if variable is not None else None
    responses = ResponseCache(client, settings.cache_ttl, settings.cache_max_bytes)
    spend, runs = TokenSpend(client), RunStore(client)
    known: dict[str, tuple[RunMeter | None, str]] = {}

    def of(run_id: str) -> tuple[RunMeter | None, str]:
        if run_id not in known:  # what a run is charged to, and whose it is, never change
            if len(known) >= _METERS:
                del known[next(iter(known))]
            meta = runs.get(run_id)
            known[run_id] = (spend.meter(meta), meta.principal)
        return known[run_id]

    return EndpointModel(
        spec, rate, key, responses if cache else None,
        meters=lambda r: of(r)[0], owners=lambda r: of(r)[1],
        max_body=settings.max_output_bytes + ENVELOPE_BYTES,
    )  # fmt: skip


def evaluation_of(meta: RunMeta) -> Evaluation:
    """The evaluation run ``meta`` names: its language task on its model, or the Python
    evaluation registered under its name, with its parameters."""
    run = language_run(meta)
    if run is None:
        return create(meta.eval, meta.params)
    return LanguageEvaluation.of(meta.eval, run)(**meta.params)


def language_run(meta: RunMeta) -> LanguageRun | None:
    """The task, model and few-shot examples run ``meta`` records; None for a Python
    evaluation's run."""
    return None if meta.task is None else LanguageRun.model_validate_json(meta.task)
