"""A complete, minimal transport plugin: messages over Unix-domain stream sockets, between the
processes of one machine.

- Privacy: the listener makes a directory only its user can enter (mode 0700) under
  $XDG_RUNTIME_DIR, or the temporary directory, and binds the socket `socket` in it (mode 0600).
  Its address is "uds://<path>"; close() removes both.
- Framing: a message is a 4-byte little-endian length, then its bytes.
- Receive limit: a length over the receiving side's max_message_bytes is refused before anything is
  allocated for it. The listener counts it (stats["refused_oversize"]), drops that peer and goes on
  serving the others; a connection closes. A body's buffer grows with the bytes that arrive, never
  to the length the sender claims.
- Buffers: send() returns once the kernel (or, on a listener, the peer's outbox: a copy) holds the
  whole message, so the caller may reuse its buffers at once; recv() returns a fresh buffer per
  message.
- The listener serves many peers with a selector; it replies to a peer by its id.
- A slow peer stalls no one: the listener's sockets are non-blocking. What a peer's socket cannot
  take now waits in that peer's `Outbox` (rlbench.kit.framing) and is written when the selector
  says the socket is writable, during the listener's later recv() and send() calls. The outbox
  holds at most `max_queued_bytes` (MAX_QUEUED_BYTES by default; a message into an empty outbox
  is always taken): a peer whose outbox would grow past it is dropped, counted in
  stats["slow_consumers"] and stats["dropped_peers"], and that send raises SlowConsumerError.
  recv() completes at most one message per peer in each look at the sockets, so one peer's flood
  delays another peer's message by about one message. drop(peer) closes one peer's connection.
- Admission (the Listener protocol's, declared in its capabilities): after expect_admission() a
  peer is a stranger until admit(peer), and `Strangers` (rlbench.kit.framing) keeps the books: at
  most max_strangers of them, none past handshake_s, never in an admitted peer's place. Out of
  descriptors, the oldest stranger is closed to take the newcomer; with none, accepting pauses for
  ACCEPT_BACKOFF_S (the listening socket stays readable: watching it would spin).
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import os
import selectors
import socket
import struct
import tempfile
import time
import weakref
from typing import Any

from rlbench.hookspecs import hookimpl
from rlbench.kit.framing import (
    ACCEPT_BACKOFF_S,
    ADMISSION_COUNTERS,
    AddressError,
    Outbox,
    RequestReply,
    SlowConsumerError,
    Strangers,
    TransportClosedError,
    byte_views,
    check_size,
    joined,
    listener_closed,
    listener_stats,
    message_limit,
    new_stats,
    not_connected,
    out_of_descriptors,
    queued_bytes_limit,
    split_address,
)
from rlbench.protocols import TransportCapabilities

RLBENCH_API = "1.1"  # the plugin API this plugin targets (docs/plugin-api-changelog.md)

CAPABILITIES = TransportCapabilities(max_message_bytes=1 << 30, reliable=True, ordered=True,
                                     crosses_processes=True, crosses_hosts=False, admission=True)
SCHEME = "uds"
_LENGTH = struct.Struct("<I")
_CHUNK = 1 << 20  # the most one receive asks for
_BUFFERS_PER_SEND = 512  # sendmsg takes at most IOV_MAX (1024 on Linux) buffers


def _framed(parts: tuple[Any, ...], limit: int) -> tuple[list[memoryview], int]:
    """One message as the buffers to write (length prefix, then the non-empty parts) and its size."""
    views, total = byte_views(parts)
    check_size(total, limit, SCHEME)
    return [memoryview(_LENGTH.pack(total))] + [view for view in views if view.nbytes], total


def _send(sock: socket.socket, parts: tuple[Any, ...], limit: int) -> int:
    """Write one message on a blocking socket and return its size once all is sent."""
    pending, total = _framed(parts, limit)
    while pending:
        sent = sock.sendmsg(pending[:_BUFFERS_PER_SEND])
        while pending and sent >= pending[0].nbytes:
            sent -= pending.pop(0).nbytes
        if sent:  # a part went out in part
            pending[0] = pending[0][sent:]
    return total


def _send_now(sock: socket.socket, buffers: list[memoryview]) -> int:
    """Write what a non-blocking socket takes now of the buffers, in order; how many bytes that was."""
    written = 0
    for start in range(0, len(buffers), _BUFFERS_PER_SEND):
        batch = buffers[start:start + _BUFFERS_PER_SEND]
        try:
            sent = sock.sendmsg(batch)
        except BlockingIOError:
            break
        written += sent
        if sent < sum(view.nbytes for view in batch):  # the socket is full for now
            break
    return written


class _Reader:
    """Cuts one peer's byte stream into messages. It asks the socket for no more than the length
    prefix or the body still needs, so it never reads past the message at hand."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.prefix = bytearray()
        self.body: bytearray | None = None
        self.length = 0
        self.refused = 0  # a claimed length over the limit: the stream cannot go on

    @property
    def mid_message(self) -> bool:
        return bool(self.prefix) or self.body is not None

    def read(self, sock: socket.socket) -> memoryview | None:
        """One receive: the message it completed, or None. EOFError when the peer closed."""
        wanted = _LENGTH.size - len(self.prefix) if self.body is None else min(self.length - len(self.body), _CHUNK)
        data = sock.recv(wanted)
        if not data:
            raise EOFError
        if self.body is None:
            self.prefix += data
            if len(self.prefix) < _LENGTH.size:
                return None
            (self.length,) = _LENGTH.unpack(self.prefix)
            self.prefix.clear()
            if self.length > self.limit:
                self.refused = self.length
                return None
            self.body = bytearray()
        else:
            self.body += data
        if len(self.body) < self.length:
            return None
        message, self.body = memoryview(self.body), None
        return message


