"""The uds transport through rlbench's public surface only: the transport conformance kit (with a
peer in another process), a private socket that goes away at close, memory that follows the bytes
that arrive, and a distributed run over it."""

from __future__ import annotations

import os
import socket
import stat
import struct
import tracemalloc

import pytest

import rlbench
from rlbench.kit.framing import AddressError
from rlbench.testing import check_transport

from rlbench_uds import UdsTransport


def test_passes_the_transport_conformance_kit():
    check_transport(UdsTransport)  # one peer in a spawned process, two in threads


def test_the_socket_is_private_and_removed_at_close():
    listener = UdsTransport().listen()
    path = listener.address.removeprefix("uds://")
    directory = os.path.dirname(path)
    assert stat.S_ISSOCK(os.stat(path).st_mode)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    listener.close()
    listener.close()
    assert not os.path.exists(directory)


def test_a_length_the_sender_claims_is_not_allocated():
    listener = UdsTransport().listen()
    liar = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        liar.connect(listener.address.removeprefix("uds://"))
        claimed = 512 << 20  # within the limit (1 GiB), but only 10 bytes follow
        tracemalloc.start()
        liar.sendall(struct.pack("<I", claimed) + b"0123456789")
        assert listener.recv(timeout=0.3) is None  # nothing whole has arrived
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < 4 << 20, f"{peak} bytes allocated for 10 that arrived"
        liar.close()
        assert listener.recv(timeout=0.3) is None
        assert listener.peers == [] and listener.stats["truncated"] == 1  # it left mid-message, and was dropped
    finally:
        liar.close()
        listener.close()


def test_addresses_it_cannot_use_are_refused_clearly():
    with pytest.raises(AddressError, match="uds://"):
        UdsTransport().connect("tcp://127.0.0.1:5000")
    with pytest.raises(AddressError, match="cannot listen"):
        UdsTransport().listen("uds:///" + "x" * 200)  # longer than a socket path may be


def test_a_distributed_run_over_uds_completes_with_balanced_accounting():
    result = rlbench.run(rlbench.RunConfig(placement="server", transport="uds", actors=2, steps=1500, eval_episodes=1,
                                           hyperparameters={"learning_starts": 200, "batch_size": 32}))
    assert result["status"] == "complete", result["status_reason"]
    assert result["components"]["transport"]["name"] == "uds"
    assert result["accounting"]["balanced"], result["accounting"]
