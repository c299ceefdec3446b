"""What the operator lists for an endpoint (``endpoints:`` in the policy file): its limits across
the whole fleet and the worker variable its API key is read from. A plain model, with no store:
the policy, the HTTP client and the workers all read it."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from evalq.shared.lm.spec import DEFAULT_API_KEY_ENV

__all__ = ["EndpointLimits"]


class EndpointLimits(BaseModel):
    """One endpoint's entry: its rate limits across the whole fleet (None: unlimited) and the
    environment variable its key is read from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requests_per_minute: int | None = Field(default=None, ge=1)
    tokens_per_minute: int | None = Field(default=None, ge=1)
    api_key_env: str = Field(default=DEFAULT_API_KEY_ENV, pattern=r"^[A-Z][A-Z0-9_]{0,63}$")
