"""Simulator caches: the cluster's profile per cluster object (``IdentityCache``: echo_tune/identity_cache.py)."""

from __future__ import annotations

import os

from echo_tune.cost.profile import profile_for
from echo_tune.identity_cache import IdentityCache

_PROFILES = IdentityCache(limit=64)


def profile_for_cluster(cluster):
    """``profile_for(cluster)``, cached per cluster object (and per profile file version, if it names one)."""
    stamp = ()
    if cluster.profile is not None:
        try:
            st = os.stat(cluster.profile)
            stamp = (str(cluster.profile), st.st_mtime_ns, st.st_size)
        except OSError:
            return profile_for(cluster)  # let the loader report the missing file
    return _PROFILES.get((cluster,), stamp, lambda: profile_for(cluster))
