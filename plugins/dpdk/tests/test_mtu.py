"""memif's MTU is what the transport is given: jumbo frames by default, 1500 when asked, peers of
different MTUs talk, and an MTU the shim cannot build is refused clearly. Frames are counted by the
shim (stats["frames_sent"]), payload per frame read from the port (rlb_port_info)."""

from __future__ import annotations

import math
import threading
import time

import numpy as np
import pytest

from rlbench.errors import RlbenchError
from rlbench_dpdk.capabilities import CAPABILITIES
from rlbench_dpdk.doctor import port_info
from rlbench_dpdk.transport import DpdkTransport

HEADERS = 14 + 20 + 8 + 32  # Ethernet, IPv4, UDP and the shim's header


@pytest.mark.parametrize("mtu", [1500, 9000, 4000])
def test_a_64_kib_message_takes_the_frames_its_mtu_allows_both_ways(dpdk_available, mtu):
    transport = DpdkTransport(mtu=mtu)
    listener = transport.listen()
    connection = transport.connect(listener.address, timeout=10)
    message = np.random.default_rng(mtu).bytes(65536)
    expected_frames = math.ceil(len(message) / (mtu + 14 - HEADERS))
    try:
        info = port_info(connection._port)
        assert info["mtu"] == mtu and info["frame_payload_bytes"] == mtu + 14 - HEADERS, info
        assert info["device_mtu"] == 1500  # what DPDK says of memif, whatever frames it carries
        before = connection.stats["frames_sent"]
        connection.send(message)
        peer, got = listener.recv(timeout=10)
        assert bytes(got) == message
        assert connection.stats["frames_sent"] - before == expected_frames
        before = listener.stats["frames_sent"]
        listener.send(peer, message)
        assert bytes(connection.recv(timeout=10)) == message
        assert listener.stats["frames_sent"] - before == expected_frames
    finally:
        connection.close()
        listener.close()


def test_peers_of_different_mtus_exchange_small_and_jumbo_frames(dpdk_available):
    """A 9000-byte-MTU listener and a 1500-byte-MTU peer, small and large messages alternating both
    ways. With memif ring buffers smaller than a jumbo frame this broke within a few hundred
    messages: DPDK 22.11's memif transmit leaves a stale chain flag on a descriptor, and the receiver
    reads past what was published.

    The listener's 15 MB burst is sent faster than the peer reads it: what its window cannot take
    waits in the peer's queue (bounded by max_queued_bytes, here above the burst) and goes out
    during the listener's later calls, so the listener is driven until the peer has it all."""
    listener = DpdkTransport(mtu=9000, max_queued_bytes=32 << 20).listen()
    connection = DpdkTransport(mtu=1500).connect(listener.address, timeout=10)
    sizes = [100 if i % 2 else 20_000 for i in range(1500)]
    try:
        connection.send(b"hello")
        peer, _ = listener.recv(timeout=10)
        for send, receive, drive in (
                (lambda message: listener.send(peer, message), lambda: connection.recv(timeout=10),
                 lambda: listener.recv(timeout=0.01)),
                (connection.send, lambda: listener.recv(timeout=10)[1], lambda: time.sleep(0.01))):
            received: list[bytes] = []

            def take() -> None:  # the receiver runs beside the sender, as in a run
                while len(received) < len(sizes):
                    received.append(bytes(receive()))

            thread = threading.Thread(target=take)
            thread.start()
            for i, size in enumerate(sizes):
                send(i.to_bytes(4, "little") * (size // 4))
            deadline = time.monotonic() + 30
            while thread.is_alive() and time.monotonic() < deadline:
                assert drive() is None, "the peer sent something unasked"
            thread.join(1)
            assert [len(message) for message in received] == sizes
            assert all(message[:4] == i.to_bytes(4, "little") for i, message in enumerate(received))
        assert listener.stats["lost"] == connection.stats["lost"] == 0
    finally:
        connection.close()
        listener.close()


@pytest.mark.parametrize("bad", [575, 9203, 0, -1, "jumbo", 1500.5, True])
def test_an_mtu_the_shim_cannot_build_is_refused_clearly(bad):
    with pytest.raises(RlbenchError, match="mtu"):
        DpdkTransport(mtu=bad)


def test_the_message_limit_is_configurable_below_the_capability_and_no_higher():
    assert DpdkTransport(max_message_bytes=1000).max_message_bytes == 1000
    assert DpdkTransport().max_message_bytes == CAPABILITIES.max_message_bytes
    for bad in (0, -1, CAPABILITIES.max_message_bytes + 1, 1.5, "big", True):
        with pytest.raises(RlbenchError, match="max_message_bytes"):
            DpdkTransport(max_message_bytes=bad)
    for bad in (0, -1, "soon"):
        with pytest.raises(RlbenchError, match="give_up_s"):
            DpdkTransport(give_up_s=bad)