class UdsConnection(RequestReply):
    scheme = SCHEME

    def __init__(self, sock: socket.socket, address: str, limit: int) -> None:
        self._sock = sock
        self._address = address
        self._limit = limit
        self._reader = _Reader(limit)
        self._timeout: float | None = -1.0  # what the socket is set to (-1: not set yet)
        self._ended = ""  # why the stream cannot go on
        self._closed = False
        self._stats = new_stats()

    def _set_timeout(self, timeout: float | None) -> None:
        if timeout != self._timeout:  # each change costs system calls
            self._sock.settimeout(timeout)
            self._timeout = timeout

    def send(self, *parts: Any) -> None:
        if self._closed:
            raise TransportClosedError(f"uds connection to {self._address} is closed")
        self._set_timeout(None)  # a send waits until the kernel has taken everything
        try:
            size = _send(self._sock, parts, self._limit)
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise TransportClosedError(f"uds: {self._address} went away ({exc})") from None
        self._stats["messages_sent"] += 1
        self._stats["bytes_sent"] += size

    def recv(self, timeout: float | None = None) -> memoryview | None:
        if self._closed:
            raise TransportClosedError(f"uds connection to {self._address} is closed")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._ended:
                raise TransportClosedError(self._ended)
            self._set_timeout(None if deadline is None else max(0.0, deadline - time.monotonic()))
            try:
                message = self._reader.read(self._sock)
            except (TimeoutError, BlockingIOError):
                return None  # a message begun stays in the reader for the next call
            except (EOFError, ConnectionResetError):
                self._ended = f"uds: {self._address} closed the connection"
                continue
            if self._reader.refused:
                self._ended = (f"uds: {self._address} sent a message of {self._reader.refused} bytes, over this "
                               f"side's max_message_bytes={self._limit}; the connection is closed")
                self._sock.close()
                continue
            if message is not None:
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


def _remove(path: str, directory: str | None, owner: int) -> None:
    if os.getpid() != owner:  # a forked child must not remove its parent's socket
        return
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    if directory is not None:
        with contextlib.suppress(OSError):
            os.rmdir(directory)


class _Peer:
    """What the listener keeps per peer: its socket, the message it is reading, what waits to be written."""

    __slots__ = ("sock", "reader", "outbox", "events")

    def __init__(self, sock: socket.socket, limit: int) -> None:
        self.sock = sock
        self.reader = _Reader(limit)
        self.outbox = Outbox()
        self.events = selectors.EVENT_READ  # what the selector watches for: writable too while the outbox has bytes


