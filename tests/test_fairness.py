"""Fair share with real workers: a small run is not queued behind a big one, principals'
runs interleave, and kills and Redis restarts mid-dispatch lose and duplicate nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from producer.client import Client
from producer.submit import SubmitRequest
from shared.models import RunMeta
from shared.settings import Settings
from tests.conftest import Stack
from tests.helpers import labelled_rows, list_splits, wait_completed, write_rows

pytestmark = pytest.mark.integration


def _client(stack: Stack, principal: str) -> Client:
    return Client(Settings(redis_url=stack.server.url, principal=principal))


def _dataset(stack: Stack, folder: Path, n: int) -> str:
    write_rows(folder, "validation", labelled_rows(n))
    return list_splits(stack.client, str(folder), "validation")


def _submit(client: Client, dataset: str, limit: int, **params: str) -> RunMeta:
    request = SubmitRequest(
        eval="slow", dataset=dataset, split="validation", limit=limit, params=params
    )
    return client.submit(request)


def test_a_small_run_submitted_after_a_big_one_finishes_before_it(
    fresh_stack: Stack, tmp_path: Path
) -> None:
    """FIFO would settle every one of the big run's 2,000 samples (10 s of the slow model)
    before the small run's first; fair share starts the small run within a batch or two."""
    stack = fresh_stack
    stack.start_workers()
    dataset = _dataset(stack, tmp_path, 2000)
    sweep, loop = _client(stack, "sweep"), _client(stack, "loop")
    big = _submit(sweep, dataset, 2000)
    small = _submit(loop, dataset, 20)
    wait_completed(stack.client, small.run_id, timeout=60)
    assert sweep.status(big.run_id).progress.done < big.n // 2
    sweep.cancel(big.run_id)
