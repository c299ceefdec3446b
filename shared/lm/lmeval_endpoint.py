"""lm-eval's model API answered by an endpoint model, as lm-eval's ``local-completions`` answers
it, but through evalq's client (:class:`evalq.shared.lm.endpoint.EndpointModel`): the fleet's
rate limit, the run's response cache and token budget, its retries and its error kinds.

What lm-eval's own code does is done by it: a context and continuation are tokenized by
``TemplateLM``'s ``_encode_pair`` and a text's rolling windows by ``TemplateAPI``'s
``loglikelihood_rolling`` (borrowed, unbound), with the tokenizer the run names
(``--model-arg tokenizer=…``, loaded as lm-eval loads an API model's). What
``local-completions`` sends, this sends: the tokens, left-truncated to ``max_length - 1``, with
``echo`` and ``logprobs``; a continuation's log-likelihood is the sum of its tokens' reported
log-probabilities. Generations differ in one way: the context is sent as text (the server
tokenizes it) and so works on servers that take no token prompts.

A request whose retries run out is returned as its error (not raised): the document it belongs
to fails, and the rest of the batch goes on. Imported only where an lm-eval task runs on an
endpoint (it imports lm-eval).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lm_eval.api.model import TemplateLM
from lm_eval.models.api_models import TemplateAPI
from lm_eval.models.utils import configure_pad_token, handle_stop_sequences

from evalq.shared.errors import EndpointError, TokensExhausted
from evalq.shared.lm.endpoint import EndpointModel
from evalq.shared.lm.request import GenerationRequest, LoglikelihoodRequest

__all__ = ["API_MAX_GEN_TOKS", "API_MAX_LENGTH", "EndpointLM", "load_tokenizer"]

API_MAX_LENGTH = 2048
"""lm-eval's ``max_length`` of an API model when none is given."""
API_MAX_GEN_TOKS = 256
"""lm-eval's ``max_gen_toks`` of an API model when a task's generation arguments set none."""


def load_tokenizer(path: str) -> Any:
    """The tokenizer at ``path`` (an admitted folder), as lm-eval loads an API model's
    (``AutoTokenizer``, no remote code, its pad token configured)."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    return configure_pad_token(tokenizer)


class EndpointLM(TemplateLM):  # type: ignore[misc]  # lm-eval has no type information
    """lm-eval's model API for one run on an endpoint model (its requests metered and cached
    as the run's)."""

    def __init__(self, model: EndpointModel, tokenizer: Any, run_id: str) -> None:
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        self.run_id = run_id
        self.max_length = API_MAX_LENGTH - 1
        """As ``TemplateAPI`` keeps its default: the window less the one token generated."""
        self._raising = False
        """Whether a failed request is raised (within a rolling text) or returned."""

    @property
    def eot_token_id(self) -> int:
        return int(self.tokenizer.eos_token_id)

    @property
    def prefix_token_id(self) -> int:
        """As ``TemplateAPI``'s with a Hugging Face tokenizer: BOS, else EOS."""
        bos = self.tokenizer.bos_token_id
        return int(bos if bos is not None else self.tokenizer.eos_token_id)

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **_: Any) -> Any:
        """As ``TemplateAPI.tok_encode`` with a Hugging Face tokenizer (no special tokens)."""
        return self.tokenizer(
            string, add_special_tokens=bool(add_special_tokens), return_attention_mask=False
        ).input_ids

    def _loglikelihood_tokens(
        self, requests: Sequence[tuple[Any, list[int], list[int]]], **_: Any
    ) -> list[Any]:
        """Each ``(key, context, continuation)``'s ``(log-likelihood, is_greedy)``, or the
        error its request ended with; truncated as ``batch_loglikelihood_requests`` does."""
        asked = []
        for _key, context, continuation in requests:
            whole = context + continuation
            kept = whole[-self.max_length :]
            length = len(context) - max(0, len(whole) - self.max_length)
            asked.append(LoglikelihoodRequest(tuple(kept), length))
        answers = self.model.loglikelihoods(asked, [self.run_id] * len(asked))
        failed = next((a for a in answers if isinstance(a, Exception)), None)
        if failed is not None and self._raising:
            raise failed
        return [a if isinstance(a, Exception) else (a.logprob, a.is_greedy) for a in answers]

    def loglikelihood_rolling(
        self, requests: Sequence[Any], disable_tqdm: bool = False
    ) -> list[Any]:
        """Each text's log-likelihood by lm-eval's own ``TemplateAPI.loglikelihood_rolling``
        (its disjoint rolling windows, scored by :meth:`_loglikelihood_tokens` and summed),
        one text at a time: a text a window of which failed is that window's error."""
        found: list[Any] = []
        for request in requests:
            self._raising = True
            try:
                found += TemplateAPI.loglikelihood_rolling(self, [request], disable_tqdm=True)
            except (EndpointError, TokensExhausted) as failed:
                found.append(failed)
            finally:
                self._raising = False
        return found

    def generate_until(self, requests: Sequence[Any], disable_tqdm: bool = False) -> list[Any]:
        """Each ``(context, generation arguments)``'s text, with ``local-completions``'
        defaults (``max_gen_toks`` 256, greedy, the tokenizer's EOS among the stops)."""
        asked = []
        for instance in requests:
            context, kwargs = instance.args
            kwargs = dict(kwargs)
            stop = handle_stop_sequences(kwargs.get("until"), self.tokenizer.eos_token)
            asked.append(
                GenerationRequest(
                    context,
                    int(kwargs.get("max_gen_toks", API_MAX_GEN_TOKS)),
                    tuple(stop),
                    float(kwargs.get("temperature", 0.0)),
                    float(kwargs.get("top_p", 1.0)),
                )
            )
        made = self.model.generate(asked, [self.run_id] * len(asked))
        return [g if isinstance(g, Exception) else g.text for g in made]
