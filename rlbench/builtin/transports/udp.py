"""Kernel UDP with a small header, fragmentation and loss detection (reliable=False).

Every datagram carries [magic u16, version u8, kind u8, message seq u32, fragment index u32,
fragment count u32, total length u32, fragment size u32]. A message that fits one datagram is sent
once, as is. A larger one is cut into fragments sent in a sliding window; the receiver acknowledges
every few fragments (cumulatively) and the sender retransmits what a timeout leaves unacknowledged,
so bulk transfers do not simply overrun the receive buffer. The sender finishes (or abandons) one
message before starting the next, so messages arrive in order.

Loss is counted, never silent: per peer, the receiver expects sequence numbers in order; a gap, or a
reassembly that makes no progress for `reassembly_timeout_s`, adds to stats["lost"]. The invariant
the conformance kit checks is received + lost == sent. A sequence number is a claim too: one more
than _MAX_GAP ahead of what the receiver expects is `malformed` and changes nothing (one datagram
cannot throw a peer's sequence far off), and the gaps within that are bounded in total, not per
datagram: a peer's gaps count as lost against the messages it delivered (or had refused) that no gap
claimed yet, and beyond those against one window of _MAX_GAP messages that every peer of this side
shares for its whole life (so leaving and coming back earns nothing). A gap past what is left is a
sequence reset (stats["sequence_resets"]): its message is delivered, the peer's sequence goes on from
it, and nothing is added to `lost`. So `lost` never exceeds what was received, refused or given up in
reassembly by more than _MAX_GAP, however a peer numbers its messages (40,000 datagrams jumping by
65,536 once added 2.6e9); an honest peer that loses at most as many messages as arrive never draws on
the window, and received + lost == sent holds exactly unless `sequence_resets` says otherwise.

udp trusts the network path. A datagram carries no MAC: a run's roles prove their keys in the replay
node's HELLO / CHALLENGE / AUTH exchange, but what follows is taken as from the peer whose address and
port it comes from, so anyone who can send from (or spoof) that address can inject into the peer's
authenticated session. tcp is no better against an attacker on the path, but an off-path sender must
guess its sequence numbers; here it need not. So `listen_address` (where a run's replay node listens:
--bind, a cluster launcher) refuses any address off loopback unless `trust_network` accepts this.

A header is a claim, checked before anything is kept: a datagram whose fields do not add up is
`malformed`; a message whose total exceeds the receiving side's max_message_bytes is refused
(`refused_oversize`, not lost) and the sender is told (a REFUSE datagram), so its `send` raises
MessageTooLargeError. Reassembly holds only the fragments that arrived: in order they extend the
message's buffer, ahead of a gap they wait apart. Its memory is bounded three ways: at most two
messages in reassembly per peer (a sender finishes one before the next), at most
`max_reassembly_bytes` held in all (the reassembly touched longest ago is given up, counted lost and
in `reassembly_evictions`), and at most `max_peers` peers known to a listener (the one heard from
longest ago is forgotten, counted in `evicted_peers`). A forgotten peer that sends again is taken back
under a new id: the listener counts its sequence from that message on and welcomes it with the new id,
which tells the connection that the listener's own sequence to it starts over.

A HELLO from anyone makes a peer, so in admission mode (`expect_admission`, kit.framing.Strangers) a
peer not admitted yet is a stranger, told BYE when shed: strangers are at most max_strangers (a
newcomer past that sheds one, those that sent no data first), none silent past handshake_s or
unadmitted handshake_s after its first data, and at max_peers a newcomer sheds a stranger, never an
admitted peer: with every place an admitted peer's, the newcomer itself is turned away (all counted
in strangers_shed). 1,100 strangers' HELLOs once evicted an authenticated actor this way.
"""

from __future__ import annotations

import collections
import ipaddress
import itertools
import select
import selectors
import socket
import struct
import time
from typing import Any

from rlbench.builtin import capabilities as caps
from rlbench.errors import RlbenchError
from rlbench.kit.checks import positive_int
from rlbench.kit.framing import (
    ADMISSION_COUNTERS,
    AddressError,
    MessageTooLargeError,
    RequestReply,
    SlowConsumerError,
    Strangers,
    TransportClosedError,
    byte_views,
    check_size,
    host_port,
    joined,
    listener_closed,
    listener_stats,
    message_limit,
    not_connected,
    queued_bytes_limit,
    slice_views,
)

