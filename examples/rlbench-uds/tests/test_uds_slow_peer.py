"""A slow peer stalls no one (issue #21 item 2): the uds listener's send never waits on the peer it
sends to. What the socket cannot take waits in that peer's bounded outbox and goes out while the
listener goes on with its calls; a peer that never reads is dropped as a slow consumer, and an
honest peer is served all along."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from rlbench.errors import RlbenchError
from rlbench.kit.framing import MAX_QUEUED_BYTES, SlowConsumerError, TransportClosedError

from rlbench_uds import UdsTransport

PROMPT_S = 0.5  # generous: a send that returns at all returns in microseconds; one that waits on the peer never does
MESSAGE = 64 << 10
BOUND = 1 << 20  # the outbox bound these tests use (MAX_QUEUED_BYTES by default): found after ~1 MiB


def promptly(call, *args):
    """Run `call(*args)` and return what it returns, failing when it takes over PROMPT_S. It runs in a
    thread so that a send that waits on its peer fails the test instead of hanging it."""
    outcome = {}

    def run():
        started = time.monotonic()
        try:
            outcome["value"] = call(*args)
        except BaseException as exc:  # handed to the test thread
            outcome["error"] = exc
        outcome["took"] = time.monotonic() - started

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(PROMPT_S * 4)
    assert not thread.is_alive(), f"{call.__name__} still waits after {PROMPT_S * 4} s: it waits on the peer"
    assert outcome["took"] < PROMPT_S, f"{call.__name__} took {outcome['took']:.3f} s"
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def payload(i: int) -> bytes:
    return i.to_bytes(4, "little") + np.random.default_rng(i).bytes(MESSAGE - 4)


def hello(listener, connection, text: bytes) -> int:
    connection.send(text)
    item = listener.recv(timeout=5)
    assert item is not None and bytes(item[1]) == text
    return item[0]


def round_trip(listener, honest, honest_peer: int, i: int) -> None:
    honest.send(b"ping %d" % i)
    item = listener.recv(timeout=5)
    assert item is not None, f"round trip {i}: the honest peer's message did not arrive"
    assert item[0] == honest_peer and bytes(item[1]) == b"ping %d" % i
    promptly(listener.send, honest_peer, b"pong %d" % i)
    reply = honest.recv(timeout=5)
    assert reply is not None and bytes(reply) == b"pong %d" % i


def test_a_peer_that_never_reads_is_dropped_while_an_honest_peer_is_served():
    transport = UdsTransport(max_queued_bytes=BOUND)
    listener = transport.listen()
    slow = transport.connect(listener.address, timeout=5)
    honest = transport.connect(listener.address, timeout=5)
    try:
        slow_peer = hello(listener, slow, b"hello, I will never read")
        honest_peer = hello(listener, honest, b"hello")
        dropped_at = None
        for i in range(200):  # far more than the socket buffer and the bound hold
            try:
                promptly(listener.send, slow_peer, payload(i))
            except SlowConsumerError as exc:
                assert "max_queued_bytes" in str(exc)
                dropped_at = i
                break
            round_trip(listener, honest, honest_peer, i)
        assert dropped_at is not None, "200 messages of 64 KiB to a peer that never reads, and it was never dropped"
        assert dropped_at * MESSAGE < BOUND + (8 << 20), f"dropped only after {dropped_at} messages"
        stats = listener.stats
        assert stats["slow_consumers"] == 1 and stats["dropped_peers"] == 1, stats
        assert listener.peers == [honest_peer]
        with pytest.raises(TransportClosedError):
            listener.send(slow_peer, b"more")
        round_trip(listener, honest, honest_peer, 1000)
        with pytest.raises(TransportClosedError):  # what the kernel held reaches it, then it learns it was dropped
            for _ in range(200):
                assert slow.recv(timeout=5) is not None, "a dropped peer's connection neither delivered nor closed"
    finally:
        slow.close()  # first: it ends a send that waits on it (on a listener that has no outbox)
        honest.close()
        listener.close()


def test_a_late_reader_gets_every_message_in_order_while_the_listener_goes_on():
    transport = UdsTransport(max_queued_bytes=4 << 20)
    listener = transport.listen()
    late = transport.connect(listener.address, timeout=5)
    got: list[bytes] = []
    count = 48  # 3 MiB: many times the socket buffer, within the bound
    try:
        peer = hello(listener, late, b"hello, I will read later")
        for i in range(count):
            promptly(listener.send, peer, payload(i))
        assert listener.stats["slow_consumers"] == 0

        def drain():
            while len(got) < count:
                message = late.recv(timeout=10)
                if message is None:
                    return
                got.append(bytes(message))

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        deadline = time.monotonic() + 30
        while reader.is_alive() and time.monotonic() < deadline:
            assert listener.recv(timeout=0.02) is None  # the listener's loop: its calls move the outbox
        reader.join(1)
        assert len(got) == count, f"{len(got)} of {count} messages arrived"
        for i, message in enumerate(got):
            assert message == payload(i), f"message {i} arrived out of order or corrupted"
        assert listener.stats["dropped_peers"] == 0 and listener.peers == [peer]
    finally:
        late.close()
        listener.close()


def test_a_flood_from_one_peer_delays_another_by_about_one_message():
    transport = UdsTransport()
    listener = transport.listen()
    flood = transport.connect(listener.address, timeout=5)
    other = transport.connect(listener.address, timeout=5)
    try:
        flood_peer = hello(listener, flood, b"flood")
        other_peer = hello(listener, other, b"other")
        for i in range(100):  # what the socket holds without the listener reading (a message costs ~1 KiB there)
            flood.send(b"f%d" % i)
        other.send(b"mine")
        time.sleep(0.2)  # all of it is in the listener's sockets now
        order = [listener.recv(timeout=5) for _ in range(4)]
        peers = [item[0] for item in order if item is not None]
        assert other_peer in peers[:3], f"the other peer's message came after {peers} (flood {flood_peer})"
    finally:
        flood.close()
        other.close()
        listener.close()


def test_drop_closes_a_peer_and_forgets_what_it_sent_that_was_not_handed_out():
    transport = UdsTransport()
    listener = transport.listen()
    first = transport.connect(listener.address, timeout=5)
    second = transport.connect(listener.address, timeout=5)
    try:
        peers = {hello(listener, first, b"first"): first, hello(listener, second, b"second"): second}
        first.send(b"one")
        second.send(b"two")
        time.sleep(0.2)  # both in the listener's sockets: one look at them takes both
        handed, _ = listener.recv(timeout=5)
        other = next(peer for peer in peers if peer != handed)
        listener.drop(other)
        assert listener.recv(timeout=0.3) is None, "a dropped peer's message was handed out after drop()"
        assert listener.peers == [handed] and listener.stats["dropped_peers"] == 0  # no fault named: not counted
        with pytest.raises(TransportClosedError):
            peers[other].recv(timeout=5)
        listener.drop(other)  # harmless twice
    finally:
        first.close()
        second.close()
        listener.close()


def test_max_queued_bytes_is_a_positive_number_of_bytes():
    assert UdsTransport().max_queued_bytes == MAX_QUEUED_BYTES
    assert UdsTransport(max_queued_bytes=4096).max_queued_bytes == 4096
    for bad in (0, -1, "lots"):
        with pytest.raises(RlbenchError, match="max_queued_bytes"):
            UdsTransport(max_queued_bytes=bad)
