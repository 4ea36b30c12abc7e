"""Caches keyed by object identity, for inputs that are immutable but not hashable (profiles, traces).

Each entry keeps a reference to its key objects, so an id is never reused while its entry lives; the
whole cache is dropped when it grows past ``limit`` entries. With no objects (``get((), key, ...)``) it is a
bounded cache keyed by hashable values alone. Below every package (``cost`` and ``sim`` use it).
"""

from __future__ import annotations

from typing import Any


class IdentityCache:
    def __init__(self, limit: int = 4096):
        self.limit = limit
        self._entries: dict[tuple, tuple[tuple, Any]] = {}

    def get(self, objects: tuple, extra: tuple, compute) -> Any:
        """The value for (the identities of ``objects``, ``extra``), computed by ``compute()`` once."""
        key = (*map(id, objects), *extra)
        entry = self._entries.get(key)
        if entry is not None:
            return entry[1]
        if len(self._entries) >= self.limit:
            self._entries.clear()
        value = compute()
        self._entries[key] = (objects, value)
        return value

    def clear(self) -> None:
        self._entries.clear()
