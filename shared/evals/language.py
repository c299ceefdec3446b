"""Registered language tasks on a language model: the evaluation a run of ``evalq submit TASK
--model hf/...`` gets.

The run's record carries everything (:class:`evalq.shared.lm.run.LanguageRun`: the task as it was
registered, the model spec, the few-shot examples), so a worker builds the evaluation from the
record alone (this module registers the language task kind, :mod:`evalq.shared.kinds`): one
:class:`LanguageTask` configured by the record, with the services the worker hands in. Runs of
different tasks on one model share the worker's warm copy of it (:meth:`LanguageTask.model_key`);
the model is loaded by its provider (:mod:`evalq.shared.lm.providers`).

``infer()`` answers each output with its token usage (:func:`evalq.shared.models.with_usage`),
which the worker stores beside it; a multiple-choice output is each choice's summed
log-likelihood, in the choices' order.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, cast

from evalq.shared.errors import GraderError, PermanentError, first_line
from evalq.shared.evals.endpoints import endpoint_model
from evalq.shared.evaluation import Evaluation
from evalq.shared.kinds import Graded, Runner, TaskKind, register_kind
from evalq.shared.lm.endpoint import EndpointModel
from evalq.shared.lm.harness import is_harness_run
from evalq.shared.lm.providers import ChoiceModel, LanguageModel, load_model, provider
from evalq.shared.lm.request import ChoiceRequest, Generation, GenerationRequest, Prompt
from evalq.shared.lm.run import LanguageRun
from evalq.shared.lm.spec import ModelSpec, canonical, identity
from evalq.shared.models import Grade, RunMeta, Usage, with_usage
from evalq.shared.services import Services

__all__ = [
    "ENDPOINT_ROWS_PER_CALL",
    "LanguageKind",
    "LanguageTask",
    "language_run",
    "sample_seed",
]


ENDPOINT_ROWS_PER_CALL = 256
"""Rows an endpoint model's ``infer()`` takes at once (a message's most): its requests go out
``concurrency`` at a time whatever the batch, and each call's last wave leaves slots idle
(``bench/endpoint.py``: 0.79 of lm-eval's rate in calls of 64 rows, 0.93-0.96 in one call)."""


def sample_seed(run_id: str, sample_id: int) -> int:
    """A sample's sampling seed, from its run and its id alone: a redelivered or resumed
    sample draws the same tokens, whichever batch and worker it lands in."""
    digest = hashlib.sha256(f"{run_id}/{sample_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


class LanguageTask(Evaluation, Runner):
    """A registered task (:class:`evalq.shared.lm.task.TaskSpec`) on a model
    (:class:`evalq.shared.lm.spec.ModelSpec`), as a run records it (``run``); ``services``:
    the worker's, which its model and grader are loaded with (None: it is only described)."""

    isolatable = False

    def __init__(
        self,
        name: str,
        run: LanguageRun,
        params: Mapping[str, str] | None = None,
        services: Services | None = None,
    ) -> None:
        self.name = name
        self.run = run
        self.services = services
        self._graders: EndpointModel | None = None
        kind = "choices" if run.task.choices is not None else "text"
        self.label_fields = run.task.label_fields
        self.metric_ranges = dict(run.task.scorer_spec.metrics)
        self.output_kind = f"language-{kind}"
        self.rows_per_call = ENDPOINT_ROWS_PER_CALL if run.model.endpoint is not None else None
        super().__init__(**dict(params or {}))

    def model_key(self) -> str:
        return self.run.model_key()

    def weights(self) -> str:
        return identity(self.run.model)

    def definition(self) -> str:
        return self.run.task.digest

    def described(self) -> str:
        return f"task {self.name}"

    def load(self, device: str) -> LanguageModel:
        """The model, by its provider's loader (imported here: torch only where one runs)."""
        return load_model(self.run.model, device, self.services, self.run.cache)

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
            if len(texts) != len(prompts) or not provider(self.run.model.provider).loglikelihoods:
                raise PermanentError(
                    f"multiple-choice tasks need log-likelihoods, which "
                    f"{self.run.model.provider}/ models do not read"
                )
            return self._choose(cast(ChoiceModel, model), rows, texts)
        config = self.run.task.generate
        requests = [
            GenerationRequest(
                prompt,
                config.max_new_tokens,
                tuple(config.stop),
                config.temperature,
                config.top_p,
                seed=sample_seed(run_id, sample_id),
            )
            for prompt, (run_id, sample_id) in zip(prompts, samples, strict=True)
        ]
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
        model: LanguageModel, requests: list[GenerationRequest], runs: list[str]
    ) -> list[Generation | Exception]:
        """The model's generations, each told its run (an endpoint meters it by the run's
        token budget)."""
        return list(model.generate(requests, runs))

    def prompt(self, model: LanguageModel, row: dict[str, Any], sample_id: int) -> Prompt:
        """The text the model reads for ``row`` (label-free) and its few-shot examples
        (:meth:`evalq.shared.lm.run.LanguageRun.prompt`, which the views show)."""
        return self.run.prompt(row, sample_id, model)

    def _choose(
        self, model: ChoiceModel, rows: list[dict[str, Any]], prompts: list[str]
    ) -> list[Any]:
        """Each row's choices' log-likelihoods after its prompt, all rows' in one call."""
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
                prompt_tokens=got.prompt_tokens,
                completion_tokens=got.completion_tokens,
                cached=got.cached,
            )
            verdict = Grade(grader=grader.model, prompt=text, verdict=got.text, usage=usage)
            graded[sample_id] = (task.score(got.text, rows[sample_id]), verdict)
        return graded

    def _grader(self) -> EndpointModel:
        """The grader's endpoint model in this process, made on first use."""
        grader = self.run.task.grader
        assert grader is not None
        if self._graders is None:
            if self.services is None:
                raise PermanentError(f"grader {grader.model}: graded by a worker only")
            spec = canonical(ModelSpec.parse(grader.model, grader.model_args))
            self._graders = endpoint_model(spec, self.services, self.run.cache)
        return self._graders

    def score(self, row: dict[str, Any], output: Any) -> dict[str, float]:
        """The task's scorer on the output (stored without its usage)."""
        return self.run.task.score(output, row)


class LanguageKind(TaskKind):
    """Runs of a registered task on a model: their record carries the task and the model."""

    name = "language"

    def claims(self, meta: RunMeta) -> bool:
        return meta.task is not None and not is_harness_run(meta.task)

    def evaluation(self, meta: RunMeta, services: Services | None) -> LanguageTask:
        run = language_run(meta)
        assert run is not None  # claimed: the run records a task
        return LanguageTask(meta.eval, run, meta.params, services)


def language_run(meta: RunMeta) -> LanguageRun | None:
    """The task, model and few-shot examples run ``meta`` records; None for a Python
    evaluation's run and an lm-eval task's (:mod:`evalq.shared.evals.harness`)."""
    if meta.task is None or is_harness_run(meta.task):
        return None
    return LanguageRun.model_validate_json(meta.task)


register_kind(LanguageKind())
