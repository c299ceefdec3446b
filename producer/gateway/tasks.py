"""The gateway's registered language tasks: list them, register one."""

from typing import Self

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field, model_validator

from evalq.producer.gateway.acting import Act
from evalq.shared.access.task import RegisteredTask

__all__ = ["router"]

router = APIRouter(tags=["tasks"])


class TaskAdd(BaseModel):
    """``POST /v1/tasks``: a task file's text, or an lm-eval task's name, under a name."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=128)
    text: str | None = Field(None, min_length=1, max_length=65536)
    dataset: str | None = Field(None, max_length=64)
    """With ``split``: a registered split the task is checked against before it is stored."""
    split: str | None = Field(None, max_length=64)
    lm_eval: str | None = Field(None, min_length=1, max_length=256)
    """An lm-eval task's name (``evalq tasks add NAME --lm-eval TASK``), instead of ``text``."""
    include_path: str | None = Field(None, min_length=1, max_length=4096)
    """With ``lm_eval``: a folder of lm-eval YAML on the gateway's machine, searched first."""

    @model_validator(mode="after")
    def _one_kind(self) -> Self:
        if (self.text is None) == (self.lm_eval is None):
            raise ValueError("give a task file's text or an lm-eval task, not both or neither")
        if self.lm_eval is None and self.include_path is not None:
            raise ValueError("an include path is for an lm-eval task")
        if self.lm_eval is not None and (self.dataset or self.split):
            raise ValueError("an lm-eval task is checked against its split at submit")
        return self


@router.get("/v1/tasks", response_model=list[RegisteredTask])
def tasks(act: Act) -> list[RegisteredTask]:
    """Every registered language task (what a caller can name in ``submit``)."""
    return act.client().tasks()


@router.post("/v1/tasks", response_model=RegisteredTask)
def add_task(body: TaskAdd, act: Act) -> RegisteredTask:
    """Register (or replace) a language task or an lm-eval task (admin)."""
    client = act.admin("tasks add")
    if body.lm_eval is not None:
        return client.add_lm_eval_task(body.name, body.lm_eval, include_path=body.include_path)
    assert body.text is not None  # one of the two: TaskAdd._one_kind
    return client.add_task(body.name, body.text, dataset=body.dataset, split=body.split)
