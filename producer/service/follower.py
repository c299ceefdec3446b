"""A run's per-sample results in the order they settle, each once, until the run ends.

:class:`Follower` reads in steps, and a step waits only when asked to: direct mode
(:meth:`evalq.producer.service.client.Client.follow_results`) lets each step block on the run's
settled stream, while the gateway takes every step without waiting, on its stream threads, and waits
for the stream asynchronously in between (:mod:`evalq.producer.gateway.streams`), so that an open
follow
holds no thread while nothing settles.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import islice

from evalq.shared.keys import RunKeys
from evalq.shared.models import SampleResult, SampleState
from evalq.shared.store.reader import ResultReader
from evalq.shared.store.runs import RunStore

__all__ = ["Follower"]


class Follower:
    """One reader's pass over a run's results as they settle: the settled stream while the run
    lives in Redis, then (once it is archived, before or while this follows) the rest from its
    archive. The policy is the caller's to ask before making one."""

    def __init__(
        self,
        results: ResultReader,
        runs: RunStore,
        run_id: str,
        with_input: Callable[[SampleResult], SampleResult] | None = None,
        rows: int = 1000,
    ) -> None:
        """``rows``: results a step reads and returns at most (those settled beyond wait for
        the next steps), so that a step holds a bounded number of outputs."""
        self.run_id = run_id
        self._rows = rows
        self._pending: list[int] = []
        self._results = results
        self._runs = runs
        self._with_input = with_input
        self._cursor = "0-0"
        self._seen: set[int] = set()
        self._tail: Iterator[SampleResult] | None = None

    @property
    def stream(self) -> str:
        """The run's settled stream: what to wait on between two steps."""
        return RunKeys(self.run_id).settled

    @property
    def cursor(self) -> str:
        """The id of the last settled-stream entry read: wait for entries after it."""
        return self._cursor

    def step(self, block_ms: int | None = None) -> list[SampleResult] | None:
        """The results settled since the last step, in the order they settled (waiting up to
        ``block_ms`` for some while the run is going; None: not at all); an empty list when
        none did; None once the run has ended and every result has been returned."""
        if self._tail is None:
            if self._results.archive_url(self.run_id) is None:
                ended = not self._runs.get(self.run_id).status.active
                if not self._pending:
                    wait = None if ended else block_ms
                    got = self._results.settled_since(self.run_id, self._cursor, wait)
                    self._cursor, self._pending = got
                ids, self._pending = self._pending[: self._rows], self._pending[self._rows :]
                found = self._results.fetch_live(self.run_id, ids)
                if found is not None:
                    self._seen.update(ids)
                    if ended and not ids and self._results.archive_url(self.run_id) is None:
                        return None
                    return self._added(found)
            self._tail = (
                result
                for result in self._results.results(self.run_id, self._rows)
                if result.sample_id not in self._seen and result.state is not SampleState.PENDING
            )
        rest = list(islice(self._tail, self._rows))
        return self._added(rest) if rest else None

    def waiting(self, block_ms: int) -> Iterator[SampleResult]:
        """Every step's results, each step waiting up to ``block_ms`` for some (direct mode:
        the thread that iterates waits)."""
        while (found := self.step(block_ms)) is not None:
            yield from found

    def _added(self, results: list[SampleResult]) -> list[SampleResult]:
        if self._with_input is None:
            return results
        return [self._with_input(result) for result in results]
