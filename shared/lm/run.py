"""What a language-model run carries in its record: the task as registered when it was
submitted, the model spec, and the few-shot examples drawn for it.

The producer fixes all three at submission (:func:`evalq.shared.evals.language.prepare`), so a
worker needs nothing but the run's record, a task replaced later changes no running run, and the
examples (rows of a split the caller may view, labels included: they are shown with their
answers) are the same for every sample wherever it runs.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict

from evalq.shared.lm.request import Prompt
from evalq.shared.lm.spec import ModelSpec
from evalq.shared.lm.task import TaskSpec
from evalq.shared.lm.template import Messages, Renderer, local_template

__all__ = ["Example", "LanguageRun"]


class Example(BaseModel):
    """One few-shot example: its row index in its split and the full row."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    row_id: int
    row: dict[str, Any]


class LanguageRun(BaseModel):
    """A registered task run on a model, as the run's record keeps it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    task: TaskSpec
    model: ModelSpec
    examples: tuple[Example, ...] = ()
    """``fewshot.n`` examples, one more when they come from the evaluated split itself (a
    sample never sees its own row as an example)."""
    same_split: bool = False
    """The examples come from the evaluated split (a viewable one)."""
    cache: bool = False
    """``submit --cache``: an endpoint model's answers come from, and go to, the fleet's
    response cache."""

    def model_key(self) -> str:
        """The warm model this run needs: its spec and arguments (runs of any task share it),
        and whether it answers from the cache."""
        cached = ":cached" if self.cache else ""
        return f"model:{self.model}:{json.dumps(self.model.arg_items(), sort_keys=True)}{cached}"

    def examples_for(self, sample_id: int) -> list[dict[str, Any]]:
        """The few-shot rows shown before sample ``sample_id``'s prompt."""
        n = self.task.fewshot.n if self.task.fewshot is not None else 0
        rows = [e.row for e in self.examples if not (self.same_split and e.row_id == sample_id)]
        return rows[:n]

    def prompt(self, row: dict[str, Any], sample_id: int, model: Renderer) -> Prompt:
        """What ``model`` reads for sample ``sample_id`` (its ``row``, label-free): the
        prompt text with its few-shot examples, or for a ``chat`` task that text as
        ``model`` renders it (:mod:`evalq.shared.lm.template`). The worker sends this and
        the views show it (:meth:`shown_prompt`)."""
        task = self.task
        examples = self.examples_for(sample_id)
        if task.chat:
            return model.render(task.render(row, examples), chat=True, system=task.system)
        return task.text(row, examples)

    def shown_prompt(self, row: dict[str, Any], sample_id: int) -> str | list[dict[str, str]]:
        """What the model read for sample ``sample_id`` (its full ``row``, scrubbed here),
        rendered as the worker rendered it (:meth:`prompt`; why it is rendered again, not
        recorded: :mod:`evalq.shared.lm.template`): the prompt text with its few-shot
        examples; for a ``chat`` task on an ``hf/`` model, the text its tokenizer's chat
        template made of them, and on an endpoint the messages as sent (``role`` and
        ``content``, the request body's). An ``hf/`` model whose tokenizer is not on this
        machine shows the messages its template was applied to."""
        hidden = set(self.task.label_fields)
        scrubbed = {k: v for k, v in row.items() if k not in hidden}
        renderer: Renderer = Messages()
        if self.task.chat and self.model.endpoint is None:
            renderer = local_template(self.model) or renderer
        shown = self.prompt(scrubbed, sample_id, renderer)
        if isinstance(shown, str):
            return shown
        return [{"role": role, "content": content} for role, content in shown]