class UdsListener:
    """Serves many peers through one selector, and never waits on any one of them.

    Reading: each look at the sockets (`_poll`) makes one receive per readable peer, and a receive
    never reads past the message at hand, so it completes at most one message per peer; recv() hands
    those out before it looks again. A peer flooding the listener thus gets one turn in each round,
    like every other peer, and the rest of its flood waits in the kernel, not here.

    Writing: send() writes what the socket takes now; the rest of the message (a copy) waits in the
    peer's outbox, and the selector then watches that socket for room too, so the outbox drains
    while the listener goes on with its recv() and send() calls. The outbox is bounded: a peer that
    does not read is dropped as a slow consumer instead of growing it.
    """

    def __init__(self, server: socket.socket, path: str, directory: str | None, limit: int,
                 max_queued_bytes: int) -> None:
        self.address = f"{SCHEME}://{path}"
        self._server = server
        self._limit = limit
        self._max_queued = max_queued_bytes
        self._selector = selectors.DefaultSelector()
        self._selector.register(server, selectors.EVENT_READ, None)
        self._peers: dict[int, _Peer] = {}
        self._peer_ids = itertools.count(1)
        self._ready: collections.deque[tuple[int, memoryview]] = collections.deque()  # at most one per peer per round
        self._closed = False
        self._strangers = Strangers()
        self._accepting_again = 0.0  # when a pause in accepting (out of descriptors) ends; 0: accepting
        # truncated: peers that left in the middle of a message; accept_backoffs: those pauses
        self._stats = listener_stats(truncated=0, accept_backoffs=0, **dict.fromkeys(ADMISSION_COUNTERS, 0))
        # The socket and its directory go at close(), or when the listener is collected, or at exit.
        self._remove = weakref.finalize(self, _remove, path, directory, os.getpid())

    def expect_admission(self, *, handshake_s: float, max_strangers: int) -> None:
        """Keep peers apart until admit(peer); those connected already are strangers from now on."""
        self._strangers.expect(handshake_s, max_strangers, SCHEME)
        for peer in list(self._peers):
            crowded = self._strangers.join(peer)
            if crowded is not None:
                self._shed(crowded, "strangers_shed")

    def admit(self, peer: int) -> None:
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
                if oldest is None:  # nothing to close for room: pause (the socket stays readable)
                    self._stats["accept_backoffs"] += 1
                    self._selector.unregister(self._server)
                    self._accepting_again = time.monotonic() + ACCEPT_BACKOFF_S
                    return
                self._shed(oldest, "strangers_shed")  # its descriptor is free now: try again
        sock.setblocking(False)  # reads only when the selector says so; writes take what fits now
        peer = next(self._peer_ids)
        self._peers[peer] = _Peer(sock, self._limit)
        self._selector.register(sock, selectors.EVENT_READ, peer)
        crowded = self._strangers.join(peer)
        if crowded is not None:
            self._shed(crowded, "strangers_shed")

    def _shed(self, peer: int, counter: str) -> None:
        """Close a stranger and what it sent, counted under `counter`."""
        self._stats[counter] += 1
        self.drop(peer)

    def drop(self, peer: int, fault: str | None = None) -> None:
        """Close one peer's connection (`fault`: the counter it adds to, when it broke a rule); what
        it sent that was not handed out yet, and what waited in its outbox, go with it."""
        if peer in self._peers:
            self._ready = collections.deque(item for item in self._ready if item[0] != peer)
            self._close(peer, fault)

    def _close(self, peer: int, fault: str | None = None) -> None:
        """Close one peer's connection; a message it sent that arrived whole is still handed out (it
        left, or broke the framing after it)."""
        entry = self._peers.pop(peer, None)
        if entry is None:
            return
        self._strangers.leave(peer)
        if fault is not None:
            self._stats[fault] += 1
            self._stats["dropped_peers"] += 1
        entry.outbox.clear()
        self._selector.unregister(entry.sock)
        entry.sock.close()

    def _read(self, peer: int) -> None:
        reader = self._peers[peer].reader
        try:
            message = reader.read(self._peers[peer].sock)
        except BlockingIOError:  # nothing after all
            return
        except (EOFError, OSError):  # the peer left (or its socket failed): drop it alone
            self._stats["truncated"] += reader.mid_message
            self._close(peer)
            return
        if reader.refused:
            self._close(peer, "refused_oversize")
        elif message is not None:
            self._ready.append((peer, message))
            self._strangers.heard(peer)

    def _flush(self, peer: int) -> None:
        """Write what the peer's socket takes now of its outbox; stop watching for room once it is empty."""
        entry = self._peers[peer]

        def write(view: memoryview) -> int:
            try:
                return entry.sock.send(view)
            except BlockingIOError:
                return -1  # full: the rest waits for the selector

        try:
            emptied = entry.outbox.flush(write)
        except OSError:  # the peer went away with messages still queued: nobody waits for them
            self._close(peer)
            return
        if emptied:
            self._watch(peer, selectors.EVENT_READ)

    def _watch(self, peer: int, events: int) -> None:
        entry = self._peers[peer]
        if entry.events != events:
            entry.events = events
            self._selector.modify(entry.sock, events, peer)

    def _poll(self, timeout: float | None) -> bool:
        """One look at the sockets (waiting up to `timeout`): accept newcomers, write to peers with
        room, take one receive from each peer with data. False when nothing was ready."""
        if self._accepting_again:  # a pause in accepting: watch the listening socket again when it ends
            pause = self._accepting_again - time.monotonic()
            if pause <= 0:
                self._accepting_again = 0.0
                self._selector.register(self._server, selectors.EVENT_READ, None)
            elif timeout is None or timeout > pause:
                timeout = pause
        events = self._selector.select(timeout)
        for key, mask in events:
            peer = key.data
            if peer is None:
                self._accept()
                continue
            if mask & selectors.EVENT_WRITE and peer in self._peers:
                self._flush(peer)
            if mask & selectors.EVENT_READ and peer in self._peers:
                self._read(peer)
        if self._strangers and not self._ready:  # (a stranger's message not handed out waits for us, not it)
            while (late := self._strangers.overdue()) is not None:
                self._shed(late, "handshake_timeouts")
        return bool(events)

    def recv(self, timeout: float | None = None) -> tuple[int, memoryview] | None:
        if self._closed:
            raise listener_closed(SCHEME, self.address)
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._ready:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self._poll(remaining) and remaining is not None and remaining <= 0:
                return None
        peer, message = self._ready.popleft()
        self._stats["messages_received"] += 1
        self._stats["bytes_received"] += message.nbytes
        return peer, message

    def send(self, peer: int, *parts: Any) -> None:
        if self._closed:
            raise listener_closed(SCHEME, self.address)
        entry = self._peers.get(peer)
        if entry is None:
            raise not_connected(SCHEME, peer, self.address)
        buffers, size = _framed(parts, self._limit)
        if entry.outbox:  # earlier messages first: the peer may have read since
            self._flush(peer)
            if peer not in self._peers:
                raise TransportClosedError(f"uds: peer {peer} went away")
        written = 0
        if not entry.outbox:
            try:
                written = _send_now(entry.sock, buffers)
            except OSError as exc:  # reset, broken pipe: that peer is gone
                self._close(peer)
                raise TransportClosedError(f"uds: peer {peer} went away ({exc})") from None
        if written < _LENGTH.size + size:  # the rest waits in the outbox, a copy (the caller may reuse its buffers)
            rest = joined(buffers, written)
            if not entry.outbox.admits(len(rest), self._max_queued):
                waiting = entry.outbox.queued
                self.drop(peer, "slow_consumers")
                raise SlowConsumerError(f"uds: peer {peer} was dropped: it did not read what was sent to it "
                                        f"({waiting} bytes waiting, max_queued_bytes={self._max_queued})")
            entry.outbox.push(rest)
            self._watch(peer, selectors.EVENT_READ | selectors.EVENT_WRITE)
        self._stats["messages_sent"] += 1
        self._stats["bytes_sent"] += size

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
            self._close(peer)
        self._selector.close()
        self._server.close()
        self._remove()


