"""Kernel UDP with a small header, fragmentation and loss detection (reliable=False).

Every datagram carries [magic u16, version u8, kind u8, message seq u32, fragment index u32,
fragment count u32, total length u32, fragment size u32]. A message that fits one datagram is sent
once, as is. A larger one is cut into fragments sent in a sliding window; the receiver acknowledges
every few fragments (cumulatively) and the sender retransmits what a timeout leaves unacknowledged,
so bulk transfers do not simply overrun the receive buffer. The sender finishes (or abandons) one
message before starting the next, so messages arrive in order.

Loss is counted, never silent: per peer, the receiver expects sequence numbers in order; a gap, or a
reassembly that makes no progress for `reassembly_timeout_s`, adds to stats["lost"]. The invariant
the conformance kit checks is received + lost == sent.
"""

from __future__ import annotations

import collections
import itertools
import select
import socket
import struct
import time
from typing import Any

from rlbench.kit.framing import (
    RequestReply,
    TransportClosedError,
    byte_views,
    check_size,
    host_port,
    new_stats,
    slice_views,
)
from rlbench.errors import RlbenchError
from rlbench.protocols import TransportCapabilities

_HEADER = struct.Struct("<HBBIIIII")
_MAGIC, _VERSION = 0x5242, 1
_DATA, _ACK, _HELLO, _WELCOME, _BYE = range(5)
_WINDOW = 32  # fragments in flight per message
_ACK_EVERY = 8  # the receiver acknowledges every this many fragments (and the last)
_RTO_S, _MAX_RTO_S = 0.02, 0.2
_RCVBUF = 4 << 20


class _Partial:
    """A message being reassembled."""

    __slots__ = ("buffer", "seen", "have", "contiguous", "count", "touched")

    def __init__(self, total: int, count: int) -> None:
        self.buffer = bytearray(total)
        self.seen = bytearray(count)
        self.have = 0
        self.contiguous = 0  # fragments 0..contiguous-1 are all here
        self.count = count
        self.touched = time.monotonic()


class _Peer:
    __slots__ = ("id", "addr", "send_seq", "expected", "partials", "acked")

    def __init__(self, peer_id: int, addr: Any) -> None:
        self.id = peer_id
        self.addr = addr
        self.send_seq = 0
        self.expected = 0  # the next sequence number not yet delivered or counted lost
        self.partials: dict[int, _Partial] = {}
        self.acked: dict[int, int] = {}  # seq -> fragments the far side confirmed, while sending it


