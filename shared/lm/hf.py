"""A transformers causal LM loaded once per worker process: batched generation and
continuation log-likelihoods, computed the way lm-evaluation-harness 0.4.13's ``hf`` backend
computes them, so scores and greedy outputs can be checked against it.

Rules taken from lm-eval (``lm_eval/models/huggingface.py`` unless said otherwise):

- ``prefix_token_id``: BOS, or EOS when the tokenizer has no BOS.
- ``tok_encode`` (``add_bos_token`` unset, lm-eval's causal default): the tokenizer's own
  ``add_special_tokens`` default, turned off when the text already starts with the decoded
  prefix token.
- ``api/model.py`` ``_encode_pair``: trailing whitespace of the context moves to the start of
  the continuation; ``whole = encode(context + continuation)``, ``context = encode(context)``,
  continuation tokens ``= whole[len(context):]``.
- ``api/model.py`` ``loglikelihood``: an empty context becomes ``[prefix_token_id]`` and the
  continuation is encoded with ``add_special_tokens=False`` (when the continuation already
  starts with the prefix token, that token is the context instead).
- ``_loglikelihood_tokens``: the input is ``(context + continuation)[-(max_length + 1):][:-1]``
  (left truncation), right-padded with 0 and run without an attention mask (causal: padding
  after a row changes none of its logits); ``log_softmax`` over the vocabulary in the
  model's dtype; the score is the sum of the continuation tokens' log-probabilities over the
  last ``len(continuation)`` positions, and ``is_greedy`` whether each is the argmax.
- ``resolve_max_length`` (``models/utils.py``): ``n_positions``, ``max_position_embeddings``
  or ``n_ctx`` of the (text) config, else the tokenizer's ``model_max_length``, else 2048.
- ``tok_batch_encode``: a prompt that starts with the BOS string is encoded with
  ``add_special_tokens=False`` (lm-eval decides on the batch's first prompt, so a prompt's
  output there can depend on its batch; here each prompt decides for itself, as lm-eval does
  with ``batch_size=1``), no truncation by the tokenizer, then left truncation to
  ``max_length - max_new_tokens`` tokens; left padding with an attention mask.
- ``generate_until`` / ``_model_generate``: greedy (``do_sample=False``) when the temperature is
  0; the decoded EOS joins the stop strings; the generated tokens are decoded with
  ``skip_special_tokens=True`` and cut with ``s.split(term)[0]`` for each stop string
  (``postprocess_generated_text`` in ``models/utils.py``), which is a cut at the earliest one.
- ``apply_chat_template``: ``tokenize=False, add_generation_prompt=True``.

Ours, not lm-eval's: sampling is per row (see :class:`_RowSampler`), and a row stops as soon as
one of its own stop strings appears in its decoded text (lm-eval stops a batch when every row
has); the cut text is the same either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedTokenizerBase,
    StoppingCriteria,
    StoppingCriteriaList,
)

from evalq.shared.errors import InputError, first_line
from evalq.shared.lm.request import (
    ChoiceRequest,
    ChoiceScore,
    Generation,
    GenerationRequest,
    cut_at_stop,
)
from evalq.shared.lm.spec import ModelSpec, folder
from evalq.shared.lm.template import ChatTemplate, load_tokenizer
from evalq.shared.services import Services

__all__ = ["HFModel", "load"]

DEFAULT_MAX_LENGTH = 2048
_TOKENIZER_INFINITY = 1000000000000000019884624838656
_SEQLEN_ATTRS = ("n_positions", "max_position_embeddings", "n_ctx")


class HFModel:
    """A causal LM and its tokenizer; build with :meth:`load`."""

    def __init__(
        self,
        spec: ModelSpec,
        model: Any,
        tokenizer: PreTrainedTokenizerBase,
        device: torch.device,
    ) -> None:
        self.spec = spec
        self.model = model
        self.tokenizer = tokenizer
        self.template = ChatTemplate(spec, tokenizer)
        self.device = device
        limit = _resolve_max_length(model.config, tokenizer)
        self.max_length = min(spec.args.max_length or limit, limit)
        """Context window in tokens (lm-eval's ``max_length``): ``max_length`` when given,
        never more than the model's own (a longer one indexes past its position table)."""
        eos = tokenizer.eos_token_id
        config_eos = getattr(model.generation_config, "eos_token_id", None)
        listed = config_eos if isinstance(config_eos, list) else [config_eos]
        self.eos_ids: tuple[int, ...] = tuple(
            sorted({int(i) for i in [*listed, eos] if i is not None})
        )
        bos = tokenizer.bos_token_id
        self.prefix_token_id: int = int(bos if bos is not None else eos)
        self._prefix_text = self.decode([self.prefix_token_id], skip_special_tokens=False)
        self._eos_text = self.decode([int(eos)], skip_special_tokens=False)

    @classmethod
    def load(cls, spec: ModelSpec, device: str) -> HFModel:
        """Load weights and tokenizer on ``device`` from the model's folder (a Hub model's
        snapshot: :func:`evalq.shared.lm.spec.folder`); never with ``trust_remote_code``."""
        source = str(folder(spec))
        where = torch.device(device)
        dtype: Any = spec.args.dtype
        if dtype == "auto":
            dtype = torch.float32 if where.type == "cpu" else "auto"
        else:
            dtype = getattr(torch, dtype)
        common: dict[str, Any] = {
            "local_files_only": True,
            "trust_remote_code": False,
        }
        try:
            tokenizer = load_tokenizer(source)
            model: Any = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **common)
        except (OSError, ValueError) as exc:
            raise InputError(f"model {spec}: cannot be loaded: {first_line(exc)}") from None
        if tokenizer.eos_token_id is None:
            raise InputError(f"model {spec}: its tokenizer has no EOS token")
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        tokenizer.padding_side = "left"
        model.to(where).eval()
        return cls(spec, model, tokenizer, where)

    def encode(self, text: str, *, add_special_tokens: bool | None = None) -> list[int]:
        """``text``'s tokens as lm-eval's ``tok_encode`` makes them (module docstring)."""
        kwargs: dict[str, bool] = {}
        if add_special_tokens is not None:
            kwargs["add_special_tokens"] = add_special_tokens
        elif text.startswith(self._prefix_text):
            kwargs["add_special_tokens"] = False
        return list(self.tokenizer.encode(text, **kwargs))

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        """Tokens back to text (special tokens dropped, as lm-eval's ``tok_decode``)."""
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def render(self, prompt: str, *, chat: bool, system: str | None = None) -> str:
        """The text fed to the model (:meth:`evalq.shared.lm.template.ChatTemplate.render`:
        the one rendering the views show, too)."""
        return self.template.render(prompt, chat=chat, system=system)

    def generate(
        self, requests: Sequence[GenerationRequest], runs: Sequence[str] | None = None
    ) -> list[Generation]:
        """Continue every prompt; batches of ``batch_size`` prompts of similar token length,
        results in the order given (``runs`` are not needed: a local model meters nothing)."""
        prompts = [self._prompt_ids(r) for r in requests]
        results: list[Generation | None] = [None] * len(prompts)
        for chunk in self._buckets(requests, prompts):
            made = self._generate_batch([requests[i] for i in chunk], [prompts[i] for i in chunk])
            for i, generation in zip(chunk, made, strict=True):
                results[i] = generation
        return [g for g in results if g is not None]

    def _buckets(
        self, requests: Sequence[GenerationRequest], prompts: list[list[int]]
    ) -> list[list[int]]:
        """Indices in batches: longest prompts first (lm-eval's order), at most ``batch_size``
        each, and never wider than ``max_length`` once the batch's longest ``max_new_tokens``
        is added (every prompt fits alone: :meth:`_prompt_ids` truncated it for its own)."""
        order = sorted(range(len(prompts)), key=lambda i: (-len(prompts[i]), i))
        chunks: list[list[int]] = []
        width = new = 0
        for i in order:
            grown = max(new, requests[i].max_new_tokens)
            fits = chunks and len(chunks[-1]) < self.spec.args.batch_size
            if fits and width + grown <= self.max_length:
                chunks[-1].append(i)
                new = grown
            else:
                chunks.append([i])
                width, new = len(prompts[i]), requests[i].max_new_tokens
        return chunks

    def _prompt_ids(self, request: GenerationRequest) -> list[int]:
        room = self.max_length - request.max_new_tokens
        if room <= 0:
            raise InputError(
                f"max_new_tokens {request.max_new_tokens} leaves no room for a prompt in the "
                f"model's max_length {self.max_length}"
            )
        if not isinstance(request.prompt, str):
            raise InputError(f"model {self.spec}: a local model reads text, not chat messages")
        bos = self.tokenizer.bos_token
        kwargs = {"add_special_tokens": False} if bos and request.prompt.startswith(bos) else {}
        ids = list(self.tokenizer(request.prompt, **kwargs)["input_ids"])
        return ids[-room:]

    def _generate_batch(
        self, requests: list[GenerationRequest], prompts: list[list[int]]
    ) -> list[Generation]:
        width = max(map(len, prompts))
        pad = int(self.tokenizer.pad_token_id)
        ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, prompt in enumerate(prompts):
            ids[i, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            mask[i, width - len(prompt) :] = 1
        stops = _RowStops(self.tokenizer, requests, prompt_width=width, eos_ids=self.eos_ids)
        sampled = any(r.temperature > 0 for r in requests)
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=ids.to(self.device),
                attention_mask=mask.to(self.device),
                max_new_tokens=max(r.max_new_tokens for r in requests),
                do_sample=False,
                num_beams=1,
                pad_token_id=pad,
                eos_token_id=list(self.eos_ids),
                logits_processor=LogitsProcessorList([_RowSampler(requests)] if sampled else []),
                stopping_criteria=StoppingCriteriaList([stops]),
            )
        generated = out[:, width:].tolist()
        results = []
        for row, (request, prompt) in enumerate(zip(requests, prompts, strict=True)):
            made = stops.made[row]
            count = min(request.max_new_tokens, len(generated[row])) if made is None else made
            text = cut_at_stop(self.decode(generated[row][:count]), [*request.stop, self._eos_text])
            results.append(Generation(text, prompt_tokens=len(prompt), completion_tokens=count))
        return results

    def loglikelihood(self, requests: Sequence[ChoiceRequest]) -> list[ChoiceScore]:
        """Score every continuation given its context, as lm-eval's ``loglikelihood`` does."""
        pairs = [self._encode_pair(r.context, r.continuation) for r in requests]
        # lm-eval's order: longest first, so a batch's first row sets its padded width
        order = sorted(range(len(pairs)), key=lambda i: (-sum(map(len, pairs[i])), i))
        scores: list[ChoiceScore | None] = [None] * len(pairs)
        size = self.spec.args.batch_size
        for start in range(0, len(order), size):
            chunk = order[start : start + size]
            for i, score in zip(chunk, self._score_batch([pairs[i] for i in chunk]), strict=True):
                scores[i] = score
        return [s for s in scores if s is not None]

    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        if context == "":
            cont = self.encode(continuation, add_special_tokens=False)
            if not cont:
                raise InputError("an empty continuation has no likelihood to score")
            if cont[0] == self.prefix_token_id:
                return cont[:1], cont[1:]
            return [self.prefix_token_id], cont
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        whole = self.encode(context + continuation)
        context_enc = self.encode(context)
        return context_enc, whole[len(context_enc) :]

    def _score_batch(self, pairs: list[tuple[list[int], list[int]]]) -> list[ChoiceScore]:
        rows: list[list[int]] = []
        for context, cont in pairs:
            if not cont:
                raise InputError("a continuation encodes to no tokens: nothing to score")
            if len(cont) > self.max_length:
                raise InputError(
                    f"a continuation of {len(cont)} tokens exceeds the model's "
                    f"max_length {self.max_length}"
                )
            rows.append((context + cont)[-(self.max_length + 1) :][:-1])
        width = max(map(len, rows))
        batch = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            batch[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        with torch.inference_mode():
            logits = self.model(batch.to(self.device)).logits
            logprobs = torch.log_softmax(logits, dim=-1)
        scores = []
        for i, (row, (_, cont)) in enumerate(zip(rows, pairs, strict=True)):
            window = logprobs[i, len(row) - len(cont) : len(row)]
            target = torch.tensor(cont, dtype=torch.long, device=window.device)
            greedy = bool((window.argmax(dim=-1) == target).all())
            total = float(window.gather(1, target.unsqueeze(-1)).sum())
            scores.append(ChoiceScore(logprob=total, is_greedy=greedy, tokens=len(cont)))
        return scores


def load(spec: ModelSpec, device: str, services: Services | None, cache: bool) -> HFModel:
    """The ``hf`` provider's loader (:mod:`evalq.shared.lm.providers`): nothing but the device
    is needed, and a local model answers from no cache."""
    return HFModel.load(spec, device)


def _resolve_max_length(config: Any, tokenizer: PreTrainedTokenizerBase) -> int:
    cfg = getattr(config, "text_config", None) or config
    for attr in _SEQLEN_ATTRS:
        value = getattr(cfg, attr, None)
        if value is not None:
            return int(value)
    limit = getattr(tokenizer, "model_max_length", None)
    if limit is not None and limit != _TOKENIZER_INFINITY:
        return int(limit)
    return DEFAULT_MAX_LENGTH


class _RowSampler(LogitsProcessor):
    """Samples each row with its own generator and masks every other token, so that greedy
    decoding then picks the sampled token: a row's draws depend only on its seed and its own
    logits, never on the rows sharing its batch (HF's sampler draws one batch-wide tensor
    from the global generator). Greedy rows (temperature 0) pass through untouched.

    The uniform draws come from CPU generators, so a seed gives the same draws on any device.
    """

    def __init__(self, requests: Sequence[GenerationRequest]) -> None:
        self.requests = list(requests)
        self.generators = [
            torch.Generator().manual_seed(r.seed) if r.temperature > 0 else None
            for r in self.requests
        ]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        out = scores.clone()
        for row, (request, generator) in enumerate(
            zip(self.requests, self.generators, strict=True)
        ):
            if generator is None:
                continue
            probs = torch.softmax(scores[row].float() / request.temperature, dim=-1)
            if request.top_p < 1:
                sorted_probs, order = probs.sort(descending=True)
                # keep the fewest most likely tokens whose mass reaches top_p (at least one)
                drop = sorted_probs.cumsum(-1) - sorted_probs >= request.top_p
                probs = probs.scatter(0, order[drop], 0.0)
            cdf = probs.cumsum(-1)
            draw = float(torch.rand((), generator=generator)) * float(cdf[-1])
            token = min(
                int(torch.searchsorted(cdf, torch.tensor([draw], device=cdf.device), right=True)),
                cdf.shape[0] - 1,
            )
            out[row] = float("-inf")
            out[row, token] = 0.0
        return out  # type: ignore[return-value]


class _RowStops(StoppingCriteria):
    """Ends each row on its own: at an EOS token, at its own ``max_new_tokens``, or when one of
    its stop strings appears in its decoded text; remembers how many tokens each row made."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        requests: Sequence[GenerationRequest],
        *,
        prompt_width: int,
        eos_ids: tuple[int, ...],
    ) -> None:
        self.tokenizer = tokenizer
        self.requests = list(requests)
        self.prompt_width = prompt_width
        self.eos_ids = frozenset(eos_ids)
        self.made: list[int | None] = [None] * len(self.requests)

    def __call__(
        self, input_ids: torch.LongTensor, scores: torch.FloatTensor | None, **kwargs: Any
    ) -> torch.BoolTensor:
        made = input_ids.shape[1] - self.prompt_width
        for row, request in enumerate(self.requests):
            if self.made[row] is not None:
                continue
            generated = input_ids[row, self.prompt_width :]
            if int(generated[-1]) in self.eos_ids or made >= request.max_new_tokens:
                self.made[row] = made
            elif request.stop:
                text = str(self.tokenizer.decode(generated.tolist(), skip_special_tokens=True))
                if any(s and s in text for s in request.stop):
                    self.made[row] = made
        done = [m is not None for m in self.made]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)  # type: ignore[return-value]
