"""The naive reference: what a user writes by hand — one Celery task per sample, no batching.

The model is still loaded once per worker process (a fair baseline: only the batching and the
bookkeeping differ). Run as ``celery -A bench.naive worker``.
"""

from __future__ import annotations

import json
import os
from functools import cache
from typing import Any

from celery import Celery

from evalq.shared.connection import connect
from evalq.shared.data.loading import load_rows
from evalq.shared.data.spec import fetch_spec
from evalq.shared.evaluation import Evaluation, create, load_plugins, scrub

app = Celery("naive", broker=os.environ.get("EVALQ_REDIS_URL", "redis://127.0.0.1:6379/0"))
app.conf.update(task_serializer="json", accept_content=["json"], task_ignore_result=True)
load_plugins([])


@cache
def _client() -> Any:
    return connect(os.environ["EVALQ_REDIS_URL"])


@cache
def _evaluation(name: str) -> tuple[Evaluation, Any]:
    evaluation = create(name)
    return evaluation, evaluation.load("cpu")


@cache
def _rows(fingerprint: str) -> Any:
    return load_rows(fetch_spec(_client(), fingerprint))


@app.task(name="naive.evaluate")
def evaluate(run_id: str, eval_name: str, spec: str, sample_id: int) -> None:
    """Infer, score and store one sample."""
    evaluation, model = _evaluation(eval_name)
    row = _rows(spec)[sample_id]
    output = evaluation.infer(model, [scrub(row, evaluation.label_fields)])[0]
    scores = evaluation.score(row, output)
    client = _client()
    client.hset(f"naive:{run_id}:score", str(sample_id), json.dumps(scores))
    client.incr(f"naive:{run_id}:done")
