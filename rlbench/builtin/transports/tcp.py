"""Kernel TCP, the baseline the DPDK paper compares against: a 4-byte length prefix per message,
TCP_NODELAY, gather-send with sendmsg, a selector on the listener and plain blocking-with-timeout
receives on connections.

A length prefix is a claim: one over the receiving side's max_message_bytes ends the connection
(counted in the listener's refused_oversize and dropped_peers), and a large body's buffer grows with
the bytes that arrive, so a prefix that lies costs the receiver no more than what was really sent."""

from __future__ import annotations

import collections
import itertools
import select
import selectors
import socket
import struct
import time
from typing import Any

import numpy as np

from rlbench.builtin import capabilities as caps
from rlbench.kit.framing import (
    ACCEPT_BACKOFF_S,
    ADMISSION_COUNTERS,
    Outbox,
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
    new_stats,
    not_connected,
    out_of_descriptors,
    queued_bytes_limit,
)

_LENGTH = struct.Struct("<I")
_CHUNK = 1 << 18
_LARGE = 1 << 16  # bodies at least this big are received straight into their own buffer
_FIRST_BODY = 1 << 20  # a large body's first buffer holds this much (or the whole body, if smaller)
_GROWTH = 4  # a full body buffer grows to this many times what it holds (up to the claimed length)
_SELECT_EVERY = 32  # messages a listener hands out between looks for newly arrived ones
_HANG_UPS_PER_LOOK = 256  # departed peers a listener closes per look (the rest wait for the next)
READ, WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _send_message(sock: socket.socket, parts: tuple[Any, ...], limit: int) -> int:
    views, total = byte_views(parts)
    check_size(total, min(limit, 0xFFFFFFFF), "tcp")
    buffers = [memoryview(_LENGTH.pack(total))] + [v for v in views if v.nbytes]
    sent = sock.sendmsg(buffers)
    while sent < total + _LENGTH.size:  # a partial gather-send: finish piece by piece
        for view in buffers:
            if sent >= view.nbytes:
                sent -= view.nbytes
                continue
            sock.sendall(view[sent:])
            sent = 0
        break
    return total


