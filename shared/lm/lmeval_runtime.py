"""A run of an lm-evaluation-harness task, each step by lm-eval's own code: the task rebuilt
from its pinned files on the evaluated and few-shot splits of an evalq dataset
(:func:`build_task`), its requests built as lm-eval builds them in one process
(:func:`build_requests`), answered by lm-eval's ``HFLM`` around a warm model (:func:`answer`),
and each document scored and the run aggregated by the task's filters, ``process_results`` and
aggregation functions (:class:`Scoring`). lm-eval is imported by these functions, never with
the module.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from evalq.shared.errors import InputError, first_line
from evalq.shared.lm.harness import HarnessRequest, HarnessRun, metric_name
from evalq.shared.lm.lmeval import config_of, configurable, lm_eval_package, plain

if TYPE_CHECKING:
    from datasets import Dataset

__all__ = ["FEWSHOT_SEED", "Scoring", "answer", "build_requests", "build_task", "harness_lm"]

STDERR_BOOTSTRAP = 100_000
"""lm-eval's default ``bootstrap_iters``: metrics with a closed-form standard error (``mean``)
use that, the bootstrapped ones this many draws."""
FEWSHOT_SEED = 1234
"""lm-eval's default ``fewshot_random_seed``."""


def build_task(run: HarnessRun, rows: Dataset, fewshot_rows: Dataset | None) -> Any:
    """The task ``run`` records, as lm-eval builds it, over ``rows`` (the evaluated split,
    its ``test_split``) and ``fewshot_rows`` (its few-shot split, under the same name), with
    the run's few-shot count and lm-eval's few-shot seed."""
    config = config_of(run.harness)
    config["test_split"] = run.split
    docs: dict[str, Dataset] = {run.split: rows}
    if run.num_fewshot == 0 or fewshot_rows is None or run.fewshot_split is None:
        config |= {"training_split": None, "validation_split": None, "fewshot_split": None}
        fewshot = config.get("fewshot_config")
        if isinstance(fewshot, dict) and fewshot.get("split"):
            config["fewshot_config"] = {**fewshot, "split": None}
    else:  # the admitted split by name: lm-eval's own fallback would read the evaluated one
        docs[run.fewshot_split] = fewshot_rows
        config["fewshot_split"] = run.fewshot_split
        fewshot = config.get("fewshot_config")
        if isinstance(fewshot, dict):
            config["fewshot_config"] = {**fewshot, "split": run.fewshot_split}
    task = configurable(config, docs)
    task.set_config(key="num_fewshot", value=run.num_fewshot)
    task.set_fewshot_seed(seed=FEWSHOT_SEED)
    return task


def build_requests(task: Any, sample_ids: Sequence[int]) -> dict[int, list[HarnessRequest]]:
    """Every document's requests as lm-eval builds them (``build_all_requests`` in one
    process: rank 0 of 1, its few-shot sampler drawing in document order), by sample id."""
    ordered = sorted(sample_ids)
    every = ordered == list(range(len(ordered)))
    try:
        task.build_all_requests(
            limit=len(ordered) if every else None,
            samples=None if every else set(ordered),  # lm-eval asks `i in samples` per row
            rank=0,
            world_size=1,
        )
    except Exception as exc:  # lm-eval's code on the caller's documents: a Jinja field the
        # rows lack, more few-shot examples than the split has, ...
        raise InputError(f"lm-eval could not build the task's requests: {first_line(exc)}") from exc
    built: dict[int, list[HarnessRequest]] = {}
    for instance in task.instances:
        sample_id = ordered[instance.doc_id]
        built.setdefault(sample_id, []).append(
            HarnessRequest(
                request_type=instance.request_type,
                arguments=plain(list(instance.args)),
                idx=instance.idx,
                repeats=instance.repeats or 1,
            )
        )
    for requests in built.values():
        requests.sort(key=lambda r: r.idx)
    return built


def harness_lm(model: Any, tokenizer: Any, batch_size: int, max_length: int | None) -> Any:
    """lm-eval's ``HFLM`` around an already loaded transformers model and tokenizer, so
    log-likelihoods and generations are computed by lm-eval's code."""
    lm_eval_package()
    from lm_eval.models.huggingface import HFLM

    return HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, max_length=max_length)


