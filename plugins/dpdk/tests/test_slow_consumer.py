"""A listener's send never waits on its peer (issue #21 item 2, rlbench.kit.framing's slow-consumer
rule): what a peer's window cannot take now waits in that peer's bounded queue and goes out as the
peer acknowledges, during the listener's later calls; a peer whose queue would pass max_queued_bytes
is dropped (SlowConsumerError, counted in slow_consumers and dropped_peers), and the other peers are
served all along. Peers run in spawned processes (one EAL per process)."""

from __future__ import annotations

import multiprocessing
import time

import pytest

from rlbench.kit.framing import MAX_QUEUED_BYTES, SlowConsumerError, TransportClosedError
from rlbench.testing import still_serves
from rlbench_dpdk.native import library
from rlbench_dpdk.testing import honest_peer, late_reader, pattern, silent_peer
from rlbench_dpdk.transport import DpdkTransport

KiB = 1 << 10
SIZE = 256 * KiB
SEND_BOUND_S = 0.5  # generous: a send that waits on its peer waits give_up_s (10 s)


@pytest.fixture
def spawn(dpdk_available):
    context = multiprocessing.get_context("spawn")
    processes = []

    def start(target, *args):
        process = context.Process(target=target, args=args, daemon=True)
        process.start()
        processes.append(process)
        return process

    start.context = context
    yield start
    for process in processes:
        process.join(10)
        if process.is_alive():
            process.kill()


def answer(listener, peer: int, message: bytes, stop: bool) -> None:
    assert message.startswith(b"ping"), f"peer {peer} sent {message[:16]!r}"
    listener.send(peer, b"stop" if stop else b"pong" + message[4:])


def hellos(listener, wanted: set[bytes], timeout: float = 60.0) -> dict[bytes, int]:
    """The peer id of each hello in `wanted`, as they arrive (pings that come meanwhile are answered)."""
    peers: dict[bytes, int] = {}
    deadline = time.monotonic() + timeout
    while set(peers) != wanted:
        assert time.monotonic() < deadline, f"hellos {wanted - set(peers)} did not arrive: {listener.stats}"
        got = listener.recv(timeout=0.1)
        if got is not None:
            message = bytes(got[1])
            if message in wanted:
                peers[message] = got[0]
            else:
                answer(listener, got[0], message, stop=False)
    return peers


def serve(listener, honest: int, seconds: float, stop: bool = False) -> int:
    """Answer the honest peer's pings for `seconds` (`stop`: answer the first one b"stop" and return);
    how many were answered."""
    answered = 0
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        got = listener.recv(timeout=min(left, 0.01))
        if got is None:
            continue
        peer, message = got
        assert peer == honest, f"a message from peer {peer}, not the honest one ({honest}): {bytes(message[:16])!r}"
        answer(listener, peer, bytes(message), stop)
        answered += 1
        if stop:
            break
    return answered


def test_a_peer_that_never_reads_is_dropped_and_stalls_no_one(spawn):
    listener = DpdkTransport().listen()
    quit_silent = spawn.context.Event()
    results = spawn.context.Queue()
    try:
        spawn(silent_peer, listener.address, b"silent", quit_silent)
        spawn(honest_peer, listener.address, b"honest", results)
        peers = hellos(listener, {b"silent", b"honest"})
        silent, honest = peers[b"silent"], peers[b"honest"]
        serve(listener, honest, 0.2)
        sends, slowest, dropped, answered = 0, 0.0, None, 0
        while dropped is None:
            assert sends * SIZE <= MAX_QUEUED_BYTES + 8 * 1024 * KiB, \
                f"{sends} sends of {SIZE} B to a peer that reads nothing, and it was not dropped"
            start = time.monotonic()
            try:
                listener.send(silent, pattern(sends, SIZE))
            except SlowConsumerError as exc:
                dropped = exc
            took = time.monotonic() - start
            slowest = max(slowest, took)
            assert took < SEND_BOUND_S, f"send {sends} to a peer that does not read took {took:.2f} s"
            sends += 1
            answered += serve(listener, honest, 0.005)
        assert "max_queued_bytes" in str(dropped), dropped
        stats = listener.stats
        assert stats["slow_consumers"] == 1 and stats["dropped_peers"] == 1, stats
        assert silent not in listener.peers and honest in listener.peers
        with pytest.raises(TransportClosedError):
            listener.send(silent, b"more")
        assert answered > 0, "the honest peer got no answer while the listener sent to the silent one"
        assert serve(listener, honest, 0.2) > 0, "the honest peer was not served after the drop"
        assert serve(listener, honest, 30, stop=True) == 1
        report = results.get(timeout=10)
        assert isinstance(report, tuple), report
        print(f"{sends} sends (slowest {slowest * 1e3:.1f} ms) until the silent peer was dropped; "
              f"honest round trips: {answered} meanwhile, {report[0]} in all, slowest {report[1] * 1e3:.1f} ms")
    finally:
        quit_silent.set()
        listener.close()


