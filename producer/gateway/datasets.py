"""The gateway's registered datasets: list them, register one."""

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from evalq.producer.gateway.acting import Act
from evalq.shared.access.dataset import RegisteredDataset
from evalq.shared.access.roles import sees_sources

__all__ = ["router"]

router = APIRouter(tags=["datasets"])


class DatasetAdd(BaseModel):
    """``POST /v1/datasets``."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=64)
    data: str = Field(min_length=1, max_length=4096)
    revision: str | None = Field(default=None, max_length=200)
    config: str | None = Field(default=None, max_length=200)


@router.get("/v1/datasets", response_model=list[RegisteredDataset])
def datasets(act: Act) -> list[RegisteredDataset]:
    """Every registered dataset and its pinned splits (a user: names and splits only)."""
    found = act.client().datasets()
    return found if sees_sources(act.who) else [record.outline() for record in found]


@router.post("/v1/datasets", response_model=RegisteredDataset)
def add_dataset(body: DatasetAdd, act: Act) -> RegisteredDataset:
    """Register (or re-pin) a dataset (admin)."""
    acting = act.admin("datasets add")
    return acting.add_dataset(body.name, body.data, revision=body.revision, config=body.config)
