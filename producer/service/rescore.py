"""``evalq rescore RUN --eval OTHER``: a new run over the same samples that scores RUN's stored
outputs with another evaluation's ``score()``, without inference.

The two evaluations must declare the same ``output_kind`` (what their outputs are); the new
run is gated, charged and released like any run on its split (a user may not rescore what it
may not submit), takes the source run's sample ids (the server chose them on a
``non_viewable`` split: nothing is chosen here), copies their outputs (``HSETNX``, counted as
inferred) and stages their scoring in the new run's score backlog, from which the fair
dispatcher hands it to the scoring workers (:mod:`evalq.shared.queue.backlog`): a small rescore
waits for no one's big one. A sample without an output (its ``infer()`` failed) is in the new run
too, failed with the source's error: it counts as a failure there as it did in the source, so a
rescore never drops the samples a candidate crashed on.

A language run is rescored by another registered task (``--eval TASK``): the new run keeps the
source's model and few-shot examples, which made the outputs, and takes the task's target and
scorer (:func:`evalq.producer.service.language.rescorer`).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Annotated

import redis
from celery import Celery
from pydantic import BaseModel, ConfigDict, Field

from evalq.producer.service.language import rescorer
from evalq.producer.service.submit import start
from evalq.shared.access.policy import admit_grader, admit_run, admit_split, run_tier
from evalq.shared.access.tiers import TierRegistry
from evalq.shared.connection import server_time
from evalq.shared.errors import InputError
from evalq.shared.kinds import evaluation_of
from evalq.shared.lm.run import LanguageRun
from evalq.shared.models import RunMeta, RunStatus
from evalq.shared.names import RUN_ID
from evalq.shared.queue.backlog import SCORE_LANE, Backlog
from evalq.shared.store.reader import ResultReader
from evalq.shared.store.runs import RunStore
from evalq.shared.store.writer import ResultWriter

__all__ = ["COPY_CHUNK", "RescoreRequest", "rescore"]

COPY_CHUNK = 5000
"""Outputs copied per round trip."""


class RescoreRequest(BaseModel):
    """What ``evalq rescore`` was asked (also the gateway's request body)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run: str = Field(pattern=RUN_ID)
    """The completed run whose outputs are scored again."""
    eval: str = Field(min_length=1, max_length=200)
    """The evaluation whose ``score()`` scores them (same ``output_kind``)."""
    params: dict[
        Annotated[str, Field(min_length=1, max_length=100)],
        Annotated[str, Field(max_length=10_000)],
    ] = Field(default_factory=dict, max_length=100)


def rescore(
    client: redis.Redis,
    app: Celery,
    run_id: str,
    eval_name: str,
    params: Mapping[str, str],
    *,
    principal: str,
    admin: bool = False,
    archive: str,
) -> RunMeta:
    """Start the rescoring of ``run_id`` with ``eval_name`` (its results to be archived under
    ``archive``); return the new run's record."""
    runs, results, writer = RunStore(client), ResultReader(client), ResultWriter(client)
    source = runs.get(run_id)
    if source.status is not RunStatus.COMPLETED:
        raise InputError(f"run {run_id} is {source.status}; only a completed run is rescored")
    before = evaluation_of(source)
    after, language = rescorer(client, source, eval_name, params)
    # its own evaluation scores its outputs (a scorer fixed since, other parameters); another
    # one only if both declare the same kind of output
    same = eval_name == source.eval
    if not same and (before.output_kind is None or before.output_kind != after.output_kind):
        raise InputError(
            f"'{eval_name}' cannot score the outputs of '{source.eval}': their output kinds "
            f"({after.output_kind or 'undeclared'} and {before.output_kind or 'undeclared'}) "
            "are not the same (Evaluation.output_kind)"
        )
    where = f"{source.dataset_id}/{source.split}"
    tier = run_tier(
        TierRegistry(client).resolve(source.dataset_id, source.split), source.registered
    )
    admit_split(where, tier, admin)
    graded = isinstance(language, LanguageRun) and language.task.grader is not None
    admit_grader(where, tier, admin, graded)
    produced = [i for chunk in results.output_chunks(run_id, COPY_CHUNK) for i in chunk]
    if not produced:
        raise InputError(f"run {run_id} has no stored output to rescore")
    unproduced = sorted(set(results.failures(run_id)) - set(produced))
    ids = sorted(produced + unproduced)
    admit_run(where, tier, admin, len(ids))
    meta = RunMeta(
        run_id=uuid.uuid4().hex[:16],
        eval=eval_name,
        params=dict(params),
        spec=source.spec,
        dataset_id=source.dataset_id,
        registered=source.registered,
        split=source.split,
        n=len(ids),
        status=RunStatus.QUEUED,
        created=server_time(client),
        principal=principal,
        admin=admin,
        charged=not admin,
        priority=source.priority,
        sweep=None,
        tags=source.tags,
        rescored_from=run_id,
        model=source.model,
        task=None if language is None else language.model_dump_json(),
    )

    def enqueue() -> None:
        for outputs in results.output_chunks(run_id, COPY_CHUNK):
            writer.record_outputs(meta.run_id, outputs)
        for start_at in range(0, len(unproduced), COPY_CHUNK):
            failed = results.fetch(run_id, unproduced[start_at : start_at + COPY_CHUNK])
            writer.record_errors(
                meta.run_id, {r.sample_id: r.error for r in failed if r.error is not None}
            )
        Backlog(client).enqueue(app, meta, produced, SCORE_LANE)

    start(client, meta, ids, enqueue, archive=archive)
    return meta