def test_a_peer_that_reads_late_gets_every_queued_message_in_order(spawn):
    count, delay_s = 32, 1.5  # 8 MiB: far past the window (128 frames, ~1.1 MB), within max_queued_bytes
    listener = DpdkTransport(max_queued_bytes=16 << 20).listen()
    results = spawn.context.Queue()
    try:
        spawn(late_reader, listener.address, b"late", count, SIZE, delay_s, results)
        late = hellos(listener, {b"late"})[b"late"]
        started = time.monotonic()
        for i in range(count):
            start = time.monotonic()
            listener.send(late, pattern(i, SIZE))
            took = time.monotonic() - start
            assert took < SEND_BOUND_S, f"send {i} to a peer that reads later took {took:.2f} s"
        assert time.monotonic() - started < delay_s, "the sends waited for the peer to read"
        deadline = time.monotonic() + 60
        got = None
        while got is None:  # the listener's calls move its queue on
            assert time.monotonic() < deadline, "the late reader did not get its messages"
            got = listener.recv(timeout=0.05)
        assert (got[0], bytes(got[1])) == (late, b"got-all")
        assert results.get(timeout=10) == "ok"
        stats = listener.stats
        assert stats["slow_consumers"] == 0 and stats["dropped_peers"] == 0, stats
    finally:
        listener.close()


def test_max_queued_bytes_bounds_the_queue_and_a_message_into_an_empty_queue_is_always_taken(spawn):
    """The factory option bounds the queue; yet one message far over it, into an empty queue, is
    taken and delivered whole to a peer that reads late; a second one behind it drops the peer."""
    size = 4 << 20
    listener = DpdkTransport(max_queued_bytes=1 << 20).listen()
    results = spawn.context.Queue()
    try:
        spawn(late_reader, listener.address, b"late", 1, size, 1.0, results)
        late = hellos(listener, {b"late"})[b"late"]
        start = time.monotonic()
        listener.send(late, pattern(0, size))
        assert time.monotonic() - start < SEND_BOUND_S
        deadline = time.monotonic() + 60
        got = None
        while got is None:
            assert time.monotonic() < deadline, "the late reader did not get its message"
            got = listener.recv(timeout=0.05)
        assert (got[0], bytes(got[1])) == (late, b"got-all")
        assert results.get(timeout=10) == "ok"
    finally:
        listener.close()

    listener = DpdkTransport(max_queued_bytes=1 << 20).listen()
    quit_silent = spawn.context.Event()
    try:
        spawn(silent_peer, listener.address, b"silent", quit_silent)
        silent = hellos(listener, {b"silent"})[b"silent"]
        listener.send(silent, pattern(0, size))  # past the window: the rest waits in the queue
        with pytest.raises(SlowConsumerError, match="max_queued_bytes=1048576"):
            listener.send(silent, b"one more")
        assert listener.stats["slow_consumers"] == 1 and listener.peers == []
    finally:
        quit_silent.set()
        listener.close()


def test_drop_ends_one_peer_and_peers_lists_every_peer(dpdk_available):
    transport = DpdkTransport()
    listener = transport.listen()
    connections = [transport.connect(listener.address, timeout=10) for _ in range(3)]
    try:
        ids = []
        for i, connection in enumerate(connections):
            connection.send(b"hello%d" % i)
            peer, message = listener.recv(timeout=10)
            assert bytes(message) == b"hello%d" % i
            ids.append(peer)
        listener._peer_buffer = library()[0].new("int[]", 1)  # fewer than the peers: it must grow
        assert sorted(listener.peers) == sorted(ids)

        listener.drop(ids[0])  # a plain drop: no fault counted
        assert sorted(listener.peers) == sorted(ids[1:])
        with pytest.raises(TransportClosedError):
            listener.send(ids[0], b"after the drop")
        with pytest.raises(TransportClosedError, match="closed the connection"):
            connections[0].recv(timeout=10)
        assert listener.stats["dropped_peers"] == 0

        listener.drop(ids[1], "malformed")
        with pytest.raises(TransportClosedError, match="malformed"):
            connections[1].recv(timeout=10)
        stats = listener.stats
        assert stats["dropped_peers"] == 1 and stats["malformed"] == 1 and stats["slow_consumers"] == 0, stats
        with pytest.raises(ValueError, match="no such peer fault"):
            listener.drop(ids[2], "bored")
        listener.drop(12345)  # not a peer: nothing happens
        still_serves(listener, connections[2], b"still here", timeout=10)
        assert listener.peers == [ids[2]]
    finally:
        for connection in connections:
            connection.close()
        listener.close()


def test_a_listener_that_only_sends_takes_the_acknowledgements_waiting_for_it(dpdk_available):
    """A server that sends and never receives polls nothing else: once its window (128 frames) is
    full, a send takes the acknowledgements waiting in its rx ring itself, so a peer that reads gets
    every message at once (instead of it waiting in the queue for a listener call that never comes)."""
    transport = DpdkTransport()
    listener = transport.listen()
    connection = transport.connect(listener.address, timeout=10)
    try:
        connection.send(b"hello")
        peer, _ = listener.recv(timeout=10)
        for i, size in enumerate([64] * 1000 + [65536] * 300):
            listener.send(peer, pattern(i, size))
            message = connection.recv(timeout=5)
            assert message is not None, f"message {i} ({size} B) did not arrive while the listener only sends"
            assert bytes(message) == pattern(i, size)
        assert listener.stats["frames_sent"] >= 1000 + 300 * 8
    finally:
        connection.close()
        listener.close()
