"""The one settings object, read from ``EVALQ_*`` environment variables in one place.

Worker-local knobs (device, batch size, cache sizes) live here and nowhere else: a worker never
takes them from a message or a published spec. Object-store credentials are not settings of
evalq's: fsspec reads each process's own from its environment (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL``, ``FSSPEC_S3_*``, ...), so none is ever in a
spec, a message, the registry or a log.
"""

from __future__ import annotations

import getpass
import os
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from evalq.shared.errors import InputError
from evalq.shared.target import Target, is_sentinel

__all__ = ["Settings", "get_settings"]


class Settings(BaseSettings):
    """evalq's configuration; every field is read from ``EVALQ_<NAME>``."""

    model_config = SettingsConfigDict(env_prefix="EVALQ_", frozen=True, extra="ignore")

    redis_url: str = "redis://127.0.0.1:6379/0"
    """Redis holding the ledger, the tier registry, specs, runs and results."""

    redis_url_file: Path | None = None
    """A file whose contents are ``redis_url`` (surrounding whitespace dropped), instead of
    ``EVALQ_REDIS_URL``, which may not be set as well: a worker's credential in a file only its
    user can read keeps the password out of its environment, and so out of reach of every
    program started with it."""

    redis_sentinel_master: str | None = None
    """With a Sentinel group in ``redis_url`` / ``broker_url``
    (``sentinel://h1:26379;sentinel://h2:26379;sentinel://h3:26379``): the name of the master the
    sentinels watch."""

    redis_wait_replicas: int | None = Field(default=None, ge=0)
    """Replicas that must hold a write that may not be lost (a reservation, a refund, a settle,
    a registry change) before it is reported done (``WAIT``). Unset: 1 with a Sentinel group,
    else 0 (none waited for)."""

    redis_wait_ms: int = Field(default=2000, ge=1)
    """How long such a write waits for its replicas; after that it stands on the master alone,
    with a warning in the log."""

    broker_url: str | None = None
    """Celery broker; defaults to ``redis_url``."""

    principal: str = Field(default_factory=getpass.getuser, min_length=1)
    """Direct mode (operators): who this process acts for; recorded with every reservation
    and policy change. Through the gateway the principal is the token's, never this."""

    api_url: str | None = None
    """The gateway (``evalq serve``) to talk to instead of Redis; with it set, the CLI and
    :func:`evalq.producer.clients.api.open_api` never read ``redis_url``."""

    token: SecretStr | None = None
    """The API token sent to the gateway (``evalq tokens create``)."""

    plugins: Annotated[tuple[str, ...], NoDecode] = ()
    """Comma-separated modules imported at start-up to register evaluations."""

    model_roots: Annotated[tuple[Path, ...], NoDecode] = ()
    """Comma-separated folders a caller who is not an admin may name models in
    (``--model hf/<folder>``); Hub ids are always allowed. Unset: the model cache
    (:attr:`models`)."""

    archive_url: str = Field(
        default_factory=lambda: str(Path.home() / ".local" / "share" / "evalq" / "archive"),
        min_length=1,
    )
    """Where workers archive ended runs' per-sample results as Parquet (any fsspec URL: a
    local folder, ``s3://…``, ``gs://…``); the gateway and the CLI read archives from the URL
    each run's record names, so every reader must reach it (in compose: a shared volume)."""

    archive_after: float = Field(default=0, ge=0)
    """Seconds after a run completes or is cancelled before it is archived (0: at once, sent
    by the worker that finishes it; otherwise by the janitor)."""

    archive_failed_after: float = Field(default=7 * 86400, ge=0)
    """Seconds after a run fails before it is archived (until then ``evalq resume`` can
    still finish it)."""

    spill_rows: int = Field(default=16_384, ge=0)
    """Samples per segment of a going run (its ids in submission order): once every sample of
    a segment is settled, a worker moves the segment's results to a Parquet part under
    ``archive_url`` and frees them in Redis, so a run holds in Redis what is in flight, not
    what has finished (0: never; everything waits for the archive)."""

    keep_runs_days: float | None = Field(default=None, gt=0)
    """Days an ended run is kept (its record, aggregate and archive), counted from its
    submission; the janitor purges older ones. Unset: kept until ``evalq purge``."""

    audit_days: float = Field(default=365, gt=0)
    """Days of the audit stream kept: the janitor trims entries older than this, never a
    younger one."""

    device: str = "auto"
    """Worker-local: torch device for models; ``auto`` picks CUDA when present."""

    max_batch: int = Field(default=64, ge=1)
    """Worker-local: most samples of a message in one ``infer()`` / scoring call."""

    max_shards: int = Field(default=4, ge=1)
    """Worker-local: materialized dataset shards kept per worker process (LRU)."""

    verify_routing: bool = False
    """Worker-local: re-fit a ``kmeans`` spec's routing from its own source once per
    fingerprint and refuse its samples if the centroids differ."""
    max_models: int = Field(default=2, ge=1)
    """Worker-local: loaded models kept per worker process (LRU)."""

    model_cache: Path | None = None
    """Worker-local: where models converted once for evalq are kept (a folder per source file,
    named by its digest); unset: ``~/.cache/evalq/models``."""

    data_cache: Path | None = None
    """Where the objects of object-store sources (``s3://…``) are kept, each named by its
    sha256 and fetched again only when missing (a folder of mode 700); unset:
    ``~/.cache/evalq/data``."""

    data_cache_bytes: int = Field(default=20 * 2**30, ge=0)
    """Bytes :attr:`data_cache` may hold: past them, the objects used least recently are
    removed (never those being read)."""

    isolate_inference: bool = False
    """Worker-local: run every evaluation's ``infer()`` in a warm subprocess of its own that
    only receives label-free rows (an evaluation can ask for it itself: ``isolated = True``)."""
    scorer_procs: int = Field(default=2, ge=1)
    """Worker-local: warm subprocesses per scorer script in each worker process."""
    torch_threads: int | None = Field(default=None, ge=1)
    """Worker-local: torch CPU threads per worker process; unset = torch's default (all cores).
    Set it to cores / processes when several worker processes share one machine's CPUs."""

    task_events: bool = True
    """Worker-local: send a task event per message for Flower (``--task-events``); costs about
    15% of throughput with a model that answers instantly, nothing visible with a real one."""
    max_attempts: int = Field(default=3, ge=1)
    """Worker-local: tries per sample (counted when it starts, so a sample that kills its
    worker counts too) before it ends as a terminal error."""

    max_output_bytes: int = Field(default=262_144, ge=1024)
    """Worker-local: the most bytes one sample's stored output (its JSON text) or a grader's
    grade may take in Redis; a larger one ends its sample ``infer/OutputTooLarge`` (or
    ``score/OutputTooLarge`` for a grade), so that no run's outputs crowd Redis, which every
    run and caller shares (the attack review's endpoint answered 4 MB a request and another
    user's submits were answered 503)."""

    max_run_bytes: int = Field(default=512 * 2**20, ge=2**20)
    """Worker-local: the most bytes of outputs one going run holds in Redis (what workers
    stored, less what spilled): a batch whose outputs would pass it ends its samples
    ``infer/RunTooLarge``, stored nowhere, so that no run fills the Redis every run shares
    (with ``EVALQ_SPILL_ROWS``, a run's settled segments leave Redis and make room)."""

    endpoint_threads: int = Field(default=8, ge=0, le=256)
    """Worker-local: threads of a worker's endpoint lane (one for inference and scoring), which
    runs the messages of runs on endpoint models outside its pool processes; one principal runs
    at most half of them at once and a second only while less than half are taken, so the lane
    is full only when ``threads - threads // 2 + 1`` principals hold places (5 with 8); a
    message that finds no place goes back to its backlog. 0: no lane (such messages run in the
    pool, where a slow server holds a process as long as it takes); otherwise at least 2 (one
    thread would be one principal's)."""

    cache_ttl: int = Field(default=7 * 24 * 3600, ge=1)
    """Worker-local: seconds an endpoint's cached response is kept (``submit --cache``)."""
    cache_max_bytes: int = Field(default=65_536, ge=256)
    """Worker-local: the largest response kept in the cache (a longer one is not cached)."""

    visibility_timeout: int = Field(default=3600, ge=1)
    """Seconds a delivered, unacknowledged message stays invisible before Redis hands it to
    another worker; must exceed the longest batch (shorter = duplicate work, never lost work)."""

    task_time_limit: int = Field(default=1800, ge=1)
    """Worker-local: seconds one batch may run before its pool process is killed and its
    messages requeued (each sample's attempt counts); keep it below the visibility timeout."""

    heartbeat_interval: float = Field(default=2.0, gt=0, le=60)
    """Worker-local: seconds between a worker's presence heartbeats in Redis; a worker missing
    for ``HEARTBEAT_MISSES`` intervals counts as gone (its unacknowledged messages go back)."""

    stall_after: float = Field(default=60.0, gt=0)
    """Seconds without progress after which a run counts as stalled: ``status`` says so, and
    the janitor re-sends the samples whose messages were lost and finishes a run whose
    finalizer died (it looks every ``stall_after / 4`` seconds, at most every 15 s)."""

    gateway_rate: float = Field(default=20.0, ge=0)
    """Requests a second a ``user`` principal may send the gateway on average (a token bucket
    per principal, in the gateway's process); beyond it the gateway answers 429 with
    ``Retry-After``. 0: no limit."""

    gateway_admin_rate: float = Field(default=100.0, ge=0)
    """The same for an ``admin`` principal (0: no limit)."""

    gateway_burst: float = Field(default=3.0, gt=0)
    """Seconds' worth of its rate a principal may send at once: the bucket holds
    ``rate * burst`` requests (60 for a user by default)."""

    gateway_streams_per_principal: int = Field(default=8, ge=1)
    """Results streams (``results``, ``results --follow``) one principal may hold open on one
    gateway process at once; one more is answered 429."""

    gateway_streams: int = Field(default=256, ge=1)
    """Results streams one gateway process holds open at once, all principals together."""

    gateway_inflight: int = Field(default=8, ge=1)
    """Requests of one principal a gateway process works on at once (its route threads are
    shared by everyone: one caller's costly requests must not hold them all); one more is
    answered 429 at once, before it takes a thread."""

    gateway_max_body: int = Field(default=1024 * 1024, ge=0)
    """Bytes a request body sent to the gateway may hold; a bigger one is answered 413 before
    it is read (by its ``Content-Length``) or as soon as the bytes read pass the limit."""

    remote_control: bool = False
    """Worker-local: accept Celery remote-control commands that change or stop a worker
    (``time_limit``, ``shutdown``, ``pool_restart``, ``revoke``, ...). Off: only inspection
    (what Flower lists) and ``enable_events`` are answered, the rest are refused."""

    @model_validator(mode="before")
    @classmethod
    def _read_url_file(cls, data: Any) -> Any:
        # InputError, not ValueError: a ValidationError would print the input, URL included
        if not isinstance(data, dict) or not data.get("redis_url_file"):
            return data
        if data.get("redis_url"):
            raise InputError("set EVALQ_REDIS_URL or EVALQ_REDIS_URL_FILE, not both")
        path = Path(data["redis_url_file"])
        try:
            url = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"cannot read EVALQ_REDIS_URL_FILE {path}: {exc}") from None
        if not url:
            raise InputError(f"EVALQ_REDIS_URL_FILE {path} is empty")
        return {**data, "redis_url": url}

    @field_validator("plugins", "model_roots", mode="before")
    @classmethod
    def _split_plugins(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("endpoint_threads")
    @classmethod
    def _a_lane_of_two(cls, value: int) -> int:
        if value == 1:
            raise ValueError("0 (no endpoint lane) or at least 2: one thread would be one caller's")
        return value

    @property
    def models(self) -> Path:
        """Where models converted once for evalq are kept (``model_cache``, or the default)."""
        return self.model_cache or Path.home() / ".cache" / "evalq" / "models"

    @property
    def data_cache_dir(self) -> Path:
        """Where objects of object-store sources are kept (``data_cache``, or the default)."""
        return self.data_cache or Path.home() / ".cache" / "evalq" / "data"

    @property
    def allowed_model_roots(self) -> tuple[Path, ...]:
        """The folders a non-admin may name models in: ``model_roots``, or the model cache."""
        return self.model_roots or (self.models,)

    @property
    def broker(self) -> str:
        """The broker URL in effect."""
        return self.broker_url or self.redis_url

    @property
    def redis(self) -> Target:
        """Where the store is: :attr:`redis_url` with its Sentinel master and replica waits."""
        return self._target(self.redis_url)

    @property
    def broker_target(self) -> Target:
        """Where the broker is, as :attr:`redis`."""
        return self._target(self.broker)

    def _target(self, url: str) -> Target:
        replicas = self.redis_wait_replicas
        if replicas is None:
            replicas = 1 if is_sentinel(url) else 0
        return Target(url, self.redis_sentinel_master, replicas, self.redis_wait_ms)

    def for_processes(self, processes: int) -> Settings:
        """These settings for one of ``processes`` worker processes sharing this machine: with
        no ``torch_threads`` set, each process gets an equal share of the CPU cores for torch
        instead of every process using them all."""
        if processes <= 1 or self.torch_threads is not None:
            return self
        share = max(1, (os.cpu_count() or 1) // processes)
        return self.model_copy(update={"torch_threads": share})


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """Read the environment once per process and hand out the same object after that."""
    return Settings()
