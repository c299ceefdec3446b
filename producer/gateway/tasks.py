"""The gateway's registered language tasks: list them, register one."""

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from evalq.producer.gateway.acting import Act
from evalq.shared.access.task import RegisteredTask

__all__ = ["router"]

router = APIRouter(tags=["tasks"])


class TaskAdd(BaseModel):
    """``POST /v1/tasks``: a task file's text, under a name."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=128)
    text: str = Field(min_length=1, max_length=65536)
    dataset: str | None = Field(None, max_length=64)
    """With ``split``: a registered split the task is checked against before it is stored."""
    split: str | None = Field(None, max_length=64)


@router.get("/v1/tasks", response_model=list[RegisteredTask])
def tasks(act: Act) -> list[RegisteredTask]:
    """Every registered language task (what a caller can name in ``submit``)."""
    return act.client().tasks()


@router.post("/v1/tasks", response_model=RegisteredTask)
def add_task(body: TaskAdd, act: Act) -> RegisteredTask:
    """Register (or replace) a language task (admin)."""
    client = act.admin("tasks add")
    return client.add_task(body.name, body.text, dataset=body.dataset, split=body.split)
