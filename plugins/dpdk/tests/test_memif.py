"""memif between processes: ordered shutdown, peers leaving, and what a peer sees when the node goes."""

import multiprocessing
import time
from collections.abc import Callable

import pytest

from rlbench.kit.framing import TransportClosedError
from rlbench_dpdk.testing import echo_node
from rlbench_dpdk.transport import DpdkTransport


def _start_node(peers: int):
    context = multiprocessing.get_context("spawn")
    addresses, results = context.Queue(), context.Queue()
    process = context.Process(target=echo_node, args=(addresses, results, peers), daemon=True)
    process.start()
    return process, addresses.get(timeout=60), results


def test_node_shuts_down_cleanly_after_its_peers_leave(dpdk_available):
    """The memif server once crashed in the PMD at shutdown after its peer left: repeat the sequence."""
    transport = DpdkTransport()
    for round_ in range(4):
        process, address, results = _start_node(peers=2)
        try:
            for peer in range(2):
                connection = transport.connect(address, timeout=10.0)
                payload = bytes([round_, peer]) * 3000
                assert bytes(connection.request(payload, timeout=10.0)) == b"echo:" + payload
                connection.send(b"bye")
                connection.close()
            stats = results.get(timeout=30)
            process.join(30)
            assert process.exitcode == 0, f"round {round_}: the node exited with {process.exitcode}"
            assert stats["messages_received"] == 4 and stats["lost"] == 0
        finally:
            if process.is_alive():
                process.kill()


def _peers_one_after_another(peers: int, gap_s: float, payload: Callable[[int], bytes]) -> None:
    """`peers` peers in turn, `gap_s` apart: each asks for an interface, is echoed `payload(peer)`, says
    bye and closes; then the node must exit cleanly, having received every message and lost none."""
    process, address, results = _start_node(peers=peers)
    transport = DpdkTransport()
    try:
        for peer in range(peers):
            connection = transport.connect(address, timeout=10.0)
            message = payload(peer)
            assert bytes(connection.request(message, timeout=10.0)) == b"echo:" + message
            connection.send(b"bye")
            connection.close()
            time.sleep(gap_s)
        stats = results.get(timeout=30)
        process.join(30)
        assert process.exitcode == 0, f"the node exited with {process.exitcode}"
        assert stats["messages_received"] == 2 * peers and stats["lost"] == 0
    finally:
        if process.is_alive():
            process.kill()


def test_node_survives_many_peers_coming_and_going(dpdk_available):
    """The PMD tears a departed peer's memif connection down on another thread with no lock against
    a concurrent rx burst; a node that kept polling that port crashed about once in ten runs. DPDK
    has 32 port ids here, so 40 peers also prove that departed peers' ports are given back."""
    # 5 ms apart: peers of a real run come and go far more slowly
    _peers_one_after_another(40, 0.005, lambda peer: peer.to_bytes(2, "little") * 500)


def test_a_peer_joins_after_every_earlier_peer_left(dpdk_available):
    """DPDK 22.11's memif PMD leaves a socket's name bound once the socket's last interface closes:
    before the listener held its socket for its whole life, a peer arriving after the earlier ones had
    left and their ports were closed (20 ms after their links went down) could not get an interface."""
    # 0.5 s apart: long enough for the node to close each departed peer's port
    _peers_one_after_another(3, 0.5, lambda peer: b"alone %d" % peer)


def test_peer_learns_that_the_node_died(dpdk_available):
    process, address, _ = _start_node(peers=1)
    connection = DpdkTransport().connect(address, timeout=10.0)
    try:
        assert bytes(connection.request(b"ping", timeout=10.0)) == b"echo:ping"
        process.kill()  # no goodbye: the memif link going down must tell the peer
        process.join(10)
        with pytest.raises(TransportClosedError):
            connection.recv(timeout=10.0)
    finally:
        connection.close()


def test_unknown_address_is_a_clear_error(dpdk_available):
    with pytest.raises(TransportClosedError, match="nothing listens"):
        DpdkTransport().connect("dpdk://memif/no-such-listener", timeout=2.0)


def test_a_peer_that_took_its_messages_and_then_stays_away_is_not_given_up(dpdk_available):
    """An application that received its last message and then does other work (an actor stepping
    its environment) for longer than give_up_s keeps its connection: what it took was acknowledged
    when it took it. Before, the acknowledgement waited for its next poll and the listener declared
    it gone."""
    transport = DpdkTransport(give_up_s=0.3)
    listener = transport.listen()
    connection = transport.connect(listener.address, timeout=10)
    try:
        connection.send(b"request")
        peer, _ = listener.recv(timeout=10)
        listener.send(peer, b"reply")
        assert bytes(connection.recv(timeout=10)) == b"reply"
        assert listener.recv(timeout=1.0) is None  # the listener polls on; the peer calls nothing
        assert listener.peers == [peer]
        connection.send(b"still here")
        assert listener.recv(timeout=10) is not None
        listener.send(peer, b"and served")
        assert bytes(connection.recv(timeout=10)) == b"and served"
    finally:
        connection.close()
        listener.close()
