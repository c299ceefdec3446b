"""What a run adds up to: its aggregate and each metric's uncertainty, computed once from the
stored scores and failures when the run ends
(:meth:`evalq.shared.store.writer.ResultWriter.finalize` writes them), and its terminal errors
counted by kind.

Nothing here touches Redis: the store reads what is counted and writes what comes out.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from evalq.shared.errors import first_line
from evalq.shared.evaluation import Evaluation
from evalq.shared.failures import Counted
from evalq.shared.kinds import runner_of
from evalq.shared.models import RunStatus, to_json
from evalq.shared.stats import describe
from evalq.shared.store.wire import error_kind

__all__ = ["Clusters", "Finished", "conclude", "error_kinds"]

log = logging.getLogger(__name__)

Clusters = Callable[[list[int]], Mapping[int, str] | None]
"""Sample ids -> each one's cluster (read from the rows when the finalizer asks)."""


@dataclass(frozen=True)
class Finished:
    """How a run ended: completed with its aggregate, or failed with its reason."""

    status: RunStatus
    aggregate: dict[str, float]
    reason: str | None


def error_kinds(records: Iterable[str]) -> dict[str, int]:
    """Error records (JSON) counted by stage and exception class, e.g. ``infer/RuntimeError``,
    most common first."""
    return dict(Counter(error_kind(raw) for raw in records).most_common())


def conclude(
    run_id: str, counted: Counted, evaluation: Evaluation, clusters: Clusters | None
) -> tuple[Finished, str, str]:
    """How the run ends, from its metric samples (every stored score and failure as the
    evaluation counts them): completed with ``evaluation.aggregate()``, or failed when no
    sample could be scored or ``aggregate()`` raised; with the aggregate's JSON and the stats'
    (:func:`evalq.shared.stats.describe`, clustered by what ``clusters`` gives for the counted ids
    when the evaluation declares a cluster field; '' when there are none)."""
    finished = Finished(RunStatus.FAILED, {}, _unsent(counted) or "no sample could be scored")
    encoded, stats = to_json(finished.aggregate), ""
    if counted.scored:
        try:
            values = list(counted.scores.values())
            aggregate = {str(k): float(v) for k, v in evaluation.aggregate(values).items()}
            encoded = to_json(aggregate)  # refuses NaN: a failed aggregate like any other
            finished = Finished(RunStatus.COMPLETED, aggregate, _unsent(counted))
        except Exception as exc:
            reason = f"aggregate() failed: {type(exc).__name__}: {first_line(exc)}"
            finished = Finished(RunStatus.FAILED, {}, reason)
        else:
            stats = _stats(run_id, counted, evaluation, clusters)
    return finished, encoded, stats


def _unsent(counted: Counted) -> str | None:
    """Why a run ends with fewer samples than it asked for: a token budget ran out."""
    if not counted.unsent:
        return None
    if not counted.scores:
        return (
            f"a token budget ran out: none of its {counted.unsent} samples was sent (the run "
            "and its samples are given back)"
        )
    return (
        f"a token budget ran out: {counted.unsent} samples were not sent (their charge is "
        "given back); the numbers count the others"
    )


def _stats(run_id: str, counted: Counted, evaluation: Evaluation, clusters: Clusters | None) -> str:
    """The stats JSON, or '' (logged) when they cannot be computed (the clusters' rows
    unreadable, say): the run still completes with its aggregate."""
    custom = evaluation.aggregate if evaluation.custom_aggregate() else None
    try:
        grouped = None
        if evaluation.cluster_field is not None:
            if clusters is None:
                raise ValueError("its clusters were not given")
            grouped = clusters(sorted(counted.scores))
        own = runner_of(evaluation).stats(counted.scores)
        described = (
            own if own is not None else describe(counted.scores, custom, grouped, counted.ranges)
        )
        stats = counted.noted(described)
        return json.dumps(
            {name: stat.model_dump(mode="json") for name, stat in stats.items()},
            allow_nan=False,
        )
    except Exception as exc:
        log.warning("run %s: no error bars: %s", run_id, first_line(exc))
        return ""
