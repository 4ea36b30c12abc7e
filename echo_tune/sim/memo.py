"""Caches keyed by object identity, for inputs that are immutable but not hashable (profiles, traces).

Each entry keeps a reference to its key objects, so an id is never reused while its entry lives; the
whole cache is dropped when it grows past ``limit`` entries.
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


_PROFILES = IdentityCache(limit=64)


def profile_for_cluster(cluster):
    """``profile_for(cluster)``, cached per cluster object (and per profile file version, if it names one)."""
    import os

    from echo_tune.cost.profile import profile_for

    stamp = ()
    if cluster.profile is not None:
        try:
            st = os.stat(cluster.profile)
            stamp = (str(cluster.profile), st.st_mtime_ns, st.st_size)
        except OSError:
            return profile_for(cluster)  # let the loader report the missing file
    return _PROFILES.get((cluster,), stamp, lambda: profile_for(cluster))
