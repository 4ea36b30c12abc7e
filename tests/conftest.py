"""Shared fixtures."""

import pytest


@pytest.fixture
def gpu_time_only(monkeypatch):
    """Profiles that state no host time per kernel use none (not the shipped one, cost/host/host_time.py): for tests of
    GPU-time mechanics on models so small that, at the shipped host time per kernel (38 us), the host would set their pace."""
    import echo_tune.cost.profile as profile_module

    monkeypatch.setattr(profile_module, "default_host_time_s", lambda: 0.0)
