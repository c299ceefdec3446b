"""Names a package exports without importing them until they are read (PEP 562): ``evalq``,
``evalq.shared`` and ``evalq.worker`` export so, and importing any ``evalq.*`` module imports
those packages first, so that ``evalq --help`` and a read through the gateway load neither
numpy nor Celery."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, where: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__``: each name of ``where`` imported from the
    module it names the first time it is read, then kept in the package."""

    def getattr_(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name]), name)
        setattr(importlib.import_module(package), name, value)
        return value

    def dir_() -> list[str]:
        return sorted({*vars(importlib.import_module(package)), *where})

    return getattr_, dir_
