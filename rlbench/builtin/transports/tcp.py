"""Kernel TCP, the baseline the DPDK paper compares against: a 4-byte length prefix per message,
TCP_NODELAY, gather-send with sendmsg, a selector on the listener and plain blocking-with-timeout
receives on connections."""

from __future__ import annotations

import collections
import itertools
import selectors
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
)
from rlbench.protocols import TransportCapabilities

_LENGTH = struct.Struct("<I")
_CHUNK = 1 << 18
_LARGE = 1 << 16  # bodies at least this big are received straight into their own buffer


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
    """Cuts a byte stream into messages; large bodies go straight into their own buffer."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._body: bytearray | None = None
        self._filled = 0
        self.ready: collections.deque[memoryview] = collections.deque()

    def fill(self, sock: socket.socket) -> bool:
        """One receive; False at end of stream."""
        if self._body is not None:
            n = sock.recv_into(memoryview(self._body)[self._filled:])
            if n == 0:
                return False
            self._filled += n
            if self._filled == len(self._body):
                self.ready.append(memoryview(self._body))
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
            have = len(buffer) - pos - 4
            if have >= n:
                self.ready.append(memoryview(buffer[pos + 4:pos + 4 + n]))
                pos += 4 + n
            elif n >= _LARGE:
                body = bytearray(n)
                body[:have] = buffer[pos + 4:]
                self._body, self._filled = body, have
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
        self._reader = _FrameReader()
        self._timeout: float | None = -1.0  # what the socket is set to; -1: unknown
        self._closed = False
        self._eof = False
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
            if self._eof:
                raise TransportClosedError(f"tcp: {self._address} closed the connection")
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            self._set_timeout(remaining)
            try:
                if not reader.fill(self._sock):
                    self._eof = True
            except (socket.timeout, BlockingIOError):
                return None
            except ConnectionResetError:
                self._eof = True
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


class TcpListener:
    def __init__(self, sock: socket.socket, address: str, limit: int) -> None:
        self.address = address
        self._server = sock
        self._limit = limit
        self._selector = selectors.DefaultSelector()
        self._selector.register(sock, selectors.EVENT_READ, None)
        self._peers: dict[int, tuple[socket.socket, _FrameReader]] = {}
        self._next_peer = itertools.count(1)
        self._ready: collections.deque[tuple[int, memoryview]] = collections.deque()
        self._closed = False
        self._stats = new_stats()

    def _accept(self) -> None:
        sock, _ = self._server.accept()
        _tune(sock)
        sock.setblocking(True)
        peer = next(self._next_peer)
        self._peers[peer] = (sock, _FrameReader())
        self._selector.register(sock, selectors.EVENT_READ, peer)

    def _drop(self, peer: int) -> None:
        sock, _ = self._peers.pop(peer)
        self._selector.unregister(sock)
        sock.close()

    def recv(self, timeout: float | None = None) -> tuple[int, memoryview] | None:
        if self._closed:
            raise TransportClosedError(f"tcp listener {self.address} is closed")
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._ready:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            events = self._selector.select(remaining)
            for key, _ in events:
                peer = key.data
                if peer is None:
                    self._accept()
                    continue
                sock, reader = self._peers[peer]
                try:
                    alive = reader.fill(sock)
                except ConnectionResetError:
                    alive = False
                self._ready.extend((peer, message) for message in reader.ready)
                reader.ready.clear()
                if not alive:
                    self._drop(peer)
            if not events and remaining is not None and remaining <= 0:
                return None
        peer, message = self._ready.popleft()
        self._stats["messages_received"] += 1
        self._stats["bytes_received"] += message.nbytes
        return peer, message

    def send(self, peer: int, *parts: Any) -> None:
        entry = self._peers.get(peer)
        if entry is None:
            raise TransportClosedError(f"tcp: peer {peer} is not connected to {self.address}")
        try:
            n = _send_message(entry[0], parts, self._limit)
        except (BrokenPipeError, ConnectionResetError) as exc:
            self._drop(peer)
            raise TransportClosedError(f"tcp: peer {peer} went away ({exc})") from None
        self._stats["messages_sent"] += 1
        self._stats["bytes_sent"] += n

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


class TcpTransport:
    capabilities = TransportCapabilities(max_message_bytes=1 << 31, reliable=True, ordered=True,
                                         crosses_processes=True, crosses_hosts=True)

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
        return TcpListener(sock, f"tcp://{shown}:{bound_port}", self.capabilities.max_message_bytes)

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
        return TcpConnection(sock, address, self.capabilities.max_message_bytes)
