"""What the operator lists for an endpoint (``endpoints:`` in the policy file): its limits across
the whole fleet and the worker variable its API key is read from, if any. A plain model, with no
store: the policy, the HTTP client and the workers all read it."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from evalq.shared.lm.spec import KEY_VARIABLE

__all__ = ["EndpointLimits"]


class EndpointLimits(BaseModel):
    """One endpoint's entry: its rate limits across the whole fleet (None: unlimited) and the
    environment variable its key is read from (None: its requests carry no key)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requests_per_minute: int | None = Field(default=None, ge=1)
    tokens_per_minute: int | None = Field(default=None, ge=1)
    api_key_env: str | None = Field(default=None, pattern=KEY_VARIABLE)
    """The worker's variable whose value is sent as ``Authorization: Bearer …``. No default: a
    key goes only to a server whose entry names its variable (a default sent the provider's key
    to every other listed server, a caller's own among them)."""

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