_HEADER = struct.Struct("<HBBIIIII")
_MAGIC, _VERSION = 0x5242, 1
_DATA, _ACK, _HELLO, _WELCOME, _BYE, _REFUSE = range(6)
_MIN_DATAGRAM, _MAX_DATAGRAM = 512, 65507
_MIN_FRAGMENT, _MAX_FRAGMENT = _MIN_DATAGRAM - _HEADER.size, _MAX_DATAGRAM - _HEADER.size
_PARTIALS_PER_PEER = 2  # the message being sent, and one its sender gave up on
_REFUSED = -1  # peer.acked[seq] once the far side refused the message
_WINDOW = 32  # fragments in flight per message
_ACK_EVERY = 8  # the receiver acknowledges every this many fragments (and the last)
_RTO_S, _MAX_RTO_S = 0.02, 0.2
_RCVBUF = 4 << 20
# How far one datagram may jump ahead in its peer's sequence, and the most messages the peers of one
# side may claim lost beyond what they delivered, all together: far more than a burst loss of a sender
# that waits for replies.
_MAX_GAP = 1 << 16
_PUMP_ON_SEND = 256  # datagrams a listener's send handles before it queues a message behind a send under way
_PEER_RCVBUF = 1 << 20  # the kernel's queue for one peer's socket (a listener's)
_SELECT_EVERY = 32  # datagrams a listener takes between looks for newly readable sockets


class _Partial:
    """A message being reassembled: fragments 0..contiguous-1 in `buffer`, later ones in `ahead`."""

    __slots__ = ("buffer", "ahead", "contiguous", "count", "total", "fragment", "held", "touched")

    def __init__(self, total: int, count: int, fragment: int) -> None:
        self.buffer = bytearray()
        self.ahead: dict[int, bytes] = {}  # fragments that came before an earlier one
        self.contiguous = 0
        self.count = count
        self.total = total
        self.fragment = fragment
        self.held = 0  # bytes in buffer and ahead
        self.touched = time.monotonic()

    def add(self, index: int, payload: memoryview) -> bool:
        """Keep one fragment; False when it is a duplicate."""
        if index < self.contiguous or index in self.ahead:
            return False
        if index == self.contiguous:
            self.buffer += payload
            self.contiguous += 1
            while self.contiguous in self.ahead:
                self.buffer += self.ahead.pop(self.contiguous)
                self.contiguous += 1
        else:
            self.ahead[index] = bytes(payload)
        self.held += payload.nbytes
        self.touched = time.monotonic()
        return True


class _Transfer:
    """A listener's windowed send of one message, advanced as acknowledgements come (never waited for)."""

    __slots__ = ("seq", "data", "count", "next_index", "acked", "rto", "last_sent", "last_progress")

    def __init__(self, seq: int, data: bytes, count: int) -> None:
        self.seq = seq
        self.data = memoryview(data)
        self.count = count
        self.next_index = 0
        self.acked = 0
        self.rto = _RTO_S
        self.last_sent = self.last_progress = time.monotonic()


class _Peer:
    __slots__ = ("id", "addr", "send_seq", "expected", "credit", "partials", "acked", "refused", "far_limit", "heard",
                 "waiting", "queued", "transfer", "sock")

    def __init__(self, peer_id: int, addr: Any) -> None:
        self.id = peer_id
        self.addr = addr
        self.send_seq = 0
        self.expected = 0  # the next sequence number not yet delivered or counted lost
        self.credit = 0  # messages it delivered that no gap claimed as lost yet (_claim_gap)
        self.partials: dict[int, _Partial] = {}
        self.acked: dict[int, int] = {}  # seq -> fragments the far side confirmed, while sending it
        self.refused: int | None = None  # the last seq we refused from this peer
        self.far_limit = 0  # the max_message_bytes its last REFUSE gave
        self.heard = time.monotonic()
        # a listener's messages to this peer behind the one being sent (windowed), and that one
        self.waiting: collections.deque[bytes] = collections.deque()
        self.queued = 0
        self.transfer: _Transfer | None = None
        self.sock: socket.socket | None = None  # a listener's socket connected to this peer alone


