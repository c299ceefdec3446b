"""Prometheus metrics Flower does not have: ``evalq metrics --port 9808``.

A prometheus-client collector reads Redis at each scrape (nothing is cached between scrapes):

- ``evalq_run_samples{run, eval, dataset, split, state}``: samples of each recent run by state
  (``total``, ``inferred``, ``scored``, ``failed``, ``done``);
- ``evalq_run_active{run, ...}``: 1 while the run is queued or running;
- ``evalq_queue_depth{queue}``: messages waiting in each broker queue (every priority level):
  ``infer``, ``score``, and each evaluation queue that holds messages (``infer.<eval>``);
- ``evalq_messages_unacked``: messages delivered to a worker and not acknowledged yet;
- ``evalq_principal_samples{principal, state}``: samples of each principal's going runs that
  are ``queued`` (in their backlogs, not dispatched yet) and ``running`` (dispatched, not
  settled yet): how the fair dispatcher shares the workers;
- ``evalq_budget_remaining{dataset, split, principal, unit}``: runs and samples left of each
  budget (``principal`` empty for a whole split's; an unlimited total has no series);
- ``evalq_endpoint_last_minute{endpoint, count}``: each listed endpoint's ``requests``,
  ``rate_limited`` (429s), ``retries``, ``tokens``, ``failed`` and ``cached`` over the last
  minute, from every worker.

Counts only: no row, output, score or aggregate is exported, whatever the split's tier.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

import redis
from prometheus_client import start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from evalq.shared.access.ledger import Ledger
from evalq.shared.errors import UnknownRunError
from evalq.shared.queue.backlog import Backlog
from evalq.shared.queue.broker import queue_keys, queue_names, unacked_count
from evalq.shared.store.endpoints import EndpointRegistry
from evalq.shared.store.rate import minute_counts
from evalq.shared.store.reader import ResultReader
from evalq.shared.store.runs import RunStore

__all__ = ["EvalqCollector", "MetricsServer", "serve"]

_RUN_LABELS = ("run", "eval", "dataset", "split")


class EvalqCollector(Collector):
    """Run, queue and budget gauges, read from Redis when scraped."""

    def __init__(self, client: redis.Redis, runs: int = 100) -> None:
        self._client = client
        self._runs = runs

    def collect(self) -> Iterator[GaugeMetricFamily]:
        samples = GaugeMetricFamily(
            "evalq_run_samples", "Samples of a run by state.", labels=[*_RUN_LABELS, "state"]
        )
        active = GaugeMetricFamily(
            "evalq_run_active", "1 while the run is queued or running.", labels=_RUN_LABELS
        )
        store = ResultReader(self._client)
        for meta in RunStore(self._client).recent(self._runs):
            labels = [meta.run_id, meta.eval, meta.dataset_id, meta.split]
            progress = store.progress(meta.run_id)
            states = {
                "total": meta.n,
                "inferred": progress.inferred,
                "scored": progress.scored,
                "failed": progress.failed,
                "done": progress.done,
            }
            for state, value in states.items():
                samples.add_metric([*labels, state], value)
            active.add_metric(labels, 1 if meta.status.active else 0)
        yield samples
        yield active

        depth = GaugeMetricFamily(
            "evalq_queue_depth", "Messages waiting in a broker queue.", labels=["queue"]
        )
        for queue in queue_names(self._client):
            with self._client.pipeline(transaction=False) as pipe:
                for key in queue_keys(queue):
                    pipe.llen(key)
                depth.add_metric([queue], sum(pipe.execute()))
        yield depth
        yield GaugeMetricFamily(
            "evalq_messages_unacked",
            "Messages delivered to a worker and not acknowledged yet.",
            value=unacked_count(self._client),
        )

        yield self._principals(store)

        budget = GaugeMetricFamily(
            "evalq_budget_remaining",
            "Runs or samples left in a split's budget.",
            labels=["dataset", "split", "principal", "unit"],
        )
        for entry in Ledger(self._client).all():
            for unit, left in (("runs", entry.runs_left), ("samples", entry.samples_left)):
                if left is not None:
                    budget.add_metric([entry.dataset, entry.split, entry.caller or "", unit], left)
        yield budget
        yield self._endpoints()

    def _endpoints(self) -> GaugeMetricFamily:
        traffic = GaugeMetricFamily(
            "evalq_endpoint_last_minute",
            "An endpoint's requests, 429s, retries, tokens, failed samples and cache answers "
            "over the last minute, from every worker.",
            labels=["endpoint", "count"],
        )
        listed = EndpointRegistry(self._client).all()
        for url, counts in minute_counts(self._client, listed).items():
            for name, value in counts.items():
                traffic.add_metric([url, name], value)
        return traffic

    def _principals(self, store: ResultReader) -> GaugeMetricFamily:
        shares = GaugeMetricFamily(
            "evalq_principal_samples",
            "Samples of a principal's going runs, queued in backlogs or running.",
            labels=["principal", "state"],
        )
        waiting = Backlog(self._client).waiting()
        runs = RunStore(self._client)
        counts: dict[str, dict[str, int]] = defaultdict(lambda: {"queued": 0, "running": 0})
        for run_id in runs.active():
            try:
                meta = runs.get(run_id)
            except UnknownRunError:
                continue
            if not meta.status.active:
                continue
            queued = waiting.get(run_id, ("", 0))[1]
            left = max(0, meta.n - store.progress(run_id).done)
            counts[meta.principal]["queued"] += min(queued, left)
            counts[meta.principal]["running"] += max(0, left - queued)
        for principal, states in sorted(counts.items()):
            for state, value in states.items():
                shares.add_metric([principal, state], value)
        return shares


@dataclass
class MetricsServer:
    """A running metrics endpoint."""

    server: WSGIServer
    thread: threading.Thread

    @property
    def port(self) -> int:
        return int(self.server.server_port)

    def wait(self) -> None:
        """Block until the server stops (Ctrl-C)."""
        self.thread.join()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve(
    client: redis.Redis, address: str = "0.0.0.0", port: int = 9808, runs: int = 100
) -> MetricsServer:
    """Serve ``/metrics`` from a registry holding only evalq's collector (port 0: any free)."""
    registry = CollectorRegistry()
    registry.register(EvalqCollector(client, runs))
    server, thread = start_http_server(port, addr=address, registry=registry)
    return MetricsServer(server, thread)
