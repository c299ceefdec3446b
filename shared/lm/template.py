"""What a language model reads for a rendered prompt, one implementation for the worker that
sends it and the views that show it (the viewer's sample page, the API's sample JSON, the run
report): torch-free at import, transformers imported only where a tokenizer is loaded.

- Without ``chat``: the text itself (after the system prompt and a blank line).
- ``chat`` on an endpoint (``openai/``): the messages (:func:`chat_messages`), sent as they are;
  the server applies its model's template, so the messages are all it saw
  (:class:`Messages`).
- ``chat`` on an ``hf/`` model: those messages through the tokenizer's chat template,
  ``apply_chat_template(messages, tokenize=False, add_generation_prompt=True)``
  (:class:`ChatTemplate`): the text the model's input ids are encoded from, with whatever
  the template adds (SmolLM2-Instruct's ``<|im_start|>`` markers, and its default system
  prompt when the task sets none).

Why a view renders the prompt again rather than reading what the worker recorded: the prompt is
a pure function of the run's record (the task, the few-shot examples drawn at submission, the
model) and the sample's label-scrubbed row, through this module, so what a view renders is what
the worker rendered, byte for byte, given the same tokenizer files (a local folder's or a Hub
snapshot's, which the run names). Recording it would store, for every sample, the row's input
and all few-shot examples again (a k-shot prompt is k rows more than the row), in the results
that every result read carries (exports, archives, JSON lines, tables), none of which holds a
row's input today: each would then need the per-sample disclosure rules the row has, and the
bytes would count against ``EVALQ_MAX_OUTPUT_BYTES`` (a long few-shot prompt cut to fit is no
longer the exact prompt). Rendered on view, a prompt is shown exactly where the row is (a
reader with per-sample access who asked for inputs), and built from the scrubbed row. The cost
is the tokenizer on the viewing machine: loaded once per process (:func:`local_template`), never
fetched; where it is absent (a model folder only the workers have), the view shows the messages
the template is applied to, as it did before.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Protocol

from evalq.shared.errors import InputError, first_line
from evalq.shared.lm.request import Message, Prompt
from evalq.shared.lm.spec import ModelSpec, is_local, present

__all__ = [
    "ChatTemplate",
    "Messages",
    "Renderer",
    "chat_messages",
    "load_tokenizer",
    "local_template",
    "plain_text",
]

_TEMPLATES = 8
"""Models whose tokenizer a viewing process keeps (oldest dropped first)."""
_templates: dict[str, ChatTemplate] = {}
_lock = threading.Lock()


class Renderer(Protocol):
    """What turns a task's prompt text into what its model reads."""

    def render(self, prompt: str, *, chat: bool, system: str | None = None) -> Prompt: ...


def plain_text(prompt: str, system: str | None = None) -> str:
    """``prompt`` as it is, after ``system`` and a blank line (lm-eval's description
    delimiter) when set."""
    return prompt if system is None else f"{system}\n\n{prompt}"


def chat_messages(prompt: str, system: str | None = None) -> tuple[Message, ...]:
    """The chat messages for ``prompt``: the system prompt when set, then one user message
    (lm-eval's default: few-shot examples in that message, not as turns)."""
    messages: tuple[Message, ...] = (("user", prompt),)
    return (("system", system), *messages) if system is not None else messages


class Messages:
    """An endpoint model's rendering: text for ``/completions``, messages for
    ``/chat/completions`` (the server applies its template)."""

    def render(self, prompt: str, *, chat: bool, system: str | None = None) -> Prompt:
        return chat_messages(prompt, system) if chat else plain_text(prompt, system)


class ChatTemplate:
    """A local model's rendering with its tokenizer (its chat template for ``chat``)."""

    def __init__(self, spec: ModelSpec, tokenizer: Any) -> None:
        self.spec = spec
        self.tokenizer = tokenizer

    def render(self, prompt: str, *, chat: bool, system: str | None = None) -> str:
        """The text fed to the model: ``prompt`` itself (:func:`plain_text`), or with
        ``chat`` the tokenizer's chat template over :func:`chat_messages`."""
        if not chat:
            return plain_text(prompt, system)
        if not getattr(self.tokenizer, "chat_template", None):
            raise InputError(f"model {self.spec}: chat was asked but its tokenizer has no template")
        from jinja2.exceptions import TemplateError

        messages = [{"role": r, "content": c} for r, c in chat_messages(prompt, system)]
        try:
            text = self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )
        except TemplateError as exc:
            raise InputError(
                f"model {self.spec}: its chat template failed: {first_line(exc)}"
            ) from None
        return str(text)


def load_tokenizer(source: str | Path) -> Any:
    """The tokenizer in model folder ``source``, as a worker loads it (never with
    ``trust_remote_code``, never fetched)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(
        str(source), local_files_only=True, trust_remote_code=False
    )


def local_template(spec: ModelSpec) -> ChatTemplate | None:
    """``spec``'s :class:`ChatTemplate` from the model's files on this machine (a local
    folder, or a Hub model's snapshot already in the Hugging Face cache; nothing is
    downloaded), loaded once per process; None when they are not here or cannot be read."""
    key = str(spec)
    with _lock:
        if key in _templates:
            return _templates[key]
    found = _load_template(spec)
    if found is not None:  # an absent one is looked for again: its files may come later
        with _lock:
            if len(_templates) >= _TEMPLATES:
                del _templates[next(iter(_templates))]
            _templates[key] = found
    return found


def _load_template(spec: ModelSpec) -> ChatTemplate | None:
    if spec.endpoint is not None:  # the server applies its own
        return None
    try:
        if is_local(spec):
            source = Path(present(spec).name)
        else:
            from huggingface_hub import snapshot_download

            source = Path(
                str(snapshot_download(spec.name, revision=spec.revision, local_files_only=True))
            )
        return ChatTemplate(spec, load_tokenizer(source))
    except Exception:  # not on this machine, unreadable, transformers missing: no template here
        return None
