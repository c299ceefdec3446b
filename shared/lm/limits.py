"""What the operator lists for an endpoint (``endpoints:`` in the policy file): its limits across
the whole fleet, the most a run may ask of it per worker process (``--model-arg timeout`` and
``concurrency``), and the worker variable its API key is read from, if any. A plain model, with
no store: the policy, the HTTP client and the workers all read it, and judge a run's arguments
by :meth:`EndpointLimits.refusal` (at submit, and again on the workers before each batch)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from evalq.shared.lm.spec import KEY_VARIABLE, ModelArgs

__all__ = ["EndpointLimits"]


class EndpointLimits(BaseModel):
    """One endpoint's entry: its rate limits across the whole fleet (None: unlimited), the
    largest ``timeout`` and ``concurrency`` a run may ask, and the environment variable its key
    is read from (None: its requests carry no key)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requests_per_minute: int | None = Field(default=None, ge=1)
    tokens_per_minute: int | None = Field(default=None, ge=1)
    api_key_env: str | None = Field(default=None, pattern=KEY_VARIABLE)
    """The worker's variable whose value is sent as ``Authorization: Bearer …``. No default: a
    key goes only to a server whose entry names its variable (a default sent the provider's key
    to every other listed server, a caller's own among them)."""
    max_timeout: float = Field(default=120.0, gt=0, le=3600)
    """The most seconds a run's request may wait for an answer (``--model-arg timeout``): a
    request holds a worker process's slot and its token hold that long, so a caller whose
    server answers late holds them no longer than this (the security review's 3,600 s held
    every worker process)."""
    max_concurrency: int = Field(default=16, ge=1, le=256)
    """The most requests a run may keep in flight per worker process (``--model-arg
    concurrency``), each holding its worst case on a token budget."""

    def admits_key(self, asked: str | None) -> bool:
        """Whether a model that names ``asked`` as its key variable (None: it names none, and
        gets whatever this entry names) may call this endpoint: a caller checks the operator's
        choice, never makes it."""
        return asked is None or asked == self.api_key_env

    def key_text(self) -> str:
        """Which key this entry sends, as a refusal says it."""
        if self.api_key_env is None:
            return "sends no key (its entry names no api_key_env)"
        return f"takes its key from {self.api_key_env}"

    def refusal(self, url: str, args: ModelArgs) -> str | None:
        """Why a run with ``args`` may not call this endpoint (``url``), in one line; None when
        it may."""
        if not self.admits_key(args.api_key_env):
            return f"endpoint {url} {self.key_text()}, not {args.api_key_env}"
        if args.timeout > self.max_timeout:
            return (
                f"endpoint {url} allows timeout={self.max_timeout:g} at most, not "
                f"{args.timeout:g} (its max_timeout in the policy's endpoints:)"
            )
        if args.concurrency > self.max_concurrency:
            return (
                f"endpoint {url} allows concurrency={self.max_concurrency} at most, not "
                f"{args.concurrency} (its max_concurrency in the policy's endpoints:)"
            )
        return None
