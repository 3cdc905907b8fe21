"""Frames really cross a veth pair between two network namespaces the test creates and removes:
DPDK af_packet on each end, each side in its own process, every echo verified byte for byte."""

import subprocess

import pytest

from rlbench_dpdk.veth import measure_over_veth, veth_pair, veth_unavailable


@pytest.fixture
def veth(dpdk_available):
    reason = veth_unavailable()
    if reason:
        pytest.skip(reason)
    with veth_pair() as pair:
        yield pair
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert pair.server_ns not in names and pair.client_ns not in names, "namespaces were left behind"


def test_af_packet_over_a_veth_pair(veth):
    # 64 B fits one frame; 4 KB and 100 KB are cut into 1500-byte-MTU frames and reassembled.
    result = measure_over_veth(veth, "dpdk", "af_packet", [64, 4096, 100_000], requests=200, timeout=60)
    assert [case["size"] for case in result["cases"]] == [64, 4096, 100_000]
    stats = result["stats"]
    # 3 sizes x (200 warm-up + 200 measured) requests, each answered by its echo (checked by ping)
    assert stats["lost"] == 0 and stats["messages_sent"] == stats["messages_received"] == 1200
    assert stats["frames_sent"] > stats["messages_sent"], "large messages must have been fragmented"