class _UdpEndpoint:
    """What listener and connection share: one socket, framing, reassembly, acknowledgements."""

    def __init__(self, sock: socket.socket, datagram_bytes: int, limit: int, reassembly_timeout_s: float,
                 give_up_s: float) -> None:
        self._sock = sock
        self._fragment = datagram_bytes - _HEADER.size
        self._limit = limit
        self._reassembly_timeout = reassembly_timeout_s
        self._give_up = give_up_s
        self._buffer = bytearray(65536)
        self._view = memoryview(self._buffer)
        self._timeout: float | None = -1.0
        self._inbox: collections.deque[tuple[_Peer, memoryview]] = collections.deque()
        self._last_expiry = time.monotonic()
        self._stats = new_stats(fragments_sent=0, fragments_received=0, retransmits=0, reassembly_timeouts=0,
                                send_abandoned=0, duplicates=0, malformed=0)

    # -- subclass hooks -----------------------------------------------------------------------
    def _peer_for(self, addr: Any) -> _Peer | None:
        raise NotImplementedError

    def _control(self, kind: int, addr: Any, index: int) -> None:
        raise NotImplementedError

    def _all_peers(self) -> list[_Peer]:
        raise NotImplementedError

    # -- sending ------------------------------------------------------------------------------
    def _sendmsg(self, buffers: list[Any], addr: Any) -> None:
        while True:
            try:
                self._sock.sendmsg(buffers, [], 0, addr)
                return
            except (BlockingIOError, socket.timeout):  # send buffer full while a receive timeout is set
                select.select([], [self._sock], [], 0.05)

    def _send_control(self, kind: int, addr: Any, seq: int = 0, index: int = 0, count: int = 0) -> None:
        self._sendmsg([_HEADER.pack(_MAGIC, _VERSION, kind, seq, index, count, 0, 0)], addr)

    def _send_message(self, peer: _Peer, parts: tuple[Any, ...]) -> None:
        views, total = byte_views(parts)
        check_size(total, self._limit, "udp")
        seq = peer.send_seq
        peer.send_seq = (seq + 1) & 0xFFFFFFFF
        stats = self._stats
        fragment = self._fragment
        if total <= fragment:
            self._sendmsg([_HEADER.pack(_MAGIC, _VERSION, _DATA, seq, 0, 1, total, fragment), *views], peer.addr)
            stats["fragments_sent"] += 1
        elif not self._send_windowed(peer, seq, views, total):
            stats["send_abandoned"] += 1
            return
        stats["messages_sent"] += 1
        stats["bytes_sent"] += total

    def _send_windowed(self, peer: _Peer, seq: int, views: list[memoryview], total: int) -> bool:
        fragment = self._fragment
        count = -(-total // fragment)
        stats = self._stats
        peer.acked[seq] = 0

        def send_fragment(index: int) -> None:
            start = index * fragment
            length = min(fragment, total - start)
            header = _HEADER.pack(_MAGIC, _VERSION, _DATA, seq, index, count, total, fragment)
            self._sendmsg([header, *slice_views(views, start, length)], peer.addr)
            stats["fragments_sent"] += 1

        try:
            next_index = 0
            rto = _RTO_S
            last_progress = last_sent = time.monotonic()
            while True:
                acked = peer.acked[seq]
                if acked >= count:
                    return True
                while next_index < min(count, acked + _WINDOW):
                    send_fragment(next_index)
                    next_index += 1
                    last_sent = time.monotonic()
                self.pump(rto)
                now = time.monotonic()
                if peer.acked[seq] > acked:
                    last_progress = now
                    rto = _RTO_S
                elif now - last_sent > rto:
                    if now - last_progress > self._give_up:
                        return False
                    for index in range(acked, next_index):  # go back to the first unacknowledged
                        send_fragment(index)
                        stats["retransmits"] += 1
                    last_sent = time.monotonic()
                    rto = min(_MAX_RTO_S, rto * 2)
        finally:
            del peer.acked[seq]

    # -- receiving ----------------------------------------------------------------------------
    def _set_timeout(self, timeout: float | None) -> None:
        if timeout != self._timeout:  # settimeout costs a syscall; only when it changes
            self._sock.settimeout(timeout)
            self._timeout = timeout

    def pump(self, timeout: float | None) -> bool:
        """Receive and handle one datagram; False if none came within `timeout`."""
        self._set_timeout(timeout)
        try:
            n, addr = self._sock.recvfrom_into(self._buffer)
        except (socket.timeout, BlockingIOError):
            self._expire()
            return False
        except ConnectionRefusedError:  # ICMP port unreachable from an earlier send: the far side is gone
            self._control(_BYE, None, 0)
            return True
        if n < _HEADER.size:
            self._stats["malformed"] += 1
            return True
        magic, version, kind, seq, index, count, total, fragment = _HEADER.unpack_from(self._buffer)
        if magic != _MAGIC or version != _VERSION:
            self._stats["malformed"] += 1
            return True
        if kind != _DATA:
            if kind == _ACK:
                peer = self._peer_for(addr)
                if peer is not None and seq in peer.acked:
                    peer.acked[seq] = max(peer.acked[seq], index)
            else:
                self._control(kind, addr, index)
            return True
        peer = self._peer_for(addr)
        if peer is None:
            self._stats["malformed"] += 1
            return True
        self._stats["fragments_received"] += 1
        self._on_fragment(peer, seq, index, count, total, fragment, self._view[_HEADER.size:n])
        if time.monotonic() - self._last_expiry > 0.1:
            self._expire()
        return True

    def _on_fragment(self, peer: _Peer, seq: int, index: int, count: int, total: int, fragment: int,
                     payload: memoryview) -> None:
        behind = (peer.expected - seq) & 0xFFFFFFFF
        if 0 < behind < 0x80000000:  # already delivered or counted lost: a duplicate
            self._stats["duplicates"] += 1
            if count > 1:  # our last ack may have been lost; confirm again so the sender stops
                self._send_control(_ACK, peer.addr, seq, count, count)
            return
        if count == 1:
            self._deliver(peer, seq, memoryview(bytes(payload)))
            return
        partial = peer.partials.get(seq)
        if partial is None:
            partial = peer.partials[seq] = _Partial(total, count)
        duplicate = index >= count or bool(partial.seen[index])
        if not duplicate:
            partial.seen[index] = 1
            partial.have += 1
            start = index * fragment
            partial.buffer[start:start + payload.nbytes] = payload
            partial.touched = time.monotonic()
            while partial.contiguous < count and partial.seen[partial.contiguous]:
                partial.contiguous += 1
        else:
            self._stats["duplicates"] += 1
        if partial.have == count:
            del peer.partials[seq]
            self._deliver(peer, seq, memoryview(partial.buffer))
            self._send_control(_ACK, peer.addr, seq, count, count)
        elif duplicate or (index + 1) % _ACK_EVERY == 0 or index + 1 == count:
            self._send_control(_ACK, peer.addr, seq, partial.contiguous, count)

    def _deliver(self, peer: _Peer, seq: int, message: memoryview) -> None:
        skipped = (seq - peer.expected) & 0xFFFFFFFF
        if skipped:  # every message between is lost (an unfinished reassembly among them too)
            self._stats["lost"] += skipped
            for stale in [s for s in peer.partials if ((seq - s) & 0xFFFFFFFF) < 0x80000000]:
                del peer.partials[stale]
        peer.expected = (seq + 1) & 0xFFFFFFFF
        self._inbox.append((peer, message))

    def _expire(self) -> None:
        """Reassemblies that stopped making progress are lost (counted), not waited for forever."""
        now = self._last_expiry = time.monotonic()
        for peer in self._all_peers():
            for seq, partial in list(peer.partials.items()):
                if now - partial.touched > self._reassembly_timeout:
                    del peer.partials[seq]
                    self._stats["reassembly_timeouts"] += 1
                    ahead = (seq - peer.expected) & 0xFFFFFFFF
                    if ahead < 0x80000000:
                        self._stats["lost"] += ahead + 1
                        peer.expected = (seq + 1) & 0xFFFFFFFF

    def _next(self, timeout: float | None) -> tuple[_Peer, memoryview] | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._inbox:
            if self._closed_by_far_side():
                raise TransportClosedError("udp: the other side closed")
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self.pump(remaining) and remaining is not None and remaining <= 0:
                return None
        peer, message = self._inbox.popleft()
        self._stats["messages_received"] += 1
        self._stats["bytes_received"] += message.nbytes
        return peer, message

    def _closed_by_far_side(self) -> bool:
        return False

    @property
    def stats(self) -> dict[str, int]:
        return dict(self._stats)


class UdpConnection(RequestReply, _UdpEndpoint):
    scheme = "udp"

    def __init__(self, sock: socket.socket, server: Any, address: str, **options: Any) -> None:
        super().__init__(sock, **options)
        self._address = address
        self._server = _Peer(0, server)
        self._far_closed = False
        self._closed = False

    def _peer_for(self, addr: Any) -> _Peer | None:
        return self._server  # the socket is connected: only the listener's datagrams arrive

    def _all_peers(self) -> list[_Peer]:
        return [self._server]

    def _control(self, kind: int, addr: Any, index: int) -> None:
        if kind == _BYE:  # a goodbye, or ICMP port unreachable: nobody listens there
            self._far_closed = True
        elif kind == _WELCOME:
            self._server.id = index

    def _closed_by_far_side(self) -> bool:
        return self._far_closed

    def _hello(self) -> None:
        """Announce ourselves without waiting: the listener also learns a peer from its first data
        datagram, and waiting for an answer would deadlock a thread that connects, then serves."""
        self._send_control(_HELLO, self._server.addr)

    def send(self, *parts: Any) -> None:
        if self._closed or self._far_closed:
            raise TransportClosedError(f"udp connection to {self._address} is closed")
        self._send_message(self._server, parts)

    def recv(self, timeout: float | None = None) -> memoryview | None:
        if self._closed:
            raise TransportClosedError(f"udp connection to {self._address} is closed")
        item = self._next(timeout)
        return None if item is None else item[1]

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                self._send_control(_BYE, self._server.addr)
            except OSError:
                pass
            self._sock.close()


class UdpListener(_UdpEndpoint):
    def __init__(self, sock: socket.socket, address: str, **options: Any) -> None:
        super().__init__(sock, **options)
        self.address = address
        self._by_addr: dict[Any, _Peer] = {}
        self._by_id: dict[int, _Peer] = {}
        self._next_peer = itertools.count(1)
        self._closed = False

    def _peer_for(self, addr: Any) -> _Peer | None:
        peer = self._by_addr.get(addr)
        return peer if peer is not None else self._join(addr)

    def _join(self, addr: Any) -> _Peer:
        peer = _Peer(next(self._next_peer), addr)
        self._by_addr[addr] = self._by_id[peer.id] = peer
        return peer

    def _all_peers(self) -> list[_Peer]:
        return list(self._by_id.values())

    def _control(self, kind: int, addr: Any, index: int) -> None:
        if kind == _HELLO:
            peer = self._peer_for(addr)
            self._send_control(_WELCOME, addr, index=peer.id)
        elif kind == _BYE and addr in self._by_addr:
            peer = self._by_addr.pop(addr)
            del self._by_id[peer.id]

    def recv(self, timeout: float | None = None) -> tuple[int, memoryview] | None:
        if self._closed:
            raise TransportClosedError(f"udp listener {self.address} is closed")
        item = self._next(timeout)
        return None if item is None else (item[0].id, item[1])

    def send(self, peer: int, *parts: Any) -> None:
        target = self._by_id.get(peer)
        if target is None:
            raise TransportClosedError(f"udp: peer {peer} is not connected to {self.address}")
        self._send_message(target, parts)

    @property
    def peers(self) -> list[int]:
        return list(self._by_id)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for peer in self._by_id.values():
            try:
                self._send_control(_BYE, peer.addr)
            except OSError:
                pass
        self._sock.close()


class UdpTransport:
    capabilities = TransportCapabilities(max_message_bytes=64 << 20, reliable=False, ordered=True,
                                         crosses_processes=True, crosses_hosts=True)

    def __init__(self, datagram_bytes: int = 8192, reassembly_timeout_s: float = 1.0, give_up_s: float = 2.0) -> None:
        if not 512 <= datagram_bytes <= 65507:
            raise RlbenchError(f"udp datagram_bytes must be within 512..65507, got {datagram_bytes}")
        self._options = dict(datagram_bytes=datagram_bytes, limit=self.capabilities.max_message_bytes,
                             reassembly_timeout_s=reassembly_timeout_s, give_up_s=give_up_s)

    @staticmethod
    def _socket(family: int) -> socket.socket:
        sock = socket.socket(family, socket.SOCK_DGRAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _RCVBUF)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _RCVBUF)
        return sock

    def listen(self, address: str | None = None) -> UdpListener:
        host, port = host_port(address or "udp://127.0.0.1:0", "udp")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = self._socket(family)
        sock.bind((host, port))
        shown = f"[{host}]" if family == socket.AF_INET6 else host
        return UdpListener(sock, f"udp://{shown}:{sock.getsockname()[1]}", **self._options)

    def connect(self, address: str, timeout: float = 10.0) -> UdpConnection:
        host, port = host_port(address, "udp")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = self._socket(family)
        sock.connect((host, port))
        connection = UdpConnection(sock, sock.getpeername(), address, **self._options)
        connection._hello()
        return connection
