"""The built-in transports pass the conformance kit, and the kit catches real defects."""

from __future__ import annotations

import os
import queue
import socket
import struct
import threading
import time

import pytest

import rlbench
from rlbench.builtin.transports import inproc as inproc_module
from rlbench.builtin.transports import tcp as tcp_module
from rlbench.builtin.transports.inproc import InprocTransport
from rlbench.builtin.transports.shm import ShmTransport, probe
from rlbench.builtin.transports.tcp import TcpTransport
from rlbench.builtin.transports.udp import UdpTransport
from rlbench.kit.framing import AddressError, MessageTooLargeError
from rlbench.testing.transport import check_transport

BUILTIN = {"inproc": InprocTransport, "shm": ShmTransport, "tcp": TcpTransport, "udp": UdpTransport}
needs_shm = pytest.mark.skipif(not probe().available, reason=f"shm unavailable: {probe().reason}")


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_builtin_passes_the_kit(name):
    if name == "shm" and not probe().available:
        pytest.skip(probe().reason)
    check_transport(BUILTIN[name])  # cross-process where the transport crosses processes


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_capabilities_match_the_registration(name):
    registered = rlbench.get_registry().get("transport", name)
    assert BUILTIN[name].capabilities == registered.capabilities


def test_small_shm_ring_chunks_messages_larger_than_the_ring():
    if not probe().available:
        pytest.skip(probe().reason)
    check_transport(ShmTransport(ring_bytes=4096), cross_process=False, sizes=(0, 1, 1015, 1016, 1017, 4096, 100_000))


def test_small_udp_datagrams_fragment_and_reassemble():
    check_transport(UdpTransport(datagram_bytes=512), cross_process=False, sizes=(0, 487, 488, 489, 5000, 300_000))


# --------------------------------------------------------------------------------------------
# Deliberately broken transports: the kit must reject each one.
# Module-level classes, so a spawned peer could unpickle them too.
# --------------------------------------------------------------------------------------------
class _Proxy:
    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)


