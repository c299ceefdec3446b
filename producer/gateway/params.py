"""The parameter types the gateway's routers share: run ids, names and the admin flag."""

from typing import Annotated

from fastapi import Path, Query
from pydantic import StringConstraints

from evalq.shared.names import RUN_ID

__all__ = ["AdminQuery", "NameArg", "RunId", "RunIdText"]

RunId = Annotated[str, Path(pattern=RUN_ID, description="A run id.")]
"""A run named in the path."""
RunIdText = Annotated[str, StringConstraints(pattern=RUN_ID)]
"""A run named in a body or a repeated query parameter."""
AdminQuery = Annotated[
    bool, Query(description="Bypass tier and budget (admin role; recorded in the audit stream).")
]
NameArg = Annotated[str, Path(max_length=64, description="A dataset, split or principal name.")]