class _UdpEndpoint:
    """What listener and connection share: one socket, framing, reassembly, acknowledgements."""

    def __init__(self, sock: socket.socket, datagram_bytes: int, limit: int, reassembly_timeout_s: float,
                 give_up_s: float, max_reassembly_bytes: int, max_peers: int) -> None:
        self._sock = sock
        self._fragment = datagram_bytes - _HEADER.size
        self._limit = limit
        self._reassembly_timeout = reassembly_timeout_s
        self._give_up = give_up_s
        self._max_reassembly = max_reassembly_bytes
        self._max_peers = max_peers
        self._reassembling = 0  # bytes held by every peer's partials
        self._buffer = bytearray(65536)
        self._view = memoryview(self._buffer)
        self._timeout: float | None = -1.0
        self._inbox: collections.deque[tuple[_Peer, memoryview]] = collections.deque()
        self._last_expiry = time.monotonic()
        self._stats = listener_stats(fragments_sent=0, fragments_received=0, retransmits=0, reassembly_timeouts=0,
                                     reassembly_evictions=0, evicted_peers=0, send_abandoned=0, refused_by_peer=0,
                                     duplicates=0, sequence_resets=0)
        self._spare_gap = _MAX_GAP  # what gaps may claim beyond the peers' credit, all peers, for good

    # -- subclass hooks -----------------------------------------------------------------------
    def _peer_for(self, addr: Any, seq: int) -> _Peer | None:
        """The peer whose data datagram (of message `seq`) came from `addr`: a listener also learns
        peers from their data (a lost hello, or a peer it had forgotten)."""
        raise NotImplementedError

    def _known_peer(self, addr: Any) -> _Peer | None:
        raise NotImplementedError

    def _control(self, kind: int, addr: Any, index: int) -> None:
        raise NotImplementedError

    def _all_peers(self) -> list[_Peer]:
        raise NotImplementedError

    def _acknowledged(self, peer: _Peer) -> None:
        """An ACK or REFUSE for a message being sent to `peer` came (a listener moves its send on)."""

    # -- sending ------------------------------------------------------------------------------
    def _sendmsg(self, buffers: list[Any], addr: Any) -> None:
        while True:
            try:
                self._sock.sendmsg(buffers, [], 0, addr)
                return
            except (BlockingIOError, socket.timeout):  # send buffer full while a receive timeout is set
                select.select([], [self._sock], [], 0.05)

    def _send_control(self, kind: int, addr: Any, seq: int = 0, index: int = 0, count: int = 0, total: int = 0) -> None:
        self._sendmsg([_HEADER.pack(_MAGIC, _VERSION, kind, seq, index, count, total, 0)], addr)

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
                if acked == _REFUSED:
                    stats["refused_by_peer"] += 1
                    raise MessageTooLargeError(f"udp: {peer.addr} refused a message of {total} bytes: over its "
                                               f"max_message_bytes={peer.far_limit}")
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

    def _receive(self, timeout: float | None) -> tuple[int, Any] | None:
        """(bytes, sender) of the next datagram in self._buffer, None when none came within `timeout`;
        (-1, sender) when the kernel reported the sender gone (ICMP port unreachable)."""
        self._set_timeout(timeout)
        try:
            return self._sock.recvfrom_into(self._buffer)
        except (socket.timeout, BlockingIOError):
            return None
        except ConnectionRefusedError:  # ICMP port unreachable from an earlier send: the far side is gone
            return -1, None

    def pump(self, timeout: float | None) -> bool:
        """Receive and handle one datagram; False if none came within `timeout`."""
        got = self._receive(timeout)
        if got is None:
            self._expire()
            return False
        n, addr = got
        if n < 0:
            self._control(_BYE, addr, 0)
            return True
        if n < _HEADER.size:
            self._stats["malformed"] += 1
            return True
        magic, version, kind, seq, index, count, total, fragment = _HEADER.unpack_from(self._buffer)
        if magic != _MAGIC or version != _VERSION or kind > _REFUSE:
            self._stats["malformed"] += 1
            return True
        if kind == _ACK or kind == _REFUSE:
            peer = self._known_peer(addr)  # only a peer we send to acknowledges; nobody new joins by it
            if peer is not None:
                peer.heard = time.monotonic()
            if peer is not None and seq in peer.acked and peer.acked[seq] != _REFUSED:
                if kind == _ACK:
                    peer.acked[seq] = max(peer.acked[seq], index)
                else:
                    peer.acked[seq], peer.far_limit = _REFUSED, total
                self._acknowledged(peer)
        elif kind != _DATA:
            self._control(kind, addr, index)
        else:
            peer = self._peer_for(addr, seq)
            if peer is not None:
                peer.heard = time.monotonic()
                self._stats["fragments_received"] += 1
                self._on_fragment(peer, seq, index, count, total, fragment, self._view[_HEADER.size:n])
        if time.monotonic() - self._last_expiry > 0.1:
            self._expire()
        return True

    def _on_fragment(self, peer: _Peer, seq: int, index: int, count: int, total: int, fragment: int,
                     payload: memoryview) -> None:
        behind = (peer.expected - seq) & 0xFFFFFFFF
        if 0 < behind < 0x80000000:  # already delivered, refused or counted lost: a duplicate
            self._stats["duplicates"] += 1
            if seq == peer.refused:  # our refusal may have been lost; say it again so the sender stops
                self._send_control(_REFUSE, peer.addr, seq, total=self._limit)
            elif count > 1:  # our last ack may have been lost; confirm again so the sender stops
                self._send_control(_ACK, peer.addr, seq, count, count)
            return
        if ((seq - peer.expected) & 0xFFFFFFFF) > _MAX_GAP:  # one datagram must not throw the sequence off
            self._stats["malformed"] += 1
            return
        size = payload.nbytes
        if count == 1:
            if index or total != size:
                self._stats["malformed"] += 1
            elif total > self._limit:
                self._refuse(peer, seq)
            else:
                self._deliver(peer, seq, memoryview(bytes(payload)))
            return
        if (not _MIN_FRAGMENT <= fragment <= _MAX_FRAGMENT or count != -(-total // fragment) or index >= count
                or size != (fragment if index + 1 < count else total - (count - 1) * fragment)):
            self._stats["malformed"] += 1
            return
        if total > self._limit:
            self._refuse(peer, seq)
            return
        partial = peer.partials.get(seq)
        if partial is None:
            if len(peer.partials) >= _PARTIALS_PER_PEER:  # its sender moved on twice: the oldest will not finish
                self._give_up_partial(peer, min(peer.partials, key=lambda s: (s - peer.expected) & 0xFFFFFFFF),
                                      "reassembly_evictions")
            partial = peer.partials[seq] = _Partial(total, count, fragment)
        elif (partial.total, partial.count, partial.fragment) != (total, count, fragment):
            self._stats["malformed"] += 1  # a fragment that disagrees with the ones before it
            return
        self._make_room(size, partial)
        duplicate = not partial.add(index, payload)
        if duplicate:
            self._stats["duplicates"] += 1
        else:
            self._reassembling += size
        if partial.contiguous == count:
            del peer.partials[seq]
            self._reassembling -= partial.held
            self._deliver(peer, seq, memoryview(partial.buffer))
            self._send_control(_ACK, peer.addr, seq, count, count)
        elif duplicate or (index + 1) % _ACK_EVERY == 0 or index + 1 == count:
            self._send_control(_ACK, peer.addr, seq, partial.contiguous, count)

    def _make_room(self, size: int, keep: _Partial) -> None:
        """Give up the reassemblies touched longest ago until `size` more bytes fit under the cap (which
        is at least max_message_bytes, so `keep` alone always fits)."""
        while self._reassembling + size > self._max_reassembly:
            oldest = min(((partial.touched, peer, seq) for peer in self._all_peers()
                          for seq, partial in peer.partials.items() if partial is not keep),
                         default=None, key=lambda entry: entry[0])
            if oldest is None:
                return
            self._give_up_partial(oldest[1], oldest[2], "reassembly_evictions")

    def _refuse(self, peer: _Peer, seq: int) -> None:
        """A message over our limit: counted once, its place in the sequence taken, the sender told."""
        self._stats["refused_oversize"] += 1
        self._settle(peer, seq)
        peer.refused = seq
        self._send_control(_REFUSE, peer.addr, seq, total=self._limit)

    def _settle(self, peer: _Peer, seq: int) -> None:
        """`seq` is dealt with (delivered or refused): every message before it that is not is lost, as
        far as the peer may claim so (_claim_gap)."""
        peer.credit += 1
        skipped = (seq - peer.expected) & 0xFFFFFFFF
        if skipped:  # every message between is lost (an unfinished reassembly among them too)
            stale = [s for s in peer.partials if ((seq - s) & 0xFFFFFFFF) < 0x80000000]
            for s in stale:
                self._reassembling -= peer.partials.pop(s).held
            if not self._claim_gap(peer, skipped):
                self._stats["lost"] += len(stale)  # a reset: these did arrive, in part
        peer.expected = (seq + 1) & 0xFFFFFFFF

    def _claim_gap(self, peer: _Peer, gap: int) -> bool:
        """Count `gap` messages the peer skipped as lost where it may claim them (the module's rule):
        against its credit first, then the window all peers share; past that, False: a sequence reset."""
        own = min(peer.credit, gap)
        drawn = gap - own
        if drawn > self._spare_gap:
            self._stats["sequence_resets"] += 1
            return False
        peer.credit -= own
        self._spare_gap -= drawn
        self._stats["lost"] += gap
        return True

    def _deliver(self, peer: _Peer, seq: int, message: memoryview) -> None:
        self._settle(peer, seq)
        self._inbox.append((peer, message))

    def _give_up_partial(self, peer: _Peer, seq: int, counter: str) -> None:
        """A reassembly that will not finish is lost (counted, with every message before it), not waited for."""
        self._reassembling -= peer.partials.pop(seq).held
        self._stats[counter] += 1
        ahead = (seq - peer.expected) & 0xFFFFFFFF
        if ahead < 0x80000000:
            self._claim_gap(peer, ahead)
            self._stats["lost"] += 1  # this one: its fragments came
            peer.expected = (seq + 1) & 0xFFFFFFFF

    def _forget(self, peer: _Peer) -> None:
        """A peer we stop tracking: what it was still sending is lost."""
        for seq in list(peer.partials):
            self._give_up_partial(peer, seq, "reassembly_evictions")

    def _expire(self) -> None:
        """Reassemblies that stopped making progress are lost (counted), not waited for forever."""
        now = self._last_expiry = time.monotonic()
        for peer in self._all_peers():
            for seq, partial in list(peer.partials.items()):
                if now - partial.touched > self._reassembly_timeout and seq in peer.partials:
                    self._give_up_partial(peer, seq, "reassembly_timeouts")

    def _next(self, timeout: float | None) -> tuple[_Peer, memoryview] | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._inbox:
            if self._closed_by_far_side():
                raise TransportClosedError("udp: the other side closed")
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if self._busy():  # wake for the retransmission timers of sends under way
                self._tick()
                remaining = _RTO_S if remaining is None else min(remaining, _RTO_S)
            if not self.pump(remaining) and deadline is not None and time.monotonic() >= deadline:
                return None
        peer, message = self._inbox.popleft()
        self._stats["messages_received"] += 1
        self._stats["bytes_received"] += message.nbytes
        return peer, message

    def _closed_by_far_side(self) -> bool:
        return False

    def _busy(self) -> bool:
        """Sends under way that need this side's timers (a listener's)."""
        return False

    def _tick(self) -> None:
        """Move sends under way on (a listener's)."""

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

    def _peer_for(self, addr: Any, seq: int) -> _Peer | None:
        return self._server  # the socket is connected: only the listener's datagrams arrive

    def _known_peer(self, addr: Any) -> _Peer | None:
        return self._server

    def _all_peers(self) -> list[_Peer]:
        return [self._server]

    def _control(self, kind: int, addr: Any, index: int) -> None:
        if kind == _BYE:  # a goodbye, or ICMP port unreachable: nobody listens there
            self._far_closed = True
        elif kind == _WELCOME:
            if self._server.id and index != self._server.id:
                # The listener had forgotten us (too many peers) and took us back under a new id: its
                # sequence numbers to us start over. What was in reassembly from before is lost.
                self._forget(self._server)
                self._server.expected = 0
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
    """Sends never wait on a peer: a message of several fragments is sent in its window as the
    peer's acknowledgements come in, during later calls (`_advance`), and what is sent after it
    waits behind it, bounded per peer by `max_queued_bytes` (kit.framing's slow-consumer rule).

    Receives are isolated per peer: every known peer gets a socket of its own, bound to the
    listener's address (SO_REUSEPORT) and connected to the peer, so the kernel queues its datagrams
    apart; datagrams are taken from the sockets in turn. A peer that floods fills its own queue and
    loses its own datagrams, not another peer's (with one shared socket, its flood made the kernel
    drop everyone's). The shared socket receives only from peers not known yet. Where a socket
    cannot be made (out of descriptors), that peer is served through the shared one."""

    def __init__(self, sock: socket.socket, address: str, *, max_queued_bytes: int, **options: Any) -> None:
        super().__init__(sock, **options)
        sock.setblocking(False)
        self.address = address
        self._selector = selectors.DefaultSelector()
        self._selector.register(sock, selectors.EVENT_READ)
        self._turns: collections.deque[socket.socket] = collections.deque()  # readable sockets, in turn
        # The sockets in turn, by object: a closed socket's descriptor number is soon another's, and a
        # set of numbers kept a new peer's socket out of turn (its datagrams unread for seconds).
        self._in_turn: set[socket.socket] = set()
        self._owner: dict[socket.socket, _Peer] = {}  # the peer a socket is connected to
        # Sockets of peers that left, kept until read dry: what is queued in one may come from a new
        # connection at the same address (a reused port), which takes the socket over when it joins.
        self._retiring: dict[Any, socket.socket] = {}
        self._retired_from: dict[socket.socket, Any] = {}  # the same, by socket
        self._since_select = 0
        self._by_addr: dict[Any, _Peer] = {}
        self._by_id: dict[int, _Peer] = {}
        self._next_peer = itertools.count(1)
        self._closed = False
        self._max_queued = max_queued_bytes
        self._sending: dict[int, _Peer] = {}  # peers with a windowed send under way or messages waiting
        self._stats["slow_consumers"] = 0
        self._stats["shared_socket_peers"] = 0  # peers served through the shared socket (no socket of their own)
        self._strangers = Strangers()
        self._stats.update(dict.fromkeys(ADMISSION_COUNTERS, 0))

    def _peer_for(self, addr: Any, seq: int) -> _Peer | None:
        peer = self._by_addr.get(addr)
        if peer is None:  # its history is unknown to us: its sequence starts where it is
            peer = self._join(addr)
            if peer is not None:
                peer.expected = seq
        if peer is not None and self._strangers.on:
            self._strangers.heard(peer.id)
        return peer

    def _known_peer(self, addr: Any) -> _Peer | None:
        return self._by_addr.get(addr)

    def _join(self, addr: Any) -> _Peer | None:
        """A new peer, welcomed with its id (a peer we had forgotten learns from it that our sequence
        numbers to it start over); in admission mode a stranger, and None when every place is an
        admitted peer's (it is told BYE)."""
        strangers = self._strangers
        if len(self._by_id) >= self._max_peers:
            if not strangers.on:  # forget the peer heard from longest ago
                idle = min(self._by_id.values(), key=lambda peer: peer.heard)
                self._leave(idle)
                self._stats["evicted_peers"] += 1
            elif (oldest := strangers.oldest()) is not None:
                self._shed(self._by_id[oldest], "strangers_shed")
            else:  # a stranger never takes an admitted peer's place
                self._stats["strangers_shed"] += 1
                self._send_control(_BYE, addr)
                return None
        peer = _Peer(next(self._next_peer), addr)
        self._by_addr[addr] = self._by_id[peer.id] = peer
        peer.sock = self._retiring.pop(addr, None)
        if peer.sock is not None:
            del self._retired_from[peer.sock]
        else:
            peer.sock = self._own_socket(addr)
            if peer.sock is not None:
                self._selector.register(peer.sock, selectors.EVENT_READ)
        if peer.sock is not None:
            self._owner[peer.sock] = peer
        self._send_control(_WELCOME, addr, index=peer.id)
        crowded = strangers.join(peer.id)
        if crowded is not None:
            self._shed(self._by_id[crowded], "strangers_shed")
        return peer

    def expect_admission(self, *, handshake_s: float, max_strangers: int) -> None:
        """Keep peers apart until `admit`ted (the Listener protocol's admission mode); those known
        already are strangers from now on."""
        self._strangers.expect(handshake_s, max_strangers, "udp")
        for peer in list(self._by_id):
            crowded = self._strangers.join(peer)
            if crowded is not None:
                self._shed(self._by_id[crowded], "strangers_shed")

    def admit(self, peer: int) -> None:
        """The peer proved who it is: no stranger from now on (nor evicted for one)."""
        self._strangers.admit(peer)

    def _shed(self, peer: _Peer, counter: str) -> None:
        """Forget a stranger, counted under `counter`; it is told BYE."""
        self._stats[counter] += 1
        self._leave(peer)
        try:
            self._send_control(_BYE, peer.addr)
        except OSError:
            pass

    def _expire(self) -> None:
        super()._expire()
        if self._strangers and not self._inbox:  # (a stranger's message in the inbox waits for this side)
            while (late := self._strangers.overdue()) is not None:
                self._shed(self._by_id[late], "handshake_timeouts")

    def _own_socket(self, addr: Any) -> socket.socket | None:
        """A socket for one peer: the listener's address, connected to the peer (None if the system
        will not make one: that peer shares the listener's socket)."""
        sock = None
        try:
            sock = socket.socket(self._sock.family, socket.SOCK_DGRAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _PEER_RCVBUF)
            sock.bind(self._sock.getsockname())
            sock.connect(addr)
            sock.setblocking(False)
            return sock
        except OSError:
            if sock is not None:
                sock.close()
            self._stats["shared_socket_peers"] += 1
            return None

    def _leave(self, peer: _Peer) -> None:
        del self._by_addr[peer.addr], self._by_id[peer.id]
        self._strangers.leave(peer.id)
        self._forget(peer)
        if peer.sock is not None:
            del self._owner[peer.sock]
            self._retiring[peer.addr], self._retired_from[peer.sock] = peer.sock, peer.addr
            self._put_in_turn(peer.sock)  # read it dry: it may hold a newcomer's datagrams
            peer.sock = None
        if self._sending.pop(peer.id, None) is not None:
            if peer.transfer is not None:
                peer.acked.pop(peer.transfer.seq, None)
            peer.transfer = None
            peer.waiting.clear()
            peer.queued = 0

    def drop(self, peer: int, fault: str | None = None) -> None:
        """Forget one peer (`fault`: the counter it adds to, when it broke a rule); it is told BYE."""
        target = self._by_id.get(peer)
        if target is None:
            return
        if fault is not None:
            self._stats[fault] += 1
            self._stats["dropped_peers"] += 1
        self._leave(target)
        try:
            self._send_control(_BYE, target.addr)
        except OSError:
            pass

    def _acknowledged(self, peer: _Peer) -> None:
        if peer.transfer is not None:
            self._advance(peer)

    def _busy(self) -> bool:
        return bool(self._sending)

    def _receive(self, timeout: float | None) -> tuple[int, Any] | None:
        """The next datagram from the readable sockets in turn: one per socket per turn, and a fresh
        look for newly readable ones every _SELECT_EVERY datagrams, so a flooding peer's socket
        delays another peer's datagram by about one datagram."""
        turns = self._turns
        if turns and self._since_select >= _SELECT_EVERY:
            self._select(0)
        while True:
            while turns:
                sock = turns.popleft()
                try:
                    n, addr = sock.recvfrom_into(self._buffer)
                except BlockingIOError:  # drained: out of turn until the selector says so again
                    self._in_turn.discard(sock)
                    self._retire_if_dry(sock)
                    continue
                except ConnectionRefusedError:  # ICMP port unreachable: that peer is gone
                    self._in_turn.discard(sock)
                    peer = self._owner.get(sock)
                    return -1, None if peer is None else peer.addr
                turns.append(sock)  # it may hold more: its next turn is after the others'
                self._since_select += 1
                return n, addr
            if not self._select(timeout):
                return None
            timeout = 0.0

    def _select(self, timeout: float | None) -> bool:
        """Put the sockets that became readable in turn; False when none did within `timeout`."""
        self._since_select = 0
        events = self._selector.select(timeout)
        for key, _ in events:
            self._put_in_turn(key.fileobj)
        return bool(events)

    def _put_in_turn(self, sock: socket.socket) -> None:
        if sock not in self._in_turn:  # once: a socket twice in turn would take two turns per round
            self._in_turn.add(sock)
            self._turns.append(sock)

    def _retire_if_dry(self, sock: socket.socket) -> None:
        """Close a departed peer's socket once nothing is queued in it (no newcomer took it over)."""
        addr = self._retired_from.pop(sock, None)
        if addr is not None:
            del self._retiring[addr]
            self._selector.unregister(sock)
            sock.close()

    def _advance(self, peer: _Peer) -> None:
        """Move the peer's sends on as far as its acknowledgements allow, without waiting."""
        stats, fragment = self._stats, self._fragment
        while True:
            transfer = peer.transfer
            if transfer is None:
                if not peer.waiting:
                    self._sending.pop(peer.id, None)
                    return
                data = peer.waiting.popleft()
                peer.queued -= len(data)
                seq = peer.send_seq
                peer.send_seq = (seq + 1) & 0xFFFFFFFF
                if len(data) <= fragment:
                    self._sendmsg([_HEADER.pack(_MAGIC, _VERSION, _DATA, seq, 0, 1, len(data), fragment), data], peer.addr)
                    stats["fragments_sent"] += 1
                    stats["messages_sent"] += 1
                    stats["bytes_sent"] += len(data)
                    continue
                transfer = peer.transfer = _Transfer(seq, data, -(-len(data) // fragment))
                peer.acked[seq] = 0
            acked, now = peer.acked[transfer.seq], time.monotonic()
            done = acked == _REFUSED or acked >= transfer.count
            if acked == _REFUSED:
                stats["refused_by_peer"] += 1
            elif done:
                stats["messages_sent"] += 1
                stats["bytes_sent"] += transfer.data.nbytes
            elif acked > transfer.acked:
                transfer.acked, transfer.last_progress, transfer.rto = acked, now, _RTO_S
            elif now - transfer.last_sent > transfer.rto:
                if now - transfer.last_progress > self._give_up:
                    stats["send_abandoned"] += 1
                    done = True
                else:  # go back to the first unacknowledged
                    for index in range(acked, transfer.next_index):
                        self._send_fragment(peer, transfer, index)
                        stats["retransmits"] += 1
                    transfer.last_sent = time.monotonic()
                    transfer.rto = min(_MAX_RTO_S, transfer.rto * 2)
            if done:
                del peer.acked[transfer.seq]
                peer.transfer = None
                continue
            while transfer.next_index < min(transfer.count, acked + _WINDOW):
                self._send_fragment(peer, transfer, transfer.next_index)
                transfer.next_index += 1
                transfer.last_sent = time.monotonic()
            return

    def _send_fragment(self, peer: _Peer, transfer: _Transfer, index: int) -> None:
        fragment = self._fragment
        total = transfer.data.nbytes
        start = index * fragment
        header = _HEADER.pack(_MAGIC, _VERSION, _DATA, transfer.seq, index, transfer.count, total, fragment)
        self._sendmsg([header, transfer.data[start:start + fragment]], peer.addr)
        self._stats["fragments_sent"] += 1

    def _tick(self) -> None:
        """Retransmit or give up what timed out (sends wait for acknowledgements in no call)."""
        for peer in list(self._sending.values()):
            self._advance(peer)

    def _all_peers(self) -> list[_Peer]:
        return list(self._by_id.values())

    def _control(self, kind: int, addr: Any, index: int) -> None:
        if kind == _HELLO:
            if addr in self._by_addr:  # a repeated hello: say the same again
                self._send_control(_WELCOME, addr, index=self._by_addr[addr].id)
            else:
                self._join(addr)
        elif kind == _BYE and addr in self._by_addr:
            self._leave(self._by_addr[addr])

    def recv(self, timeout: float | None = None) -> tuple[int, memoryview] | None:
        if self._closed:
            raise listener_closed("udp", self.address)
        item = self._next(timeout)
        return None if item is None else (item[0].id, item[1])

    def send(self, peer: int, *parts: Any) -> None:
        if self._closed:
            raise listener_closed("udp", self.address)
        target = self._by_id.get(peer)
        if target is None:
            raise not_connected("udp", peer, self.address)
        views, total = byte_views(parts)
        if total <= self._fragment and target.transfer is None and not target.waiting:
            self._send_message(target, parts)  # one datagram, now
            return
        check_size(total, self._limit, "udp")
        for _ in range(_PUMP_ON_SEND):  # take the acknowledgements that came meanwhile: sends move on
            if not self.pump(0):
                break
        if target.waiting and target.queued + total > self._max_queued:
            queued = target.queued
            self.drop(peer, "slow_consumers")
            raise SlowConsumerError(f"udp: peer {peer} was dropped: it did not acknowledge what was sent to it "
                                    f"({queued} bytes waiting, max_queued_bytes={self._max_queued})")
        target.waiting.append(joined(views))
        target.queued += total
        self._sending[peer] = target
        self._advance(target)

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
            if peer.sock is not None:
                peer.sock.close()
        for sock in self._retiring.values():
            sock.close()
        self._selector.close()
        self._sock.close()


def _is_loopback(host: str) -> bool:
    """Whether `host` (an address, or a name: every address it resolves to) is this host's loopback."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        resolved = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    return bool(resolved) and all(ipaddress.ip_address(address.split("%")[0]).is_loopback for address in resolved)


class UdpTransport:
    """`datagram_bytes`: the size of the datagrams this side sends; `reassembly_timeout_s`: how long a
    message in reassembly may go without a new fragment before it counts as lost; `give_up_s`: how long
    a sender waits for acknowledgements before abandoning a message; `max_message_bytes`: the largest
    message this side sends or accepts (at most the capability); `max_reassembly_bytes`: the most a side
    holds in reassembly, all peers together (default: twice max_message_bytes, at least 64 MiB);
    `max_peers`: how many peers a listener keeps track of; `max_queued_bytes`: how much a listener
    holds for one peer that does not acknowledge (kit.framing.Outbox's rule); `trust_network`: accept
    listening where other hosts reach it, though no datagram is authenticated (the module's paragraph
    on trust; run option --udp-trust-network)."""

    capabilities = caps.UDP

    def __init__(self, datagram_bytes: int = 8192, reassembly_timeout_s: float = 1.0, give_up_s: float = 2.0,
                 max_message_bytes: int | None = None, max_reassembly_bytes: int | None = None,
                 max_peers: int = 1024, max_queued_bytes: int | None = None, trust_network: bool = False) -> None:
        if not _MIN_DATAGRAM <= datagram_bytes <= _MAX_DATAGRAM:
            raise RlbenchError(f"udp datagram_bytes must be within {_MIN_DATAGRAM}..{_MAX_DATAGRAM}, got {datagram_bytes}")
        self.max_message_bytes = limit = message_limit(max_message_bytes, self.capabilities.max_message_bytes, "udp")
        if max_reassembly_bytes is None:
            max_reassembly_bytes = max(2 * limit, 64 << 20)
        elif positive_int(max_reassembly_bytes, "udp: max_reassembly_bytes") < limit:
            raise RlbenchError(f"udp: max_reassembly_bytes={max_reassembly_bytes} is below max_message_bytes={limit}: "
                               "the largest message could never be reassembled")
        self._options = dict(datagram_bytes=datagram_bytes, limit=limit, reassembly_timeout_s=reassembly_timeout_s,
                             give_up_s=give_up_s, max_reassembly_bytes=max_reassembly_bytes,
                             max_peers=positive_int(max_peers, "udp: max_peers"))
        self.max_queued_bytes = queued_bytes_limit(max_queued_bytes, "udp")
        if not isinstance(trust_network, bool):
            raise RlbenchError(f"udp: trust_network must be true or false, got {trust_network!r}")
        self.trust_network = trust_network

    def listen_address(self, host: str) -> str:
        """Where a run's replay node listens for peers at `host`: refused off loopback unless the
        network path is trusted (no datagram after the handshake is authenticated)."""
        if not self.trust_network and not _is_loopback(host):
            raise AddressError(
                f"udp trusts the network path: its datagrams carry no MAC after the handshake, so anyone who can "
                f"send from a peer's address and port can inject into that peer's authenticated session; to listen "
                f"on {host}, where other hosts reach it, accept that with --udp-trust-network yes (a run file's "
                f"[options] udp-trust-network = true), or use tcp")
        return f"udp://{f'[{host}]' if ':' in host else host}:0"

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
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # peers' own sockets share its address
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        shown = f"[{host}]" if family == socket.AF_INET6 else host
        return UdpListener(sock, f"udp://{shown}:{sock.getsockname()[1]}", max_queued_bytes=self.max_queued_bytes,
                           **self._options)

    def connect(self, address: str, timeout: float = 10.0) -> UdpConnection:
        host, port = host_port(address, "udp")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = self._socket(family)
        sock.connect((host, port))
        connection = UdpConnection(sock, sock.getpeername(), address, **self._options)
        connection._hello()
        return connection