def _private_directory() -> str:
    """A new directory only this user can enter (mkdtemp makes it 0700), in the user's runtime
    directory when there is one."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    usable = runtime and os.path.isdir(runtime) and os.access(runtime, os.W_OK | os.X_OK)
    return tempfile.mkdtemp(prefix="rlbench-uds-", dir=runtime if usable else None)


class UdsTransport:
    """`max_message_bytes`: the largest message this side sends or accepts (at most the capability);
    `max_queued_bytes`: how much a listener holds for one peer that does not read (MAX_QUEUED_BYTES
    of rlbench.kit.framing by default)."""

    capabilities = CAPABILITIES

    def __init__(self, max_message_bytes: int | None = None, max_queued_bytes: int | None = None) -> None:
        self.max_message_bytes = message_limit(max_message_bytes, CAPABILITIES.max_message_bytes, SCHEME)
        self.max_queued_bytes = queued_bytes_limit(max_queued_bytes, SCHEME)

    def listen(self, address: str | None = None) -> UdsListener:
        """On a socket in a new private directory, or at the path `address` names (its directory is yours)."""
        directory = _private_directory() if address is None else None
        path = os.path.join(directory, "socket") if directory else split_address(address, SCHEME)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            server.bind(path)
            os.chmod(path, 0o600)
            server.listen(128)
        except OSError as exc:
            server.close()
            if directory is not None:
                _remove(path, directory, os.getpid())
            raise AddressError(f"uds: cannot listen on {path}: {exc.strerror or exc}") from None
        server.setblocking(False)
        return UdsListener(server, path, directory, self.max_message_bytes, self.max_queued_bytes)

    def connect(self, address: str, timeout: float = 10.0) -> UdsConnection:
        path = split_address(address, SCHEME)
        deadline = time.monotonic() + timeout
        while True:  # the listener may still be starting in another process
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(path)
                return UdsConnection(sock, address, self.max_message_bytes)
            except (FileNotFoundError, ConnectionRefusedError, PermissionError) as exc:
                sock.close()
                if isinstance(exc, PermissionError) or time.monotonic() >= deadline:
                    raise TransportClosedError(f"uds: cannot connect to {address}: {exc.strerror}") from None
                time.sleep(0.01)


@hookimpl
def rlbench_register_transports(register):
    register(SCHEME, UdsTransport, capabilities=CAPABILITIES,
             description="Unix-domain stream sockets in a private directory (processes of one machine)")
