"""lm-evaluation-harness tasks as evalq records them: the task as registered (its resolved
config and every file it was made of, each pinned by sha256), a run of it (the model, the
evaluated and few-shot splits), and the requests built for each document.

Nothing here imports lm-eval (:mod:`evalq.shared.lm.lmeval` does, lazily): a gateway reads and
lists these records without it.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from evalq.shared.lm.spec import ModelSpec

__all__ = [
    "INSTALL",
    "LM_EVAL_VERSION",
    "HarnessRequest",
    "HarnessRun",
    "HarnessSpec",
    "PinnedFile",
    "is_harness_run",
    "metric_name",
]

LM_EVAL_VERSION = "0.4.13"
"""The lm-eval release whose code builds the requests and scores them (the ``lm-eval`` extra
pins it): a task registered under another is refused where it is loaded."""
INSTALL = "pip install 'evalq[lm-eval]'"


def metric_name(metric: str, filter_name: str) -> str:
    """A metric as evalq names it: lm-eval's ``metric,filter`` key, the bare metric for the
    ``none`` filter (``acc``, ``acc_norm``, ``exact_match,strict-match``)."""
    return metric if filter_name == "none" else f"{metric},{filter_name}"


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PinnedFile(_Model):
    """A file a registered lm-eval task is made of (a YAML file, one it includes, a
    ``!function`` module), by where it lives and its sha256 at registration."""

    root: Literal["lm_eval", "include"]
    """``lm_eval``: under the installed lm-eval package (wherever it is installed on the
    machine that loads it); ``include``: under the task's include folder."""
    path: str
    """Relative to its root, ``/``-separated."""
    sha256: str


class HarnessSpec(_Model):
    """A registered lm-eval task (``evalq tasks add NAME --lm-eval TASK``)."""

    lm_eval: str
    """The task's name in lm-eval (``gsm8k``, ``arc_easy``, or one of the include folder's)."""
    version: str = LM_EVAL_VERSION
    include_path: str | None = None
    """The include folder it was resolved from (absolute), when one was given."""
    files: tuple[PinnedFile, ...] = Field(min_length=1)
    """The task's YAML file first, then the files it includes and its ``!function`` modules."""
    config: dict[str, Any]
    """The task's config as its YAML files say it (includes merged, ``!function`` values as
    ``!function module.name``): what ``tasks list`` shows."""
    output_type: str
    labels: tuple[str, ...] = ()
    """The document fields its ``doc_to_target`` reads (a column, or a Jinja template's
    variables): label fields like a YAML task's ``target``, scrubbed from every split's rows
    before any inference (:mod:`evalq.shared.store.labels`)."""
    metrics: tuple[str, ...]
    """Its metrics as evalq names them (:func:`metric_name`), one per metric and filter."""
    num_fewshot: int | None = None
    """Its config's few-shot count (a submit's ``--num-fewshot`` overrides it)."""
    fewshot_split: str | None = None
    """The split its few-shot examples come from, by lm-eval's rule (``fewshot_config.split``,
    ``fewshot_split``, ``training_split``, ``validation_split``, else ``test_split``); None when
    its config lists the examples itself."""

    @property
    def digest(self) -> str:
        """sha256 of the record's canonical JSON: what provenance names the task by."""
        text = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


class HarnessRequest(_Model):
    """One request lm-eval built for a document: its arguments only (a context and a
    continuation, a context and generation arguments, a text), never the document."""

    request_type: Literal["loglikelihood", "loglikelihood_rolling", "generate_until"]
    arguments: list[Any]
    idx: int
    """Its position among the document's requests (lm-eval's ``Instance.idx``)."""
    repeats: int = 1


class HarnessRun(_Model):
    """A registered lm-eval task run on a model, as the run's record keeps it (its
    ``harness`` key first: :func:`is_harness_run`)."""

    harness: HarnessSpec
    model: ModelSpec
    num_fewshot: int = Field(ge=0)
    split: str
    """The evaluated split (lm-eval's ``test_split``)."""
    fewshot_split: str | None = None
    """The split of the same dataset its few-shot examples were drawn from (a viewable one,
    never the evaluated split); None for a run without examples drawn from data."""
    requests_digest: str = ""
    """sha256 of every document's requests as they were stored at submission."""
    cache: bool = False
    """``submit --cache``: an endpoint model's answers come from, and go to, the fleet's
    response cache (as a YAML task's run's do)."""

    def model_key(self) -> str:
        """The warm model this run needs: lm-eval's ``HFLM`` around the spec's model, or the
        endpoint model and its tokenizer (runs of any lm-eval task on that model share it),
        and whether it answers from the cache."""
        cached = ":cached" if self.cache else ""
        args = json.dumps(self.model.arg_items(), sort_keys=True)
        return f"lm-eval:{self.model}:{args}{cached}"


def is_harness_run(task: str | None) -> bool:
    """Whether a run record's ``task`` JSON is a :class:`HarnessRun` (its first key)."""
    return task is not None and task.startswith('{"harness":')
