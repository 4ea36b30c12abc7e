"""Shared paths and fitted profiles of the calibrate tests (fits run once per session)."""

from __future__ import annotations

from pathlib import Path

import pytest

from echo_tune.calibrate.fit.fit_profile import fit_profile
from echo_tune.config.load.loading import load_cluster

REPO = Path(__file__).resolve().parents[2]
A100_DIR = REPO / "calibration" / "azure-ndv4-a100-40gb"
LOGS = {n: A100_DIR / "nccl-tests" / f"all_reduce_{n}gpu.log" for n in (1, 2, 4, 8, 16)}


@pytest.fixture(scope="session")
def a100_cluster():
    return load_cluster(A100_DIR / "cluster.yaml")


@pytest.fixture(scope="session")
def one_node_fit(a100_cluster):
    """Fitted on the 1-, 2-, 4- and 8-GPU logs only (one node) plus the datasheet NIC rate."""
    return fit_profile(a100_cluster, nccl_logs=[LOGS[n] for n in (1, 2, 4, 8)], name="test-1node")


@pytest.fixture(scope="session")
def two_node_fit(a100_cluster):
    """Fitted on all five logs."""
    return fit_profile(a100_cluster, nccl_logs=list(LOGS.values()), name="test-all")