class _FrameReader:
    """Cuts a byte stream into messages; large bodies go straight into their own buffer, grown as
    they arrive. `refused` is the length of a prefix over the limit: the stream cannot go on.

    A large body's buffer starts at what arrived (at least _FIRST_BODY) and grows _GROWTH-fold
    whenever it fills, up to the claimed length: memory stays within _GROWTH times what was received
    (plus _FIRST_BODY). Buffers are never zero-filled (numpy.empty), so the one copy a growth costs
    replaces the zero-filling of the whole body up front that came before."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._buffer = bytearray()
        self._body: np.ndarray | None = None
        self._claimed = 0  # the prefix of the body being received
        self._filled = 0
        self.refused = 0
        self.ready: collections.deque[memoryview] = collections.deque()

    @property
    def mid_message(self) -> bool:
        return self._body is not None or bool(self._buffer)

    def fill(self, sock: socket.socket) -> bool:
        """One receive; False at end of stream."""
        body = self._body
        if body is not None:
            if self._filled == len(body):  # grow with what arrived so far, never to the claim at once
                grown = np.empty(min(self._claimed, _GROWTH * self._filled), dtype=np.uint8)
                grown[:self._filled] = body
                self._body = body = grown
            n = sock.recv_into(body[self._filled:])
            if n == 0:
                return False
            self._filled += n
            if self._filled == self._claimed:
                self.ready.append(memoryview(body))
                self._body = None
            return True
        data = sock.recv(_CHUNK)
        if not data:
            return False
        buffer = self._buffer
        buffer += data
        pos = 0
        while len(buffer) - pos >= 4:
            (n,) = _LENGTH.unpack_from(buffer, pos)
            if n > self._limit:
                self.refused = n
                break
            have = len(buffer) - pos - 4
            if have >= n:
                self.ready.append(memoryview(buffer[pos + 4:pos + 4 + n]))
                pos += 4 + n
            elif n >= _LARGE:
                body = self._body = np.empty(min(n, max(have, _FIRST_BODY)), dtype=np.uint8)
                body[:have] = np.frombuffer(buffer, dtype=np.uint8, count=have, offset=pos + 4)
                self._claimed, self._filled = n, have
                pos = len(buffer)
                break
            else:
                break
        del buffer[:pos]
        return True


class TcpConnection(RequestReply):
    scheme = "tcp"

    def __init__(self, sock: socket.socket, address: str, limit: int) -> None:
        self._sock = sock
        self._address = address
        self._limit = limit
        self._reader = _FrameReader(limit)
        self._timeout: float | None = -1.0  # what the socket is set to; -1: unknown
        self._closed = False
        self._ended = ""  # why the stream cannot go on (the far side closed, or broke the framing)
        self._stats = new_stats()

    def send(self, *parts: Any) -> None:
        if self._closed:
            raise TransportClosedError(f"tcp connection to {self._address} is closed")
        try:
            self._set_timeout(None)
            n = _send_message(self._sock, parts, self._limit)
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise TransportClosedError(f"tcp: {self._address} went away ({exc})") from None
        self._stats["messages_sent"] += 1
        self._stats["bytes_sent"] += n

    def _set_timeout(self, timeout: float | None) -> None:
        if timeout != self._timeout:  # settimeout costs syscalls; only when it changes
            self._sock.settimeout(timeout)
            self._timeout = timeout

    def recv(self, timeout: float | None = None) -> memoryview | None:
        if self._closed:
            raise TransportClosedError(f"tcp connection to {self._address} is closed")
        reader = self._reader
        deadline = None if timeout is None else time.monotonic() + timeout
        while not reader.ready:
            if self._ended:
                raise TransportClosedError(self._ended)
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            self._set_timeout(remaining)
            try:
                alive = reader.fill(self._sock)
            except (socket.timeout, BlockingIOError):
                return None
            except ConnectionResetError:
                alive = False
            if reader.refused:
                self._ended = (f"tcp: {self._address} sent a message of {reader.refused} bytes, over this side's "
                               f"max_message_bytes={self._limit}; the connection is closed")
                try:
                    self._sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # the far side is gone already
            elif not alive:
                self._ended = f"tcp: {self._address} closed the connection" + (
                    " in the middle of a message" if reader.mid_message else "")
        message = reader.ready.popleft()
        self._stats["messages_received"] += 1
        self._stats["bytes_received"] += message.nbytes
        return message

    @property
    def stats(self) -> dict[str, int]:
        return dict(self._stats)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._sock.close()


class _Poller:
    """A listener's sockets, level-triggered, each with the peer it stands for (None: the listening
    socket). `look` returns (peer, READ|WRITE) for every socket with bytes to read or room to write,
    and for at most `budget` of those whose peer hung up (the oldest first), the rest staying ready
    for the next look: closing a socket costs ~15 us, and a message that came during a mass departure
    of 12,500 waited 160-270 ms behind it (the newest-first order does not help: the departures go on
    arriving after it). epoll (EPOLLRDHUP tells a hang-up apart without reading) where the system has
    it; elsewhere selectors, unbudgeted."""

    if hasattr(select, "epoll"):
        _HUNG_UP = select.EPOLLRDHUP | select.EPOLLHUP | select.EPOLLERR
        # (a hang-up or an error of the whole socket reads as both: the read or the write finds out)
        _READABLE = select.EPOLLIN | _HUNG_UP
        _WRITABLE = select.EPOLLOUT | select.EPOLLHUP | select.EPOLLERR

    def __init__(self, budget: int) -> None:
        self._budget = budget
        self._epoll = select.epoll() if hasattr(select, "epoll") else None
        self._selector = selectors.DefaultSelector() if self._epoll is None else None
        self._peer_of: dict[int, int | None] = {}  # file descriptor -> peer

    @staticmethod
    def _epoll_mask(events: int) -> int:
        return ((select.EPOLLIN | select.EPOLLRDHUP if events & READ else 0)
                | (select.EPOLLOUT if events & WRITE else 0))

    def register(self, sock: socket.socket, events: int, peer: int | None) -> None:
        if self._epoll is not None:
            self._epoll.register(sock.fileno(), self._epoll_mask(events))
            self._peer_of[sock.fileno()] = peer
        else:
            self._selector.register(sock, events, peer)

    def modify(self, sock: socket.socket, events: int) -> None:
        if self._epoll is not None:
            self._epoll.modify(sock.fileno(), self._epoll_mask(events))
        else:
            self._selector.modify(sock, events, self._selector.get_key(sock).data)

    def unregister(self, sock: socket.socket) -> None:
        if self._epoll is not None:
            self._epoll.unregister(sock.fileno())
            del self._peer_of[sock.fileno()]
        else:
            self._selector.unregister(sock)

    def look(self, timeout: float | None) -> list[tuple[int | None, int]]:
        if self._epoll is None:
            return [(key.data, events) for key, events in self._selector.select(timeout)]
        peer_of, hung_up, budget = self._peer_of, self._HUNG_UP, self._budget
        events: list[tuple[int | None, int]] = []
        for fd, mask in self._epoll.poll(-1 if timeout is None else timeout, max(len(peer_of), 1)):
            if mask & hung_up:
                if budget <= 0:
                    continue
                budget -= 1
            events.append((peer_of[fd], (READ if mask & self._READABLE else 0) | (WRITE if mask & self._WRITABLE else 0)))
        return events

    def close(self) -> None:
        (self._epoll or self._selector).close()


class _Peer:
    __slots__ = ("sock", "reader", "outbox", "events")

    def __init__(self, sock: socket.socket, limit: int) -> None:
        self.sock = sock
        self.reader = _FrameReader(limit)
        self.outbox = Outbox()
        self.events = READ


class TcpListener:
    """Peers' sockets are non-blocking: a send the kernel cannot take now waits in the peer's outbox
    (written when the selector says the socket is writable), and `recv` takes the peers' messages
    in turn, so one peer's flood delays another's message by one message, not by the flood.

    Admission (`expect_admission`, kit.framing.Strangers): connections not admitted yet are strangers,
    at most max_strangers of them (a newcomer past that closes one, those that never sent a whole
    message first), none silent past handshake_s or unadmitted handshake_s after its first message.
    Out of descriptors, `accept` fails (EMFILE) and the connection stays in the backlog,
    so the listening socket stays readable: the oldest stranger is closed and the accept tried again,
    and with no stranger to close the listener stops watching that socket for ACCEPT_BACKOFF_S
    (counted in accept_backoffs) instead of spinning on it."""

    def __init__(self, sock: socket.socket, address: str, limit: int, max_queued_bytes: int) -> None:
        self.address = address
        self._server = sock
        self._limit = limit
        self._max_queued = max_queued_bytes
        self._poller = _Poller(_HANG_UPS_PER_LOOK)
        self._poller.register(sock, READ, None)
        self._peers: dict[int, _Peer] = {}
        self._next_peer = itertools.count(1)
        self._turns: collections.deque[int] = collections.deque()  # peers with messages read, in turn
        self._leftovers: collections.deque[tuple[int, memoryview]] = collections.deque()  # of dropped peers
        self._since_select = 0
        self._closed = False
        self._strangers = Strangers()
        self._accepting_again = 0.0  # monotonic time an out-of-descriptors pause ends (0: accepting)
        # truncated: messages cut off by their peer leaving in the middle;
        # accept_backoffs: pauses in accepting, out of descriptors with no stranger to close
        self._stats = listener_stats(truncated=0, accept_backoffs=0, **dict.fromkeys(ADMISSION_COUNTERS, 0))

    def expect_admission(self, *, handshake_s: float, max_strangers: int) -> None:
        """Keep connections apart until `admit`ted (the Listener protocol's admission mode); those
        connected already are strangers from now on."""
        self._strangers.expect(handshake_s, max_strangers, "tcp")
        for peer in list(self._peers):
            crowded = self._strangers.join(peer)
            if crowded is not None:
                self._shed(crowded, "strangers_shed")

    def admit(self, peer: int) -> None:
        """The peer proved who it is: no stranger from now on."""
        self._strangers.admit(peer)

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._server.accept()
                break
            except OSError as exc:
                if not out_of_descriptors(exc):  # the peer gave up before we got to it: the others go on
                    return
                oldest = self._strangers.oldest()
                if oldest is None:  # nothing to make room with: pause, or the loop spins on the readable socket
                    self._stats["accept_backoffs"] += 1
                    self._poller.unregister(self._server)
                    self._accepting_again = time.monotonic() + ACCEPT_BACKOFF_S
                    return
                self._shed(oldest, "strangers_shed")  # its descriptor is free now: try again
        _tune(sock)
        sock.setblocking(False)
        peer = next(self._next_peer)
        self._peers[peer] = _Peer(sock, self._limit)
        self._poller.register(sock, READ, peer)
        crowded = self._strangers.join(peer)
        if crowded is not None:
            self._shed(crowded, "strangers_shed")

    def _shed(self, peer: int, counter: str) -> None:
        """Close a stranger (what it sent is dropped with it), counted under `counter`."""
        self._stats[counter] += 1
        self._close(peer, None, deliver=False)

    def _shed_late_strangers(self) -> None:
        """Close the strangers whose handshake time is up; one that sent what was not handed out yet
        waits for this side, not the other way round: it is left (and those after it) till then."""
        while (late := self._strangers.overdue()) is not None and not self._peers[late].reader.ready:
            self._shed(late, "handshake_timeouts")

    def drop(self, peer: int, fault: str | None = None) -> None:
        """Close one peer's connection (`fault`: the counter it adds to, when it broke a rule); what it
        sent that was not handed out yet is dropped with it."""
        self._close(peer, fault, deliver=False)

    def _close(self, peer: int, fault: str | None, *, deliver: bool) -> None:
        entry = self._peers.pop(peer, None)
        if entry is None:
            return
        self._strangers.leave(peer)
        if fault is not None:
            self._stats[fault] += 1
            self._stats["dropped_peers"] += 1
        if deliver:  # it left, or broke the framing: what came whole before is still delivered
            self._leftovers.extend((peer, message) for message in entry.reader.ready)
        self._poller.unregister(entry.sock)
        entry.sock.close()

    def _read(self, peer: int) -> None:
        """Take what one peer sent; drop it at its end of stream, or when it claims too much."""
        entry = self._peers[peer]
        reader = entry.reader
        had = bool(reader.ready)
        try:
            alive = reader.fill(entry.sock)
        except BlockingIOError:  # nothing after all
            alive = True
        except OSError:  # reset, or any other failure of this one socket: that peer is gone
            alive = False
        if reader.ready and not had:
            self._turns.append(peer)
            if self._strangers.on:
                self._strangers.heard(peer)
        if reader.refused:
            self._close(peer, "refused_oversize", deliver=True)
        elif not alive:
            self._stats["truncated"] += reader.mid_message
            self._close(peer, None, deliver=True)

    def _select(self, timeout: float | None) -> bool:
        """Accept, read and write what the sockets allow (waiting up to `timeout`); False when nothing did."""
        self._since_select = 0
        if self._accepting_again:  # paused out of descriptors: watch the listening socket again when it ends
            pause = self._accepting_again - time.monotonic()
            if pause <= 0:
                self._accepting_again = 0.0
                self._poller.register(self._server, READ, None)
            elif timeout is None or timeout > pause:
                timeout = pause
        events = self._poller.look(timeout)
        for peer, mask in events:
            if peer is None:
                self._accept()
                continue
            if mask & WRITE and peer in self._peers:
                self._flush(peer)
            if mask & READ and peer in self._peers and not self._peers[peer].reader.ready:
                self._read(peer)
        if self._strangers:
            self._shed_late_strangers()
        return bool(events)

    def recv(self, timeout: float | None = None) -> tuple[int, memoryview] | None:
        if self._closed:
            raise listener_closed("tcp", self.address)
        turns = self._turns
        if turns and self._since_select >= _SELECT_EVERY:  # others' messages may have come meanwhile
            self._select(0)
        deadline = None if timeout is None else time.monotonic() + timeout
        while not turns:
            if self._leftovers:
                return self._deliver(*self._leftovers.popleft())
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            self._select(remaining)
            if remaining is not None and remaining <= 0 and not turns and not self._leftovers:
                return None  # one look when the time is up, however many sockets it found busy
        while True:
            peer = turns.popleft()
            entry = self._peers.get(peer)
            if entry is not None and entry.reader.ready:
                break
            if not turns:  # every peer in turn was dropped since
                return self.recv(0.0 if deadline is None else max(0.0, deadline - time.monotonic()))
        message = entry.reader.ready.popleft()
        if entry.reader.ready:
            turns.append(peer)
        return self._deliver(peer, message)

    def _deliver(self, peer: int, message: memoryview) -> tuple[int, memoryview]:
        self._since_select += 1
        self._stats["messages_received"] += 1
        self._stats["bytes_received"] += message.nbytes
        return peer, message

    def send(self, peer: int, *parts: Any) -> None:
        if self._closed:
            raise listener_closed("tcp", self.address)
        entry = self._peers.get(peer)
        if entry is None:
            raise not_connected("tcp", peer, self.address)
        views, total = byte_views(parts)
        check_size(total, min(self._limit, 0xFFFFFFFF), "tcp")
        framed = [memoryview(_LENGTH.pack(total)), *(view for view in views if view.nbytes)]
        written = 0
        if not entry.outbox:
            try:
                written = entry.sock.sendmsg(framed)
            except BlockingIOError:
                written = 0
            except OSError as exc:  # reset, broken pipe: that peer is gone
                self._close(peer, None, deliver=True)
                raise TransportClosedError(f"tcp: peer {peer} went away ({exc})") from None
        if written < total + _LENGTH.size:
            rest = joined(framed, written)
            if not entry.outbox.admits(len(rest), self._max_queued):
                self.drop(peer, "slow_consumers")
                raise SlowConsumerError(f"tcp: peer {peer} was dropped: it did not read what was sent to it "
                                        f"({entry.outbox.queued} bytes waiting, max_queued_bytes={self._max_queued})")
            entry.outbox.push(rest)
            self._want(peer, entry, READ | WRITE)
        self._stats["messages_sent"] += 1
        self._stats["bytes_sent"] += total

    def _flush(self, peer: int) -> None:
        entry = self._peers[peer]

        def write(view: memoryview) -> int:
            try:
                return entry.sock.send(view)
            except BlockingIOError:
                return -1

        try:
            emptied = entry.outbox.flush(write)
        except OSError:  # the peer went away with replies still queued: nobody waits for them
            self._close(peer, None, deliver=True)
            return
        if emptied:
            self._want(peer, entry, READ)

    def _want(self, peer: int, entry: _Peer, events: int) -> None:
        if entry.events != events:
            entry.events = events
            self._poller.modify(entry.sock, events)

    @property
    def peers(self) -> list[int]:
        return list(self._peers)

    @property
    def stats(self) -> dict[str, int]:
        return dict(self._stats)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for peer in list(self._peers):
            self.drop(peer)
        self._poller.close()
        self._server.close()


class TcpTransport:
    """`max_message_bytes`: the largest message this side sends or accepts (at most the capability);
    `max_queued_bytes`: how much a listener holds for one peer that does not read (kit.framing.Outbox)."""

    capabilities = caps.TCP

    def __init__(self, max_message_bytes: int | None = None, max_queued_bytes: int | None = None) -> None:
        self.max_message_bytes = message_limit(max_message_bytes, self.capabilities.max_message_bytes, "tcp")
        self.max_queued_bytes = queued_bytes_limit(max_queued_bytes, "tcp")

    def listen(self, address: str | None = None) -> TcpListener:
        host, port = host_port(address or "tcp://127.0.0.1:0", "tcp")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        sock.setblocking(False)
        bound_port = sock.getsockname()[1]
        shown = f"[{host}]" if family == socket.AF_INET6 else host
        return TcpListener(sock, f"tcp://{shown}:{bound_port}", self.max_message_bytes, self.max_queued_bytes)

    def connect(self, address: str, timeout: float = 10.0) -> TcpConnection:
        host, port = host_port(address, "tcp")
        deadline = time.monotonic() + timeout
        while True:  # the listener may still be starting in another process
            try:
                sock = socket.create_connection((host, port), timeout=max(0.01, deadline - time.monotonic()))
                break
            except (ConnectionRefusedError, socket.timeout) as exc:
                if time.monotonic() >= deadline:
                    raise TransportClosedError(f"tcp: cannot connect to {address} within {timeout} s ({exc})") from None
                time.sleep(0.01)
        _tune(sock)
        sock.settimeout(None)
        return TcpConnection(sock, address, self.max_message_bytes)
