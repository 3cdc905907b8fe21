"""The core conformance kit over memif: a listener here, peers in threads and in a spawned process."""

import functools

from rlbench.testing.transport import check_transport
from rlbench_dpdk.transport import DpdkTransport


def test_memif_passes_the_conformance_kit(dpdk_available):
    check_transport(functools.partial(DpdkTransport, "memif"), timeout=20.0)
