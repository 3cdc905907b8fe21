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
- Buffers: send() returns once the kernel holds the whole message, so the caller may reuse its
  buffers at once; recv() returns a fresh buffer per message.
- The listener serves many peers with a selector; it replies to a peer by its id.
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
    AddressError,
    RequestReply,
    TransportClosedError,
    byte_views,
    check_size,
    listener_closed,
    listener_stats,
    message_limit,
    new_stats,
    not_connected,
    split_address,
)
from rlbench.protocols import TransportCapabilities

CAPABILITIES = TransportCapabilities(max_message_bytes=1 << 30, reliable=True, ordered=True,
                                     crosses_processes=True, crosses_hosts=False)
SCHEME = "uds"
_LENGTH = struct.Struct("<I")
_CHUNK = 1 << 20  # the most one receive asks for
_BUFFERS_PER_SEND = 512  # sendmsg takes at most IOV_MAX (1024 on Linux) buffers


def _send(sock: socket.socket, parts: tuple[Any, ...], limit: int) -> int:
    """Write one message (length prefix and parts, gathered) and return its size once all is sent."""
    views, total = byte_views(parts)
    check_size(total, limit, SCHEME)
    pending = [memoryview(_LENGTH.pack(total))] + [view for view in views if view.nbytes]
    while pending:
        sent = sock.sendmsg(pending[:_BUFFERS_PER_SEND])
        while pending and sent >= pending[0].nbytes:
            sent -= pending.pop(0).nbytes
        if sent:  # a part went out in part
            pending[0] = pending[0][sent:]
    return total


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


class UdsListener:
    def __init__(self, server: socket.socket, path: str, directory: str | None, limit: int) -> None:
        self.address = f"{SCHEME}://{path}"
        self._server = server
        self._limit = limit
        self._selector = selectors.DefaultSelector()
        self._selector.register(server, selectors.EVENT_READ, None)
        self._peers: dict[int, tuple[socket.socket, _Reader]] = {}
        self._peer_ids = itertools.count(1)
        self._ready: collections.deque[tuple[int, memoryview]] = collections.deque()
        self._closed = False
        self._stats = listener_stats(truncated=0)  # truncated: peers that left in the middle of a message
        # The socket and its directory go at close(), or when the listener is collected, or at exit.
        self._remove = weakref.finalize(self, _remove, path, directory, os.getpid())

    def _accept(self) -> None:
        try:
            sock, _ = self._server.accept()
        except BlockingIOError:
            return  # the peer gave up before we got to it
        sock.setblocking(True)  # read only when the selector says so; sends wait until written
        peer = next(self._peer_ids)
        self._peers[peer] = (sock, _Reader(self._limit))
        self._selector.register(sock, selectors.EVENT_READ, peer)

    def _drop(self, peer: int) -> None:
        sock, _ = self._peers.pop(peer)
        self._selector.unregister(sock)
        sock.close()

    def _read(self, peer: int) -> None:
        sock, reader = self._peers[peer]
        try:
            message = reader.read(sock)
        except (EOFError, OSError):  # the peer left (or its socket failed): drop it alone
            self._stats["truncated"] += reader.mid_message
            self._drop(peer)
            return
        if reader.refused:
            self._stats["refused_oversize"] += 1
            self._stats["dropped_peers"] += 1
            self._drop(peer)
        elif message is not None:
            self._ready.append((peer, message))

    def recv(self, timeout: float | None = None) -> tuple[int, memoryview] | None:
        if self._closed:
            raise listener_closed(SCHEME, self.address)
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._ready:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            events = self._selector.select(remaining)
            for key, _ in events:
                if key.data is None:
                    self._accept()
                elif key.data in self._peers:
                    self._read(key.data)
            if not events and remaining is not None and remaining <= 0:
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
        try:
            size = _send(entry[0], parts, self._limit)
        except (BrokenPipeError, ConnectionResetError) as exc:
            self._drop(peer)
            raise TransportClosedError(f"uds: peer {peer} went away ({exc})") from None
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
            self._drop(peer)
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
    """`max_message_bytes`: the largest message this side sends or accepts (at most the capability)."""

    capabilities = CAPABILITIES

    def __init__(self, max_message_bytes: int | None = None) -> None:
        self.max_message_bytes = message_limit(max_message_bytes, CAPABILITIES.max_message_bytes, SCHEME)

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
        return UdsListener(server, path, directory, self.max_message_bytes)

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
