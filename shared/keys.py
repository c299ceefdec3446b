"""The Redis key schema: every key evalq reads or writes is spelled here and only here.

Per-run keys share the hash tag ``{run_id}`` so that one Lua script may touch all of a run's
keys on a Redis Cluster too.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from evalq.shared.models import Stage

__all__ = [
    "ACTIVE",
    "ANY",
    "AUDIT",
    "CACHE",
    "DATASETS",
    "DATASET_FILES",
    "ENDPOINTS",
    "FAIR",
    "FAIR_SCORE",
    "JANITOR",
    "LIVE_BYTES",
    "PRIORITIES",
    "RATE",
    "RETENTION",
    "RUNS",
    "RUN_KEYS",
    "TASKS",
    "TOKENS",
    "WORKERS",
    "FairKeys",
    "RunKeys",
    "budget_key",
    "cache_key",
    "rate_key",
    "rate_minute_key",
    "release_best_key",
    "release_config_key",
    "release_run_key",
    "shard_digests_key",
    "spec_key",
    "tiers_key",
    "worker_key",
]

RUNS = "evalq:runs"
"""Sorted set: run id scored by its creation time."""

ACTIVE = "evalq:active"
"""Set: ids of runs that are queued or running (the janitor's worklist)."""

JANITOR = "evalq:janitor"
"""String with an expiry: the hostname of the worker that runs the janitor (its lease)."""

RETENTION = "evalq:retention"
"""String with an expiry: the gateway process that applies the retention policy (its lease;
:mod:`evalq.producer.gateway.retainer`)."""

WORKERS = "evalq:workers:"
"""Prefix of the workers' heartbeat keys."""


def worker_key(hostname: str) -> str:
    """String with an expiry: one worker's heartbeat (JSON); gone when the worker is."""
    return f"{WORKERS}{hostname}"


@dataclass(frozen=True, slots=True)
class FairKeys:
    """The fair dispatcher's keys for one broker queue (:mod:`evalq.shared.queue.backlog`): which
    runs have a backlog for it, whose they are, their weights, and where each stands in its
    weighted round. The Lua scripts get these names from their callers, those of a principal's
    keys as the prefix and suffix around the principal (``fair_round`` in
    ``shared/queue/lua/prelude.lua``)."""

    prefix: str = "evalq:fair:"

    @property
    def principals(self) -> str:
        """Sorted set: principal with a backlogged run -> its virtual time (samples
        dispatched / weight; the lowest is served next)."""
        return f"{self.prefix}principals"

    def runs(self, principal: str) -> str:
        """Sorted set: the principal's backlogged run -> its virtual time within the
        principal."""
        return f"{self.prefix}runs:{principal}"

    @property
    def clock(self) -> str:
        """Hash: ``''`` -> virtual time of the principal served last; principal -> that of
        its run served last. A newcomer joins at the clock: no credit for having waited
        idle, no debt for arriving late."""
        return f"{self.prefix}clock"

    @property
    def owner(self) -> str:
        """Hash: backlogged run -> its principal."""
        return f"{self.prefix}owner"

    @property
    def weight(self) -> str:
        """Hash: backlogged run -> its weight (from its priority)."""
        return f"{self.prefix}weight"

    def weights(self, principal: str) -> str:
        """Hash: weight -> how many of the principal's backlogged runs have it (the highest
        is the principal's weight)."""
        return f"{self.prefix}weights:{principal}"

    @property
    def finish(self) -> str:
        """Hash: principal -> its virtual time when it last left the round (it comes back no
        earlier)."""
        return f"{self.prefix}finish"

    @property
    def turn(self) -> str:
        """Hash: principal -> ``model|deadline``: the model its turn serves, until that time
        of Redis's clock."""
        return f"{self.prefix}turn"

    @property
    def waiting(self) -> str:
        """Hash: backlogged run -> samples in its backlog."""
        return f"{self.prefix}waiting"

    @property
    def model(self) -> str:
        """Hash: backlogged run -> the model it runs (a principal's turn serves one model)."""
        return f"{self.prefix}model"

    @property
    def pace(self) -> str:
        """Hash: model -> seconds per sample its inference messages took lately (workers
        write it, ``submit`` sizes messages by it: :mod:`evalq.shared.queue.pace`)."""
        return f"{self.prefix}pace"

    @property
    def depth(self) -> str:
        """String with an expiry: a batch's worth of messages per live worker process that
        consumes the queue (the janitor counts them), which is how deep the dispatcher keeps
        that queue."""
        return f"{self.prefix}depth"


FAIR = FairKeys()
"""The round of the ``infer`` queue."""
FAIR_SCORE = FairKeys("evalq:fair:score:")
"""The round of the ``score`` queue: virtual times of its own (no name under ``FAIR``'s
prefix starts with ``score:``)."""


PRIORITIES = "evalq:priorities"
"""Hash: ``principal:<name>`` / ``split:<dataset>/<split>`` -> default priority."""

AUDIT = "evalq:audit"
"""Stream: every reservation, refund, tier change and budget change."""


DATASETS = "evalq:datasets"
"""Hash: registered dataset name -> JSON record (its source, splits and pinned files)."""

DATASET_FILES = "evalq:datasets:files"
"""Hash: sha256 of a registered file -> ``name/split`` that holds it (one owner per content)."""

ENDPOINTS = "evalq:endpoints"
"""Hash: an endpoint's base URL -> its limits (JSON), set by ``evalq policy apply``. An
endpoint model may only call a listed URL."""

RATE = "evalq:rate:"
"""Prefix of the fleet-wide rate limiter's keys, one per endpoint (:func:`rate_key`)."""


def _endpoint_tag(endpoint: str) -> str:
    """An endpoint's base URL as a key part: a digest (a URL may hold any character)."""
    return hashlib.sha256(endpoint.encode()).hexdigest()[:16]


def rate_key(endpoint: str) -> str:
    """Hash: one endpoint's rate-limiter state (GCRA arrival times of requests and tokens)."""
    return f"{RATE}{{{_endpoint_tag(endpoint)}}}"


def rate_minute_key(endpoint: str, bucket: int) -> str:
    """Hash with an expiry: one endpoint's counts in one ten-second bucket (requests, 429s,
    retries, tokens, failures): what status and metrics show."""
    return f"{RATE}{{{_endpoint_tag(endpoint)}}}:m:{bucket}"


CACHE = "evalq:cache:"
"""Prefix of the response cache's keys (:func:`cache_key`)."""


def cache_key(digest: str) -> str:
    """String with an expiry: one cached endpoint response (JSON), by its request's digest;
    ``<key>:lock`` (with an expiry) while one worker's request for it is in flight."""
    return f"{CACHE}{digest}"


TASKS = "evalq:tasks"
"""Hash: registered language-model task name -> JSON record (its YAML's spec, digest, who)."""

TOKENS = "evalq:tokens"
"""Hash: sha256 of an API token -> JSON (principal, role, created); tokens are never stored."""


def tiers_key(dataset: str) -> str:
    """Hash: split -> tier."""
    return f"evalq:tiers:{dataset}"


def budget_key(dataset: str, split: str, caller: str | None = None) -> str:
    """Hash: ``runs_total``, ``samples_total``, ``max_samples_per_run`` (absent = unlimited),
    ``runs_used``, ``samples_used``; of the whole split, or of one ``caller`` on it (names hold
    no ``:``, so the two never share a key)."""
    base = f"evalq:budget:{dataset}:{split}"
    return base if caller is None else f"{base}:{caller}"


SPEND = "evalq:spend:"
"""Prefix of the token ledger the workers keep beside the budgets (:func:`spend_key`)."""


def spend_key(dataset: str, split: str, caller: str | None = None) -> str:
    """Hash: ``used`` (tokens charged to recorded usage) and ``reserved`` (held by requests
    in flight) of the split's token budget, or of one ``caller``'s on it. Workers write it;
    the budget's ``tokens_total`` stays in :func:`budget_key`, which they only read."""
    base = f"{SPEND}{dataset}:{split}"
    return base if caller is None else f"{base}:{caller}"


HOLDS = "evalq:holds"
"""Hash: ticket -> JSON of one request's token hold (tokens, worker, since); see
:mod:`evalq.shared.store.spend`."""

HOLD_DEADLINES = "evalq:holds:deadlines"
"""Zset: ticket -> the time (ms, Redis's clock) after which the janitor releases its hold."""

LIVE_BYTES = "live_bytes"
"""The field of a run's progress hash (:attr:`RunKeys.progress`) counting the bytes of outputs
it holds in Redis: what workers stored, less what spilled (``EVALQ_MAX_RUN_BYTES``)."""

UNSENT = "evalq:unsent"
"""Set: runs that ended with samples a token budget kept from being sent; the gateway gives
their samples back (:meth:`evalq.shared.access.ledger.Ledger.refund_unsent`) and removes them."""


def release_config_key(dataset: str) -> str:
    """Hash: split -> JSON release rule (``evalq policy apply``); absent = the default."""
    return f"evalq:release:config:{dataset}"


def release_best_key(principal: str, dataset: str, split: str, evaluation: str) -> str:
    """Hash: metric -> JSON best so far (released value and run) of one caller's Ladder on one
    split and evaluation (no part holds a ``:``)."""
    return f"evalq:release:best:{principal}:{dataset}:{split}:{evaluation}"


def release_run_key(run_id: str) -> str:
    """String: JSON of what a run's aggregate released to its caller, fixed at its first read
    (outside the run's own keys: workers cannot write it)."""
    return f"evalq:release:run:{run_id}"


def spec_key(fingerprint: str) -> str:
    """String: the canonical JSON of a published dataset spec."""
    return f"evalq:spec:{fingerprint}"


def shard_digests_key(fingerprint: str) -> str:
    """Hash: shard index -> sha256 of its rows, recorded by the first worker that built it."""
    return f"evalq:spec:{fingerprint}:shards"


@dataclass(frozen=True, slots=True)
class RunKeys:
    """The keys of one run."""

    run_id: str

    def _key(self, name: str) -> str:
        return f"evalq:{{{self.run_id}}}:{name}"

    @property
    def facts(self) -> str:
        """Hash: what the gateway decides by, written only by a producer (the ``worker`` ACL
        user may read it, never write it): eval, params, spec, dataset, split, n, principal,
        charge, priority, created (Redis's clock), ``archive`` (the archive location its
        results go under) and ``refunded`` (set once, when its charge was given back). Outside
        ``evalq:{*``, the pattern of the keys workers write, with the run's hash tag."""
        return f"evalq:facts:{{{self.run_id}}}"

    @property
    def meta(self) -> str:
        """Hash: the run's state, which workers write: status, finished, reason, archive
        claims and seal (``archive_url``, ``archived``), ``finalizing``. Its other fields are
        ignored: the run's facts are in :attr:`facts`."""
        return self._key("meta")

    @property
    def ids(self) -> str:
        """String: JSON list of the run's sample ids, in submission order."""
        return self._key("ids")

    @property
    def out(self) -> str:
        """Hash: sample id -> JSON output of ``infer()``, written once."""
        return self._key("out")

    @property
    def score(self) -> str:
        """Hash: sample id -> JSON metrics of ``score()``, written once."""
        return self._key("score")

    @property
    def err(self) -> str:
        """Hash: sample id -> JSON terminal error record, written once."""
        return self._key("err")

    @property
    def usage(self) -> str:
        """Hash: sample id -> JSON token usage of a language model's output
        (:meth:`evalq.shared.models.Usage.stored`), written with the output in :attr:`out`;
        none for an output without usage (a Python evaluation's)."""
        return self._key("usage")

    @property
    def grade(self) -> str:
        """Hash: sample id -> JSON grade of a ``model_graded`` sample
        (:meth:`evalq.shared.models.Grade.stored`), written with its scores in :attr:`score`."""
        return self._key("grade")

    def ranges_of(self, column: str) -> str:
        """Sorted set: the fields of :attr:`out` (``column`` ``outputs``) or :attr:`score`
        (``scores``) that hold a span of samples (``lo-hi``: the texts of samples ``lo`` to
        ``hi``, every one, joined by newlines), scored by ``lo``; see
        :data:`evalq.shared.store.wire.SPAN_MAX`."""
        return self._key("out_spans" if column == "outputs" else "score_spans")

    @property
    def inferred(self) -> str:
        """String used as a bitmap: bit ``i`` is set once sample ``i`` has an output (in
        :attr:`out`, or spilled); never cleared while the run lives."""
        return self._key("inferred")

    @property
    def done(self) -> str:
        """String used as a bitmap: bit ``i`` is set once sample ``i`` is settled (a score or
        a terminal error; in :attr:`score` / :attr:`err`, or spilled); never cleared while the
        run lives."""
        return self._key("done")

    @property
    def scratch(self) -> str:
        """String: a bitmap ``cancel.lua`` computes into and deletes in the same call."""
        return self._key("scratch")

    def attempts_of(self, stage: Stage) -> str:
        """Hash: sample id -> times its inference (``attempts``) or scoring
        (``score_attempts``) was started."""
        if stage is Stage.SCORE:
            return self._key("score_attempts")
        return self._key("attempts")

    def deliveries_of(self, stage: Stage) -> str:
        """Hash: message key -> times a message of several of the run's samples was delivered
        for inference (``deliveries``) or scoring (``score_deliveries``): its samples' attempts
        while none is counted alone."""
        if stage is Stage.SCORE:
            return self._key("score_deliveries")
        return self._key("deliveries")

    @property
    def spill(self) -> str:
        """Hash: ``rows`` -> samples per segment (positions ``k*rows`` up to ``(k+1)*rows`` of
        the run's ids); segment index ``k`` -> URL of the Parquet part its settled samples were
        moved to while the run went on (``spill.lua``)."""
        return self._key("spill")

    @property
    def spilled(self) -> str:
        """String used as a bitmap: bit ``i`` is set once sample ``i``'s results moved to a
        spilled part; nothing is written for such a sample again."""
        return self._key("spilled")

    @property
    def requests(self) -> str:
        """Hash: sample id -> the lm-eval requests built for it at submission (their
        arguments only, :mod:`evalq.shared.store.requests`)."""
        return self._key("requests")

    @property
    def per_sample(self) -> list[str]:
        """Every key whose size grows with the run's samples: freed when the run is archived
        (``seal.lua``) or purged."""
        return [
            self.out,
            self.score,
            self.err,
            self.usage,
            self.grade,
            self.attempts_of(Stage.INFER),
            self.attempts_of(Stage.SCORE),
            self.deliveries_of(Stage.INFER),
            self.deliveries_of(Stage.SCORE),
            self.settled,
            self.ids,
            self.backlog,
            self.backlog_of(Stage.SCORE),
            self.spill,
            self.spilled,
            self.inferred,
            self.done,
            self.ranges_of("outputs"),
            self.ranges_of("scores"),
            self.scratch,
            self.requests,
        ]

    @property
    def settled(self) -> str:
        """Stream: ids of samples as they get their terminal result, for followers."""
        return self._key("settled")

    @property
    def progress(self) -> str:
        """Hash: inferred, scored, failed (bumped only when a write happened), recovered (sent
        again by the janitor), touched (Redis time of the last such write)."""
        return self._key("progress")

    @property
    def backlog(self) -> str:
        """List: the run's inference messages not handed to the broker yet, each
        ``samples|queue|message`` (the message exactly as kombu would push it), oldest at the
        right."""
        return self._key("backlog")

    def backlog_of(self, stage: Stage) -> str:
        """List: the run's inference (``backlog``) or scoring (``score_backlog``) messages not
        handed to the broker yet, as :attr:`backlog` holds them."""
        if stage is Stage.SCORE:
            return self._key("score_backlog")
        return self.backlog

    @property
    def aggregate(self) -> str:
        """String: JSON aggregate metrics, computed once from the store."""
        return self._key("aggregate")

    @property
    def provenance(self) -> str:
        """Hash: one JSON record per distinct worker (host, device, code) that stored outputs
        (:mod:`evalq.shared.store.provenance`)."""
        return self._key("provenance")

    @property
    def errors(self) -> str:
        """Hash: ``stage/kind`` -> terminal errors of that kind, written when the run is
        archived (its per-sample errors then live in the archive)."""
        return self._key("errors")

    @property
    def stats(self) -> str:
        """String: JSON, each metric's mean, standard error and 95% interval
        (:class:`evalq.shared.stats.Stat`), computed with the aggregate."""
        return self._key("stats")


ANY = "*"
"""Stands for any run, dataset, split, caller or worker in a key: ``RunKeys(ANY).meta`` is the
glob pattern of every run's meta (the ACL file's key patterns are made this way)."""

RUN_KEYS = RunKeys(ANY)._key(ANY)
"""The glob pattern of every key of every run that workers write (:class:`RunKeys`'s own, not
its facts)."""