def _argument(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def answer(
    lm: Any, documents: Sequence[Sequence[HarnessRequest]]
) -> list[list[list[Any]] | Exception]:
    """Each document's requests answered by ``lm`` (lm-eval's model API: every request of one
    type in one call, ``repeats`` times each, as lm-eval's evaluator calls it): per document,
    per request, its responses; or, for a document a request of which ``lm`` answered with an
    error (an endpoint's retries ran out), that error."""
    from lm_eval.api.instance import Instance

    by_type: dict[str, list[tuple[int, int, Any]]] = {}
    for d, requests in enumerate(documents):
        for r, request in enumerate(requests):
            instance = Instance(
                request_type=request.request_type,
                doc={},
                arguments=tuple(_argument(a) for a in request.arguments),
                idx=request.idx,
                metadata=(None, d, request.repeats),
            )
            for _ in range(request.repeats):
                by_type.setdefault(request.request_type, []).append((d, r, instance))
    answers: list[list[list[Any]]] = [[[] for _ in requests] for requests in documents]
    failed: dict[int, Exception] = {}
    for request_type, entries in by_type.items():
        responses = getattr(lm, request_type)([instance for _, _, instance in entries])
        for (d, r, _), response in zip(entries, responses, strict=True):
            if isinstance(response, Exception):
                failed.setdefault(d, response)
            else:
                answers[d][r].append(plain(response))
    return [failed.get(d, got) for d, got in enumerate(answers)]


class Scoring:
    """A task's scoring side, as lm-eval scores: per document its filters and
    ``process_results`` (on the document ``process_docs`` made), per run its aggregation
    functions and standard errors (``lm_eval.api.metrics``)."""

    def __init__(self, run: HarnessRun, first_row: Mapping[str, Any] | None) -> None:
        """Built on ``first_row`` (the task is built on a document, as lm-eval builds it);
        without one, for aggregation only (its filters and aggregation functions)."""
        from datasets import Dataset

        self.run = run
        if first_row is None:
            self.task = configurable(config_of(run.harness))
        else:
            self.task = build_task(run, Dataset.from_list([dict(first_row)]), None)

    def document(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """``row`` as the task's documents are (its ``process_docs`` applied)."""
        from datasets import Dataset

        process = self.task.config.process_docs
        if process is None:
            return dict(row)
        done = process(Dataset.from_list([dict(row)]))
        if len(done) != 1:
            raise InputError("the task's process_docs does not keep one document per row")
        return dict(done[0])

    def score(
        self, row: Mapping[str, Any], requests: Sequence[HarnessRequest], responses: list[Any]
    ) -> tuple[dict[str, float], dict[str, Any]]:
        """The document's metrics (evalq's names) and what lm-eval's ``--log_samples`` logs
        for it: its arguments, responses, filtered responses per filter, and target."""
        from lm_eval.api.instance import Instance

        doc = self.document(row)
        instances = [
            Instance(
                request_type=request.request_type,
                doc=doc,
                arguments=tuple(_argument(a) for a in request.arguments),
                idx=request.idx,
                metadata=(self.run.harness.lm_eval, 0, request.repeats),
                resps=[_argument(r) if isinstance(r, list) else r for r in got],
            )
            for request, got in zip(requests, responses, strict=True)
        ]
        metrics: dict[str, float] = {}
        filtered: dict[str, list[Any]] = {}
        for ensemble in self.task._filters:
            ensemble.apply(instances)
            kept = [instance.filtered_resps[ensemble.name] for instance in instances]
            filtered[ensemble.name] = plain(kept)
            for metric, value in self.task.process_results(doc, kept).items():
                metrics |= _numbers(metric, ensemble.name, value)
        logged = {
            "arguments": [list(i.args) for i in instances],
            "resps": [i.resps for i in instances],
            "filtered_resps": filtered,
            "target": plain(self.task.doc_to_target(doc)),
        }
        return metrics, plain(logged)

    def _functions(self) -> Iterator[tuple[str, Callable[[list[float]], float]]]:
        aggregation = self.task.aggregation()
        for ensemble in self.task._filters:
            for metric, function in aggregation.items():
                yield metric_name(metric, ensemble.name), function

    def aggregate(self, scores: Sequence[Mapping[str, float]]) -> dict[str, float]:
        """Each metric by the task's aggregation function (``mean``, ``weighted_perplexity``,
        ...), over each document's value or tuple (:func:`items`)."""
        found: dict[str, float] = {}
        for name, function in self._functions():
            values = items(scores, name)
            if values:
                found[name] = float(function(values))
        return found

    def stderrs(self, scores: Sequence[Mapping[str, float]]) -> dict[str, float | None]:
        """Each metric's standard error as lm-eval computes it (``stderr_for_metric``)."""
        from lm_eval.api.metrics import stderr_for_metric

        found: dict[str, float | None] = {}
        for name, function in self._functions():
            values = items(scores, name)
            stderr = stderr_for_metric(function, STDERR_BOOTSTRAP)
            value = stderr(values) if stderr is not None and len(values) > 1 else None
            found[name] = None if value is None or not math.isfinite(value) else float(value)
        return found


def part_name(name: str, index: int) -> str:
    """The score a tuple's ``index``-th number is stored under: ``word_perplexity[0]``,
    ``f1[1],strict-match``."""
    metric, comma, filter_name = name.partition(",")
    return f"{metric}[{index}]{comma}{filter_name}"


def _numbers(metric: str, filter_name: str, value: Any) -> dict[str, float]:
    """A document's value of ``metric`` as the floats evalq stores: a number under the
    metric's name; a tuple of numbers (a corpus-level metric's: perplexity's ``(loglikelihood,
    words)``, f1's ``(gold, prediction)``) one number a score (:func:`part_name`), for
    :func:`items` to put together again; anything else (bleu's texts) refused."""
    name = metric_name(metric, filter_name)
    if isinstance(value, bool | int | float):
        return {name: float(value)}
    if (
        isinstance(value, tuple | list)
        and value
        and all(isinstance(v, bool | int | float) for v in value)
    ):
        return {part_name(name, i): float(v) for i, v in enumerate(value)}
    raise InputError(
        f"metric '{metric}' gives {type(value).__name__} values per document that are not "
        "numbers: corpus-level metrics over texts are not supported yet"
    )


def items(scores: Sequence[Mapping[str, float]], name: str) -> list[Any]:
    """Each document's value of metric ``name``, as lm-eval's aggregation function takes it:
    the number, or the tuple :func:`_numbers` stored a number a score."""
    found: list[Any] = []
    for score in scores:
        if name in score:
            found.append(score[name])
            continue
        parts: list[float] = []
        while (part := part_name(name, len(parts))) in score:
            parts.append(score[part])
        if parts:
            found.append(tuple(parts))
    return found
