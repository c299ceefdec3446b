"""lm-evaluation-harness tasks on a language model: the ``lm-eval`` task kind.

A run's record carries the task as registered and the model (:class:`HarnessRun`); its
documents' requests were built once at submission, as lm-eval builds them, and stored with the
run (:mod:`evalq.shared.store.requests`). A worker's ``infer`` reads a batch's requests by run
and sample id and answers them with lm-eval's ``HFLM`` around its warm model, or, on an endpoint
model, lm-eval's model API answered through evalq's client
(:class:`evalq.shared.lm.lmeval_endpoint.EndpointLM`): it never reads a document (the rows it is
handed, label-free, go unused). ``score`` gets the full row and runs
the task's filters and ``process_results`` on it; the run's aggregate and standard errors are
lm-eval's (:class:`evalq.shared.lm.lmeval.Scoring`). Each output is what lm-eval's
``--log_samples`` logs of a document's inference: its requests' arguments and responses.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from evalq.shared.errors import PermanentError
from evalq.shared.evaluation import Evaluation
from evalq.shared.kinds import Graded, Runner, TaskKind, register_kind
from evalq.shared.lm.harness import HarnessRequest, HarnessRun, is_harness_run
from evalq.shared.lm.lmeval_runtime import Scoring, answer, harness_lm, items
from evalq.shared.lm.providers import load_model
from evalq.shared.lm.spec import identity
from evalq.shared.models import RunMeta
from evalq.shared.services import Services
from evalq.shared.stats import Z95, Interval, Stat
from evalq.shared.store.requests import RequestStore

__all__ = ["HarnessKind", "HarnessTask", "WarmHarness", "harness_run"]


@dataclass(frozen=True)
class WarmHarness:
    """A worker's warm model for lm-eval tasks: the loaded model and lm-eval's ``HFLM``
    around it (made once, kept with the model); for an endpoint model, its tokenizer (None:
    the run names none), lm-eval's model API made per run (its requests are the run's)."""

    model: Any
    lm: Any = None
    tokenizer: Any = None

    def lm_for(self, run_id: str) -> Any:
        """lm-eval's model API for run ``run_id``'s requests."""
        if self.lm is not None:
            return self.lm
        from evalq.shared.lm.lmeval_endpoint import EndpointLM

        return EndpointLM(self.model, self.tokenizer, run_id)


class HarnessTask(Evaluation, Runner):
    """A registered lm-eval task on a model, as run ``run`` records it; ``services``: the
    worker's (its Redis holds the run's requests; None: it is only described)."""

    isolatable = False

    def __init__(
        self,
        name: str,
        run: HarnessRun,
        params: Mapping[str, str] | None = None,
        services: Services | None = None,
    ) -> None:
        self.name = name
        self.run = run
        self.services = services
        self.label_fields = run.harness.labels
        self.output_kind = f"lm-eval-{run.harness.output_type}"
        self._scoring: Scoring | None = None
        self._aggregating: Scoring | None = None
        super().__init__(**dict(params or {}))

    def model_key(self) -> str:
        return self.run.model_key()

    def weights(self) -> str:
        return identity(self.run.model)

    def definition(self) -> str:
        return self.run.harness.digest

    def described(self) -> str:
        return f"lm-eval task {self.name} ({self.run.harness.lm_eval})"

    def load(self, device: str) -> WarmHarness:
        """The model by its provider, and lm-eval's ``HFLM`` around it (``hf/`` models) or an
        endpoint model's tokenizer."""
        spec = self.run.model
        loaded = load_model(spec, device, self.services, self.run.cache)
        if spec.endpoint is not None:
            from evalq.shared.lm.lmeval_endpoint import load_tokenizer

            path = spec.args.tokenizer
            return WarmHarness(loaded, tokenizer=load_tokenizer(path) if path else None)
        hf_model, tokenizer = getattr(loaded, "model", None), getattr(loaded, "tokenizer", None)
        if hf_model is None or tokenizer is None:
            raise PermanentError(f"lm-eval tasks run on transformers models, not {spec.provider}/")
        limit = getattr(loaded, "max_length", None)
        return WarmHarness(loaded, harness_lm(hf_model, tokenizer, spec.args.batch_size, limit))

    def infer(self, model: Any, rows: list[dict[str, Any]]) -> list[Any]:
        raise PermanentError("an lm-eval task's samples are answered by run and sample id")

    def infer_samples(
        self, model: Any, rows: list[dict[str, Any]], samples: list[tuple[str, int]]
    ) -> list[Any]:
        """Each sample's requests, read by its run and id, answered by lm-eval's model API
        (the rows go unused: a worker's model never sees a document)."""
        if self.services is None:
            raise PermanentError("an lm-eval task's requests are read by a worker only")
        store = RequestStore(self.services.client)
        by_run: dict[str, list[int]] = defaultdict(list)  # each run's samples' places
        for place, (run_id, _) in enumerate(samples):
            by_run[run_id].append(place)
        documents: list[list[HarnessRequest]] = [[] for _ in samples]
        for run_id, places in by_run.items():
            stored = store.get(run_id, [samples[p][1] for p in places])
            for place, requests in zip(places, stored, strict=True):
                documents[place] = requests
        # a local model answers the batch in one call; an endpoint, each run's (its meter's)
        groups = [list(range(len(samples)))] if model.lm is not None else list(by_run.values())
        answers: list[Any] = [None] * len(samples)
        for places in groups:
            lm = model.lm_for(samples[places[0]][0])
            for place, got in zip(places, answer(lm, [documents[p] for p in places]), strict=True):
                answers[place] = got
        return [
            got
            if isinstance(got, Exception)
            else {"requests": [r.model_dump(mode="json") for r in documents[p]], "resps": got}
            for p, got in enumerate(answers)
        ]

    def grade(
        self, run_id: str, rows: Mapping[int, dict[str, Any]], outputs: Mapping[int, Any]
    ) -> dict[int, Graded | Exception]:
        return {}

    def score(self, row: dict[str, Any], output: Any) -> dict[str, float]:
        """The task's filters and ``process_results`` on the full row's document."""
        if self._scoring is None:
            self._scoring = Scoring(self.run, row)
        requests = [HarnessRequest.model_validate(r) for r in output["requests"]]
        metrics, _ = self._scoring.score(row, requests, output["resps"])
        return metrics

    def _aggregator(self) -> Scoring:
        if self._aggregating is None:
            self._aggregating = Scoring(self.run, None)
        return self._aggregating

    def aggregate(self, scores: list[dict[str, float]]) -> dict[str, float]:
        """Each metric by the task's aggregation function (lm-eval's)."""
        return self._aggregator().aggregate(scores)

    def stats(self, scores: Mapping[int, Mapping[str, float]]) -> dict[str, Stat] | None:
        """lm-eval's value and standard error of each metric, with the normal 95% interval."""
        values = list(scores.values())
        scoring = self._aggregator()
        means = scoring.aggregate(values)
        found: dict[str, Stat] = {}
        for name, stderr in scoring.stderrs(values).items():
            if name not in means:
                continue
            mean, n = means[name], len(items(values, name))
            interval = None
            if stderr is not None and math.isfinite(mean):
                low, high = mean - Z95 * stderr, mean + Z95 * stderr
                interval = Interval(method="normal", low=low, high=high)
            ci = None if interval is None else (interval.low, interval.high)
            found[name] = Stat(
                mean=mean, stderr=stderr, ci95=ci, n=n, method="lm-eval", interval=interval
            )
        return found


class HarnessKind(TaskKind):
    """Runs of a registered lm-eval task on a model."""

    name = "lm-eval"

    def claims(self, meta: RunMeta) -> bool:
        return is_harness_run(meta.task)

    def evaluation(self, meta: RunMeta, services: Services | None) -> HarnessTask:
        run = harness_run(meta)
        assert run is not None  # claimed: the run records an lm-eval task
        return HarnessTask(meta.eval, run, meta.params, services)


def harness_run(meta: RunMeta) -> HarnessRun | None:
    """The lm-eval task and model run ``meta`` records; None for a run of another kind."""
    if meta.task is None or not is_harness_run(meta.task):
        return None
    return HarnessRun.model_validate_json(meta.task)


register_kind(HarnessKind())
