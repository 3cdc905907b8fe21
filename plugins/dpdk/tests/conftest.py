"""Tests that need DPDK skip with the probe's reason when it is not installed here."""

import pytest

from rlbench_dpdk.native import probe


@pytest.fixture(scope="session")
def dpdk_available() -> None:
    result = probe()
    if not result.available:
        pytest.skip(result.reason)
