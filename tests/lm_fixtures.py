"""A tiny, randomly initialised causal LM with a byte-level BPE tokenizer, built offline.

Tests of the LM runtime need a real transformers model and tokenizer but no download: this
writes both into a folder that ``ModelSpec.parse(f"hf/{path}")`` loads like any local model.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

__all__ = ["BOS", "CHAT_TEMPLATE", "EOS", "tiny_model"]

EOS = "<|endoftext|>"
BOS = "<s>"
CHAT_TEMPLATE = (
    "{{ bos_token if add_bos else '' }}"
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
_CORPUS = [
    "The quick brown fox jumps over the lazy dog. ",
    "Question: what is two plus two? Answer: four.\n",
    "Paris is the capital of France; Berlin is the capital of Germany.\n",
    "def add(a, b):\n    return a + b\n",
    "one two three four five six seven eight nine ten\n",
    "café naïve résumé — «quotes» and 数字 too.\n",
]


def _tokenizer(*, add_bos: bool) -> PreTrainedTokenizerFast:
    """A byte-level BPE (GPT-2's scheme) of about 400 tokens learnt from ``_CORPUS``; with
    ``add_bos`` it puts ``<s>`` before every text, as Llama's does (GPT-2's adds nothing)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=[EOS, BOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    if add_bos:
        bos_id = tok.token_to_id(BOS)
        tok.post_processor = processors.Sequence(
            [
                processors.ByteLevel(trim_offsets=False),
                processors.TemplateProcessing(
                    single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, bos_id)]
                ),
            ]
        )
    wrapped = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok, bos_token=BOS if add_bos else EOS, eos_token=EOS
    )
    wrapped.chat_template = CHAT_TEMPLATE.replace("add_bos", "true" if add_bos else "false")
    return wrapped


def tiny_model(path: Path, *, seed: int = 0, n_positions: int = 128, add_bos: bool = False) -> Path:
    """Write a seeded 2-layer GPT-2 and its tokenizer (with a chat template) into ``path``;
    ``add_bos``: a tokenizer that starts every encoding with ``<s>`` (and so does its chat
    template), to exercise lm-eval's rules for BOS-adding tokenizers.

    The weights are drawn with a large ``initializer_range`` so next-token distributions are
    peaked: greedy choices then never hinge on float noise between batched and single runs.
    """
    tokenizer = _tokenizer(add_bos=add_bos)
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=n_positions,
        n_layer=2,
        n_head=2,
        n_embd=32,
        initializer_range=0.3,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
