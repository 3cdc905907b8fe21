"""Shared fixtures: small cached datasets from rlbench.datasets (the float64 reference the emulator is
compared with is rlbench_upmem.reference)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def frozenlake_10k():
    from rlbench import datasets

    return datasets.get("FrozenLake-v1", 10_000, seed=0)


@pytest.fixture(scope="session")
def taxi_10k():
    from rlbench import datasets

    return datasets.get("Taxi-v3", 10_000, seed=0)
