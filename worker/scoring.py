"""Scoring of a batch of messages, any mix of runs: full rows plus stored outputs through
``score()``, each score stored once; the call that settles a run's last sample computes its
aggregate from the store. An evaluation with a scorer script is scored on the runtime pool's
warm script subprocesses, a batch at a time. Any failure of one sample becomes that sample's
terminal error record; the batch goes on (see :mod:`evalq.worker.batch`).
"""

from __future__ import annotations

import logging
from typing import Any

from evalq.shared.errors import ScriptError
from evalq.shared.evaluation import checked_scores
from evalq.shared.kinds import runner_of
from evalq.shared.models import Grade, SampleTask, Stage, error_record
from evalq.shared.queue.celery_app import SCORE_TASK
from evalq.shared.scorer import ScriptCall
from evalq.worker.batch import Batch, Resources, RunShare, bounded

__all__ = ["score_all", "score_batch"]

log = logging.getLogger(__name__)


def _script_answers(
    res: Resources, run: RunShare, rows: dict[int, dict[str, Any]], outputs: dict[int, Any]
) -> dict[int, str | ScriptError]:
    """Each sample's answer from the evaluation's scorer script, run on the warm pool."""
    evaluation = run.evaluation
    assert evaluation.scorer is not None
    calls: dict[int, ScriptCall] = {}
    for sample_id, row in rows.items():
        try:
            calls[sample_id] = evaluation.script_call(row, outputs[sample_id])
        except Exception as exc:
            run.errors[sample_id] = error_record(Stage.SCORE, exc)
    answers = res.runtimes.scripts(evaluation.scorer).map(list(calls.values()))
    return dict(zip(calls, answers, strict=True))


def _score(
    res: Resources, run: RunShare, rows: dict[int, dict[str, Any]], outputs: dict[int, Any]
) -> tuple[dict[int, dict[str, float]], dict[int, Grade]]:
    """Scores (and the grades they came from, for a graded evaluation) of the samples that
    score cleanly; the others get their error record."""
    evaluation = run.evaluation
    answers = _script_answers(res, run, rows, outputs) if evaluation.scorer is not None else {}
    graded = runner_of(evaluation).grade(run.run_id, rows, outputs) if rows else {}
    scores: dict[int, dict[str, float]] = {}
    grades: dict[int, Grade] = {}
    for sample_id, row in rows.items():
        if sample_id in run.errors:
            continue
        try:
            if sample_id in graded:
                got = graded[sample_id]
                if isinstance(got, Exception):
                    raise got
                raw, grade = got
                bounded(grade.model_dump_json(), res.max_output_bytes, "a grade")
                grades[sample_id] = grade
            elif evaluation.scorer is None:
                raw = evaluation.score(row, outputs[sample_id])
            else:
                answer = answers[sample_id]
                if isinstance(answer, ScriptError):
                    raise answer
                raw = evaluation.script_score(answer)
            scores[sample_id] = checked_scores(raw, evaluation.metric_ranges)
        except Exception as exc:
            grades.pop(sample_id, None)
            run.errors[sample_id] = error_record(Stage.SCORE, exc)
    return scores, grades


def score_batch(res: Resources, tasks: list[SampleTask]) -> set[str]:
    """Score a batch of messages, any mix of runs, and finalize the runs it finishes; return
    the runs whose messages must go back to the queue.

    A message whose samples are all settled while its run is still going is how a run whose
    finalizer died gets finished: it takes over a claim older than ``stall_after`` (the
    janitor sends such a message).
    """
    return score_all(res, Batch.read(res, tasks, Stage.SCORE))


def score_all(res: Resources, batch: Batch) -> set[str]:
    """Score the runs of ``batch`` (see :func:`score_batch`): the outputs each run carries from
    its inference without reading them again, the others as stored."""

    def score(run: RunShare) -> None:
        rest = [i for i in run.ids if i not in run.known]
        settled = res.reader.settled(run.run_id, rest) if rest else set()
        unsettled = [i for i in rest if i not in settled]
        outputs = run.known | (res.reader.outputs(run.run_id, unsettled) if unsettled else {})
        if run.todo is not None:  # counted as its outputs were stored (the fused path)
            todo = run.todo
        else:
            todo = run.counted(Stage.SCORE, list(outputs)) if outputs else []
        if len(outputs) < len(run.ids) - len(settled):
            # Scoring is enqueued only after an output is stored, so this message is stray
            # (e.g. replayed by hand); the inference path will enqueue the sample again.
            missing = len(run.ids) - len(settled) - len(outputs)
            log.warning("run %s: %d score messages without an output", run.run_id, missing)
        rows = run.rows(todo, Stage.SCORE) if todo else {}
        scores, grades = _score(res, run, rows, outputs)
        if scores:
            res.record_provenance(run.run_id, run.evaluation)
            alone = not run.alone.isdisjoint(scores)
            run.settled(res.writer.record_scores(run.run_id, scores, grades, alone))
        elif (
            not run.errors
            and not run.retry
            and res.writer.claim_finalize(run.run_id, res.stall_after)
        ):
            log.warning("run %s: took over from a finalizer that died", run.run_id)
            run.finalize()
        run.settle_errors()
        run.send_retries(SCORE_TASK)

    batch.each(score)
    return batch.requeue
