"""The label fields that protect every split: each one that a registered language task (its
``target`` and ``labels``) or an evaluation this process loaded declares.

Label fields belong to a split's rows, not to the task that names them: with ``solve`` (target
``answer``) and ``rate`` (a prompt that shows ``{answer}``) both registered, scrubbing only the
running task's own label fields let ``rate`` send a held-out split's answers to a caller's
endpoint (issue #50: 100 of 100). A task is not bound to a dataset and any caller may run any
task on any split, so the set is the same for every split, and it is read from the registry
each time, not recorded as tasks run (a record made as tasks run would protect nothing until
the task that names the label had run there). The gateway refuses a task whose prompt or
choices name one of them (:func:`evalq.shared.access.policy.admit_prompt`); workers read the
same set themselves, never from a message, and scrub all of it before inference.

The registry (``evalq:tasks``) is written by the gateway alone (``TaskRegistry`` in
:mod:`evalq.shared.access.tasks`); workers may read it (their ACL user's ``%R~``). Each record
is read for its ``target`` and ``labels`` only (an lm-eval task's record for its ``labels``:
the fields its ``doc_to_target`` reads), so a record a newer gateway wrote with keys this
process does not know still counts; a record without a readable ``target`` raises: a label
set that may be missing a field is not one to scrub by.
"""

from __future__ import annotations

import json
from functools import lru_cache

import redis
from pydantic import BaseModel, ConfigDict, ValidationError

from evalq.shared.errors import PermanentError
from evalq.shared.evaluation import every_label_field
from evalq.shared.keys import TASKS

__all__ = ["LabelFields"]


class _Labelled(BaseModel):
    """What a registered task's record says of its label fields."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    target: str
    labels: tuple[str, ...] = ()


class LabelFields:
    """The label fields of every registered task and loaded evaluation."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client

    def all(self) -> frozenset[str]:
        """Every label field, read now (one ``HGETALL`` of the task registry);
        :class:`PermanentError` when a task's record cannot be read for its labels."""
        records = self._client.hgetall(TASKS)
        tasks = (field for name in sorted(records) for field in _fields(name, records[name]))
        return every_label_field() | frozenset(tasks)


@lru_cache(maxsize=1024)
def _fields(name: str, record: str) -> tuple[str, ...]:
    try:
        found = json.loads(record)["spec"]
        if isinstance(found, dict) and "lm_eval" in found:  # an lm-eval task: what it targets
            return tuple(str(field) for field in found["labels"])
        spec = _Labelled.model_validate(found)
    except (ValueError, TypeError, KeyError, ValidationError):
        raise PermanentError(
            f"task {name!r}'s record in the registry names no readable target: its label "
            "fields are unknown, so no row is scrubbed by a partial set"
        ) from None
    return (spec.target, *spec.labels)
