"""What a language model is asked and what it answers, whichever provider runs it: torch-free,
so the endpoint client and the producer never import a model library."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from evalq.shared.errors import InputError

__all__ = [
    "PROMPT_OVERHEAD",
    "ChoiceRequest",
    "ChoiceScore",
    "Generation",
    "GenerationRequest",
    "Loglikelihood",
    "LoglikelihoodRequest",
    "Message",
    "Prompt",
    "cut_at_stop",
]

PROMPT_OVERHEAD = 32
"""Tokens a token budget holds for each prompt (and each chat message) beyond its bytes: the
special tokens and chat template a server adds. A byte-level tokenizer never makes more tokens
than bytes, so a prompt's bytes plus these is its worst case."""

Message = tuple[str, str]
"""A chat message: ``(role, content)``."""
Prompt = str | tuple[Message, ...]
"""A rendered prompt: text a local model reads, or the chat messages an endpoint applies its own
template to."""


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt (already rendered) to continue."""

    prompt: Prompt
    max_new_tokens: int
    stop: tuple[str, ...] = ()
    temperature: float = 0.0
    """0: greedy; above: sampled from ``softmax(logits / temperature)``."""
    top_p: float = 1.0
    seed: int = 0
    """Seeds this request's own sampler: the same request gives the same text in any batch."""

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise InputError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")
        if not self.temperature >= 0:
            raise InputError(f"temperature must be 0 or more, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise InputError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def prompt_bytes(self) -> int:
        """The UTF-8 size of the prompt (every message's content)."""
        if isinstance(self.prompt, str):
            return len(self.prompt.encode())
        return sum(len(content.encode()) for _, content in self.prompt)

    def most_prompt_tokens(self) -> int:
        """The most prompt tokens the request can use: its prompt's bytes and
        :data:`PROMPT_OVERHEAD` for the prompt and each message. An answer that reports more is
        not believed (:class:`evalq.shared.lm.endpoint.OverReported`): a token budget held no
        more."""
        messages = 0 if isinstance(self.prompt, str) else len(self.prompt)
        return self.prompt_bytes + PROMPT_OVERHEAD * (messages + 1)

    def worst_tokens(self) -> int:
        """The most tokens the request can use, as a token budget holds it: its
        :meth:`most_prompt_tokens` and all it may generate."""
        return self.most_prompt_tokens() + self.max_new_tokens

    def estimated_tokens(self) -> int:
        """The request's tokens before it is sent, for a rate limit: its prompt's bytes over
        three (a token is about four bytes of English) plus all it may generate; corrected
        when it returns."""
        return self.prompt_bytes // 3 + 1 + self.max_new_tokens


@dataclass(frozen=True)
class Generation:
    """What the model wrote: the text cut at the first stop string, and token counts."""

    text: str
    prompt_tokens: int
    """Tokens of the prompt fed to the model (after left truncation, if any)."""
    completion_tokens: int
    """Tokens the model generated, up to and including the one that ended it (EOS or the one
    completing a stop string)."""
    cached: bool = False
    """Answered from the response cache: no request was made (the counts are the original
    request's)."""


@dataclass(frozen=True)
class ChoiceRequest:
    """A continuation to score after a context (one choice of a multiple-choice question)."""

    context: str
    continuation: str


@dataclass(frozen=True)
class ChoiceScore:
    """The continuation's summed token log-probability given the context."""

    logprob: float
    is_greedy: bool
    """Whether every continuation token is the model's argmax at its position."""
    tokens: int
    """How many continuation tokens were scored."""


@dataclass(frozen=True)
class LoglikelihoodRequest:
    """Tokens to score, already tokenized by the caller (as lm-eval's ``local-completions``
    sends them): the log-likelihood of ``tokens[context_length:]`` after the tokens before."""

    tokens: tuple[int, ...]
    context_length: int

    def __post_init__(self) -> None:
        if not 0 < self.context_length < len(self.tokens):
            raise InputError(
                f"a log-likelihood request needs a context and a continuation: "
                f"{self.context_length} of {len(self.tokens)} tokens are context"
            )

    def most_prompt_tokens(self) -> int:
        """Its prompt's tokens, counted before it is sent (and :data:`PROMPT_OVERHEAD` for a
        server that adds its own): an answer that reports more is not believed."""
        return len(self.tokens) + PROMPT_OVERHEAD

    def worst_tokens(self) -> int:
        """What a token budget holds: the prompt and the one token the server generates."""
        return self.most_prompt_tokens() + 1

    def estimated_tokens(self) -> int:
        """What the rate limit admits it as: its tokens exactly, and the one generated."""
        return len(self.tokens) + 1


@dataclass(frozen=True)
class Loglikelihood:
    """A continuation's summed log-probability as a server reported it, and its usage."""

    logprob: float
    is_greedy: bool
    """Whether each continuation token is the server's most likely one at its position."""
    prompt_tokens: int
    completion_tokens: int
    cached: bool = False


def cut_at_stop(text: str, stops: Sequence[str]) -> str:
    """``text`` before the earliest stop string (lm-eval's ``s.split(term)[0]`` per term)."""
    for term in stops:
        if term:
            text = text.split(term, maxsplit=1)[0]
    return text
