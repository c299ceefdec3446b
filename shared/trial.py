"""Trying an evaluation in this process on a handful of rows, for plugin authors: ``evalq.run``.

No Redis, no worker, no queue: the evaluation is loaded here, given the rows without any
registered label field, and scored, with the rules a worker applies, written once and shared
with it: labels scrubbed from every row before ``infer()`` (the evaluation's own label fields
and every other registered evaluation's), an ``infer()`` that raises on a batch tried row by
row, outputs that must be JSON, ``score()``'s answers checked against the declared metric ranges
(:func:`evalq.shared.evaluation.checked_scores`), failed samples counted by the evaluation's
failure policy, and the run concluded as a finalizer concludes it (aggregate, error bars).

A Python evaluation only: a registered language task runs on a model the fleet provides
(``evalq submit --model``); a ``model_graded`` evaluation needs its grader endpoint.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from evalq.shared.errors import PermanentError
from evalq.shared.evaluation import (
    Evaluation,
    checked_outputs,
    checked_scores,
    create,
    every_label_field,
    scrub,
)
from evalq.shared.failures import metric_samples
from evalq.shared.kinds import runner_of
from evalq.shared.models import (
    ErrorRecord,
    Metered,
    RunStatus,
    Stage,
    error_record,
    from_json,
    to_json,
)
from evalq.shared.stats import Stat
from evalq.shared.store.aggregate import conclude

__all__ = ["Trial", "run"]

TRIAL = "trial"
"""The run id a trial's samples are told (:meth:`evalq.shared.kinds.Runner.infer_samples`)."""


@dataclass(frozen=True)
class Trial:
    """What a run of the evaluation on those rows would have come to."""

    status: RunStatus
    """Completed, or failed when no sample could be scored (or ``aggregate()`` raised)."""
    aggregate: dict[str, float]
    stats: dict[str, Stat]
    """Each metric's mean, standard error and 95% interval, as ``status --json`` shows them."""
    outputs: dict[int, Any]
    """Row index -> ``infer()``'s output (as stored: through JSON)."""
    scores: dict[int, dict[str, float]]
    errors: dict[int, ErrorRecord]
    """Row index -> why the sample failed (``stage/Kind: message``)."""
    reason: str | None


def run(
    evaluation: str | Evaluation,
    rows: Sequence[Mapping[str, Any]],
    *,
    params: Mapping[str, str] | None = None,
    device: str = "cpu",
) -> Trial:
    """Run ``evaluation`` (a registered name with ``params``, or an instance) on ``rows`` (full
    rows, labels included) in this process, as the fleet would."""
    made = create(evaluation, params) if isinstance(evaluation, str) else evaluation
    full = [dict(row) for row in rows]
    hidden = every_label_field() | set(made.label_fields)
    free = [scrub(row, hidden) for row in full]
    model = made.load(device)
    errors: dict[int, ErrorRecord] = {}
    outputs = _inferred(made, model, free, list(range(len(full))), errors)
    scores: dict[int, dict[str, float]] = {}
    for i, output in sorted(outputs.items()):
        try:
            scores[i] = checked_scores(made.score(full[i], output), made.metric_ranges)
        except Exception as exc:
            errors[i] = error_record(Stage.SCORE, exc)
    counted = metric_samples(
        scores, {i: e.stage_kind for i, e in errors.items()}, made.failure_rule()
    )
    rows_by_id = dict(enumerate(full))

    def clusters(ids: list[int]) -> Mapping[int, str] | None:
        return made.clusters({i: rows_by_id[i] for i in ids})

    finished, _, stats = conclude(TRIAL, counted, made, clusters)
    described = {k: Stat.model_validate(v) for k, v in (from_json(stats) if stats else {}).items()}
    return Trial(
        status=finished.status,
        aggregate=dict(finished.aggregate),
        stats=described,
        outputs=outputs,
        scores=scores,
        errors=errors,
        reason=finished.reason,
    )


def _inferred(
    made: Evaluation,
    model: Any,
    rows: list[dict[str, Any]],
    ids: list[int],
    errors: dict[int, ErrorRecord],
) -> dict[int, Any]:
    """Each row's output through JSON, as a worker stores it; a batch that raises is tried row
    by row, and a row that raises alone (or gives what is not JSON) fails at ``infer``."""
    try:
        samples = [(TRIAL, i) for i in ids]
        given = runner_of(made).infer_samples(model, [rows[i] for i in ids], samples)
        given = checked_outputs(given, len(ids))
    except Exception as exc:
        if len(ids) == 1:
            errors[ids[0]] = error_record(Stage.INFER, exc)
            return {}
        found: dict[int, Any] = {}
        for i in ids:
            found |= _inferred(made, model, rows, [i], errors)
        return found
    outputs: dict[int, Any] = {}
    for i, output in zip(ids, given, strict=True):
        stored = output.output if isinstance(output, Metered) else output  # usage kept apart
        try:
            outputs[i] = from_json(to_json(stored))
        except (TypeError, ValueError) as exc:
            errors[i] = error_record(Stage.INFER, PermanentError(f"output not JSON: {exc}"))
    return outputs
