"""A small least-recently-used map with an eviction hook, for per-process caches."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["LRU"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LRU(Generic[K, V]):
    """Keeps at most ``capacity`` values; the least recently used goes first."""

    def __init__(self, capacity: int, on_evict: Callable[[K, V], None] | None = None) -> None:
        self.capacity = capacity
        self._items: OrderedDict[K, V] = OrderedDict()
        self._on_evict = on_evict

    def get_or_create(self, key: K, create: Callable[[], V]) -> V:
        """The cached value for ``key``; on a miss, evict down to ``capacity - 1`` values
        first, then create, so the evicted and the new value are never held together."""
        if key in self._items:
            self._items.move_to_end(key)
            return self._items[key]
        self._evict_down_to(self.capacity - 1)
        value = create()
        self._items[key] = value
        return value

    def _evict_down_to(self, size: int) -> None:
        while len(self._items) > size:
            old_key, old_value = self._items.popitem(last=False)
            if self._on_evict is not None:
                self._on_evict(old_key, old_value)

    def clear(self) -> None:
        """Evict everything."""
        self._evict_down_to(0)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items