class _BrokenConnection(_Proxy):
    def __init__(self, inner, defect):
        super().__init__(inner)
        self._defect = defect
        self._count = 0
        self._held = None

    def send(self, *parts):
        self._count += 1
        if self._defect == "drop" and self._count == 5:
            return  # silently: no error, no counter
        if self._defect == "corrupt" and self._count == 6:
            message = bytearray(b"".join(bytes(memoryview(p).cast("B")) for p in parts))
            if len(message) > 10:
                message[len(message) // 2] ^= 0x01
            parts = (message,)
        if self._defect == "reorder" and self._count == 5:
            self._held = b"".join(bytes(memoryview(p).cast("B")) for p in parts)
            return
        if self._defect == "wrong-oversize-error":
            try:
                self._inner.send(*parts)
            except MessageTooLargeError as exc:
                raise RuntimeError(str(exc)) from None
            return
        self._inner.send(*parts)
        if self._held is not None:
            held, self._held = self._held, None
            self._inner.send(held)

    def request(self, *parts, timeout=None):
        self.send(*parts)
        return self._inner.recv(timeout)


class _BrokenListener(_Proxy):
    def __init__(self, inner, defect):
        super().__init__(inner)
        self._defect = defect
        self._pushes = 0
        self._closed = False
        self._outbox = None
        if defect == "keeps-buffers":  # sends a moment later, from the caller's buffers, as an async sender might
            self._outbox = queue.SimpleQueue()
            self._sender = threading.Thread(target=self._send_later, daemon=True)
            self._sender.start()

    def _send_later(self):
        while (item := self._outbox.get()) is not None:
            time.sleep(0.005)
            self._inner.send(*item)

    def send(self, peer, *parts):
        if self._defect == "corrupt-push" and bytes(parts[0][:1]) == b"V":
            self._pushes += 1
            if self._pushes == 3:
                message = b"".join(bytes(memoryview(p).cast("B")) for p in parts)
                parts = (message[:-1] + bytes([message[-1] ^ 0x80]),)
        if self._defect == "ignores-unknown-peer" and peer not in self._inner.peers:
            return
        if self._outbox is not None:
            self._outbox.put((peer, *parts))
            return
        self._inner.send(peer, *parts)

    def recv(self, timeout=None):
        if self._defect == "quiet-when-closed" and self._closed:
            return None
        return self._inner.recv(timeout)

    def close(self):
        self._closed = True
        if self._outbox is not None:
            self._outbox.put(None)
            self._sender.join(5)
        self._inner.close()


class BrokenTransport:
    def __init__(self, inner, defect):
        self._inner = inner
        self._defect = defect
        self.capabilities = inner.capabilities

    def listen(self, address=None):
        return _BrokenListener(self._inner.listen(address), self._defect)

    def connect(self, address, timeout=10.0):
        return _BrokenConnection(self._inner.connect(address, timeout), self._defect)


@pytest.mark.parametrize("defect, inner, message", [
    ("reorder", TcpTransport(), "reordered"),
    ("corrupt", TcpTransport(), "corrupted"),
    ("drop", TcpTransport(), "lost 1 message"),
    ("drop", UdpTransport(), "silent loss"),
    ("corrupt-push", InprocTransport(), "corrupted"),
    ("keeps-buffers", TcpTransport(), "listener.send kept the caller's buffers"),
    ("ignores-unknown-peer", TcpTransport(), "to unknown peer .* did not raise"),
    ("wrong-oversize-error", TcpTransport(), "connection.send: an oversize send raised RuntimeError"),
    ("quiet-when-closed", TcpTransport(), "listener.recv on a closed listener did not raise"),
])
def test_the_kit_catches_a_broken_transport(defect, inner, message):
    with pytest.raises(AssertionError, match=message):
        check_transport(BrokenTransport(inner, defect), cross_process=False, timeout=3.0)


class TcpIgnoringItsLimit(TcpTransport):
    """Takes max_message_bytes but listens with the capability: a limit that is not honoured."""

    def listen(self, address=None):
        limit, self.max_message_bytes = self.max_message_bytes, self.capabilities.max_message_bytes
        try:
            return super().listen(address)
        finally:
            self.max_message_bytes = limit


def test_the_kit_catches_a_receive_limit_that_is_not_honoured():
    with pytest.raises(AssertionError, match="delivered a message of 300001 B"):
        check_transport(TcpIgnoringItsLimit, cross_process=False, timeout=3.0)


def test_the_kit_passes_the_unbroken_wrapper():
    check_transport(BrokenTransport(TcpTransport(), "none"), cross_process=False)


# --------------------------------------------------------------------------------------------
# Transport-specific behaviour
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["inproc", "tcp", "udp"] + (["shm"] if probe().available else []))
def test_oversize_is_refused_with_a_clear_error(name):
    transport = BUILTIN[name]()
    listener = transport.listen()
    connection = transport.connect(listener.address, timeout=5)
    try:
        piece = bytes(1 << 20)
        parts = [piece] * (transport.capabilities.max_message_bytes // len(piece) + 1)
        with pytest.raises(MessageTooLargeError, match="max_message_bytes"):
            connection.send(*parts)
    finally:
        connection.close()
        listener.close()


@pytest.mark.parametrize("name, address", [("tcp", "udp://127.0.0.1:1"), ("udp", "localhost"),
                                           ("shm", "tcp://x"), ("inproc", "")])
def test_bad_address_is_a_clear_error(name, address):
    with pytest.raises(AddressError, match=name):
        BUILTIN[name]().listen(address)


@needs_shm
def test_shm_leaves_nothing_on_disk_and_notices_a_vanished_peer():
    before = set(os.listdir("/dev/shm"))
    transport = ShmTransport()
    listener = transport.listen()
    connection = transport.connect(listener.address, timeout=5)
    connection.send(b"ping")
    peer, message = listener.recv(timeout=5)
    assert bytes(message) == b"ping"
    assert set(os.listdir("/dev/shm")) == before  # memfd + abstract socket: no names anywhere
    connection.close()
    assert listener.recv(timeout=0.2) is None
    assert peer not in listener.peers
    listener.close()


def test_udp_counts_gaps_and_stalled_reassemblies_as_lost():
    listener = UdpTransport(reassembly_timeout_s=0.1).listen()
    _, port = listener.address.rsplit(":", 1)
    raw = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    header = struct.Struct("<HBBIIIII")
    try:
        def datagram(seq, index, count, payload, total=None):
            raw.sendto(header.pack(0x5242, 1, 0, seq, index, count, total or len(payload), 1000) + payload,
                       ("127.0.0.1", int(port)))

        datagram(0, 0, 1, b"a")
        datagram(3, 0, 1, b"d")  # 1 and 2 never sent
        assert bytes(listener.recv(timeout=5)[1]) == b"a"
        assert bytes(listener.recv(timeout=5)[1]) == b"d"
        assert listener.stats["lost"] == 2
        datagram(4, 0, 3, b"x" * 1000, total=2500)  # fragments 1 and 2 never come
        assert listener.recv(timeout=0.5) is None
        stats = listener.stats
        assert stats["lost"] == 3 and stats["reassembly_timeouts"] == 1
        datagram(5, 0, 1, b"f")
        assert bytes(listener.recv(timeout=5)[1]) == b"f" and listener.stats["lost"] == 3
    finally:
        raw.close()
        listener.close()


@needs_shm
def test_shm_sleepers_are_woken_by_the_doorbell_not_by_their_nap_cap(monkeypatch):
    """A waiter that gave up spinning sleeps on its eventfd; the producer rings it. With the nap cap
    raised to 30 s, only the doorbell can deliver within the bound, in both directions."""
    from rlbench.builtin.transports import shm

    monkeypatch.setattr(shm, "_NAP_S", 30.0)
    transport = ShmTransport()
    listener = transport.listen()
    connection = transport.connect(listener.address, timeout=5)
    got = []
    try:
        for _ in range(3):  # the listener asleep on an idle ring, then the connection asleep for its reply
            server = threading.Thread(target=lambda: got.append(listener.recv(timeout=60)))
            server.start()
            time.sleep(0.2)  # far beyond any spin: the listener sleeps
            sent = time.monotonic()
            connection.send(b"wake up")
            server.join(timeout=5)
            assert not server.is_alive(), "the listener slept through a message"
            assert time.monotonic() - sent < 5
            peer, message = got.pop()
            assert bytes(message) == b"wake up"

            replier = threading.Timer(0.2, lambda: listener.send(peer, b"reply"))
            replier.start()
            started = time.monotonic()
            assert bytes(connection.recv(timeout=60)) == b"reply"
            assert time.monotonic() - started < 5
            replier.join()
    finally:
        connection.close()
        listener.close()


# An Atari run's largest messages (rlbench.runtime.distributed.messages.message_sizes): a BATCH of 32 stacked
# 4x84x84 frames and the Nature CNN's weights
IMAGE_MESSAGE_BYTES = (1_807_440, 6_773_704)


def _echo_until_none(listener):
    while True:
        got = listener.recv(timeout=30)
        if got is None or bytes(got[1][:4]) == b"stop":
            return
        listener.send(got[0], got[1])


@pytest.mark.parametrize("name, options", [("inproc", {}), ("shm", {}), ("shm", {"ring_bytes": 1 << 20}),
                                           ("shm", {"ring_bytes": 1 << 16}), ("tcp", {}), ("udp", {}),
                                           ("udp", {"datagram_bytes": 1472})],
                         ids=["inproc", "shm", "shm-1MiB-ring", "shm-64KiB-ring", "tcp", "udp", "udp-1472B-datagrams"])
def test_image_sized_messages_cross_each_transport_both_ways(name, options):
    if name == "shm" and not probe().available:
        pytest.skip(probe().reason)
    transport = BUILTIN[name](**options)
    listener = transport.listen()
    connection = transport.connect(listener.address, timeout=10)
    server = threading.Thread(target=_echo_until_none, args=(listener,), daemon=True)
    server.start()
    try:
        for size in IMAGE_MESSAGE_BYTES:
            message = os.urandom(size)
            for _ in range(2):
                assert bytes(connection.request(message, timeout=30)) == message
        connection.send(b"stop")
        server.join(timeout=10)
        assert not server.is_alive()
    finally:
        connection.close()
        listener.close()


@needs_shm
def test_a_shm_listener_writing_a_message_larger_than_the_ring_is_woken_as_its_reader_frees_room(monkeypatch):
    """A listener's message that its ring cannot take at once waits in the peer's outbox and goes out
    as the peer reads; the reader rings the listener's doorbell when it frees room while the listener
    sleeps. With the nap cap raised to 30 s, a 6.7 MB reply through a 64 KiB ring (hundreds of
    chunks) arrives only if every one of those wake-ups comes from the reader."""
    from rlbench.builtin.transports import shm

    monkeypatch.setattr(shm, "_NAP_S", 30.0)
    transport = ShmTransport(ring_bytes=1 << 16)
    listener = transport.listen()
    connection = transport.connect(listener.address, timeout=5)
    server = threading.Thread(target=_echo_until_none, args=(listener,), daemon=True)
    server.start()
    try:
        message = os.urandom(IMAGE_MESSAGE_BYTES[-1])
        started = time.monotonic()
        assert bytes(connection.request(message, timeout=60)) == message
        assert time.monotonic() - started < 10
        connection.send(b"stop")
        server.join(timeout=10)
    finally:
        connection.close()
        listener.close()


# ---------------------------------------------------- the kit's slow-consumer rule catches its breakers
class UnboundedInproc(InprocTransport):
    """Says it bounds what waits for a peer, and never does (the old inproc)."""

    def listen(self, address=None):
        listener = super().listen(address)
        listener._max_queued = 1 << 62
        return listener


class _WaitingTcpListener(tcp_module.TcpListener):
    def send(self, peer, *parts):
        super().send(peer, *parts)
        entry = self._peers.get(peer)
        while entry is not None and entry.outbox:  # waits for the peer to read, as a blocking send did
            self._select(0.01)
            entry = self._peers.get(peer)


class WaitingTcp(TcpTransport):
    def listen(self, address=None):
        listener = super().listen(address)
        listener.__class__ = _WaitingTcpListener
        return listener


class IgnoresTheQueueBound(InprocTransport):
    def __init__(self, max_message_bytes=None, max_queued_bytes=None):
        super().__init__(max_message_bytes)  # takes the option, keeps the default


@pytest.mark.parametrize("factory, complaint", [
    (UnboundedInproc, "never dropped"),
    (WaitingTcp, "never waits on a peer"),
    (IgnoresTheQueueBound, "must keep it as .max_queued_bytes"),
])
def test_the_kit_fails_a_listener_that_waits_on_or_queues_without_bound_for_a_peer_that_does_not_read(factory,
                                                                                                        complaint):
    with pytest.raises(AssertionError, match=complaint):
        check_transport(factory, cross_process=False, timeout=3.0)
