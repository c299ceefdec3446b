"""lm-eval's model API answered by an endpoint model, as lm-eval's ``local-completions`` answers
it, but through evalq's client (:class:`evalq.shared.lm.endpoint.EndpointModel`): the fleet's
rate limit, the run's response cache and token budget, its retries and its error kinds.

What lm-eval's own code does is done by it: a context and continuation are tokenized by
``TemplateLM``'s ``_encode_pair`` and a text's rolling windows cut by ``lm_eval.utils``'
``get_rolling_token_windows`` and ``make_disjoint_window`` (as ``TemplateAPI``'s
``loglikelihood_rolling`` cuts them), with the tokenizer the run names
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

from lm_eval import utils
from lm_eval.api.model import TemplateLM
from lm_eval.models.utils import configure_pad_token, handle_stop_sequences

from evalq.shared.errors import InputError
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
        asked: dict[int, LoglikelihoodRequest] = {}
        found: list[Any] = [(0.0, True)] * len(requests)  # an empty continuation's, as lm-eval's
        for i, (_key, context, continuation) in enumerate(requests):
            if not continuation:
                continue
            whole = context + continuation
            kept = whole[-self.max_length :]
            length = len(context) - max(0, len(whole) - self.max_length)
            try:
                asked[i] = LoglikelihoodRequest(tuple(kept), length)
            except InputError as exc:  # a continuation longer than the window: its document's
                found[i] = exc
        answers = self.model.loglikelihoods(list(asked.values()), [self.run_id] * len(asked))
        for i, made in zip(asked, answers, strict=True):
            found[i] = made if isinstance(made, Exception) else (made.logprob, made.is_greedy)
        return found

    def loglikelihood_rolling(
        self, requests: Sequence[Any], disable_tqdm: bool = False
    ) -> list[Any]:
        """Each text's log-likelihood as ``TemplateAPI.loglikelihood_rolling`` computes it: its
        disjoint rolling windows (lm-eval's functions), scored by
        :meth:`_loglikelihood_tokens` (every text's windows in one batch) and summed; a text a
        window of which failed is that window's error."""
        owners: list[int] = []
        windows: list[tuple[Any, list[int], list[int]]] = []
        for t, request in enumerate(requests):
            (text,) = request.args
            for window in utils.get_rolling_token_windows(
                token_list=self.tok_encode(text),
                prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length - 1,
                context_len=1,
            ):
                owners.append(t)
                windows.append((None, *utils.make_disjoint_window(window)))
        totals: list[Any] = [0.0] * len(requests)
        for t, scored in zip(owners, self._loglikelihood_tokens(windows), strict=True):
            if isinstance(totals[t], Exception):
                continue
            totals[t] = scored if isinstance(scored, Exception) else totals[t] + scored[0]
        return totals

    def generate_until(self, requests: Sequence[Any], disable_tqdm: bool = False) -> list[Any]:
        """Each ``(context, generation arguments)``'s text, with ``local-completions``'
        defaults (``max_gen_toks`` 256, greedy, the tokenizer's EOS among the stops)."""
        asked = []
        for instance in requests:
            context, kwargs = instance.args
            kwargs = dict(kwargs)
            eos = self.tokenizer.eos_token if self.tokenizer is not None else None
            stop = handle_stop_sequences(kwargs.get("until"), eos)
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
