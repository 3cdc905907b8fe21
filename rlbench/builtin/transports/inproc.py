"""In-process transport: queues between threads.

A message is copied once on send (a multi-part message is joined, a single part copied), so the
sender may reuse its buffers as soon as `send` returns, as on every other transport; only a single
`bytes` part, which nobody can change, is handed over as it is. The receiver gets a view of that
copy, with no further copy. Limits are checked against the listener's max_message_bytes on send:
sender and receiver share one process, so that is before anything is allocated.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from typing import Any

from rlbench.builtin import capabilities as caps
from rlbench.kit.framing import (
    AddressError,
    MessageTooLargeError,
    RequestReply,
    SlowConsumerError,
    TransportClosedError,
    byte_views,
    check_size,
    listener_closed,
    listener_stats,
    message_limit,
    new_stats,
    not_connected,
    queued_bytes_limit,
    split_address,
)

_CLOSED = object()  # queued to wake and stop a receiver
_listeners: dict[str, "InprocListener"] = {}
_listeners_lock = threading.Lock()
_auto_names = itertools.count()


def _message(parts: tuple[Any, ...], limit: int) -> memoryview:
    views, total = byte_views(parts)
    check_size(total, limit, "inproc")
    if len(views) == 1 and type(views[0].obj) is bytes:
        return views[0]  # immutable: the receiver can share it
    return memoryview(b"".join(views))


def _get(inbox: "queue.SimpleQueue[Any]", timeout: float | None) -> Any:
    try:
        return inbox.get(timeout=timeout) if timeout is None or timeout > 0 else inbox.get_nowait()
    except queue.Empty:
        return None


class InprocConnection(RequestReply):
    scheme = "inproc"

    def __init__(self, listener: "InprocListener", peer: int) -> None:
        self._listener = listener
        self._address = listener.address
        self._peer = peer
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._closed = False
        self._stats = new_stats()
        # what the listener put in the inbox and what this side took out, each written by one side
        # only: their difference is what waits unread (the listener bounds it)
        self._put_bytes = 0
        self._taken_bytes = 0

    def send(self, *parts: Any) -> None:
        if self._closed or self._listener._closed or self._peer not in self._listener._connections:
            raise TransportClosedError(f"inproc connection to {self._listener.address} is closed")
        try:
            message = _message(parts, self._listener._limit)
        except MessageTooLargeError:
            self._listener._stats["refused_oversize"] += 1  # the listener's limit, refused on its behalf
            raise
        self._stats["messages_sent"] += 1
        self._stats["bytes_sent"] += message.nbytes
        self._listener._inbox.put((self._peer, message))

    def recv(self, timeout: float | None = None) -> memoryview | None:
        if self._closed:
            raise TransportClosedError("inproc connection is closed")
        item = _get(self._inbox, timeout)
        if item is _CLOSED:
            self._inbox.put(_CLOSED)  # keep saying so on later calls
            raise TransportClosedError(f"inproc listener {self._listener.address} closed")
        if item is not None:
            self._stats["messages_received"] += 1
            self._stats["bytes_received"] += item.nbytes
            self._taken_bytes += item.nbytes
        return item

    @property
    def stats(self) -> dict[str, int]:
        return dict(self._stats)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._listener._inbox.put((self._peer, _CLOSED))


class InprocListener:
    """Replies wait in each peer's inbox; what waits unread for one peer is bounded by
    `max_queued_bytes` (past it the peer is dropped as a slow consumer), as on every transport."""

    def __init__(self, address: str, limit: int, max_queued_bytes: int) -> None:
        self.address = address
        self._limit = limit
        self._max_queued = max_queued_bytes
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._connections: dict[int, InprocConnection] = {}
        self._next_peer = itertools.count(1)
        self._closed = False
        self._stats = listener_stats()

    def _attach(self) -> InprocConnection:
        connection = InprocConnection(self, next(self._next_peer))
        self._connections[connection._peer] = connection
        return connection

    def recv(self, timeout: float | None = None) -> tuple[int, memoryview] | None:
        if self._closed:
            raise listener_closed("inproc", self.address)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            item = _get(self._inbox, remaining)
            if item is None:
                return None
            peer, message = item
            if message is _CLOSED:
                if self._closed:  # closed by another thread while this one waited
                    raise listener_closed("inproc", self.address)
                self._connections.pop(peer, None)
                continue
            if peer not in self._connections:  # sent before it saw that it was dropped
                continue
            self._stats["messages_received"] += 1
            self._stats["bytes_received"] += message.nbytes
            return peer, message

    def send(self, peer: int, *parts: Any) -> None:
        if self._closed:
            raise listener_closed("inproc", self.address)
        connection = self._connections.get(peer)
        if connection is None or connection._closed:
            raise not_connected("inproc", peer, self.address)
        message = _message(parts, self._limit)
        waiting = connection._put_bytes - connection._taken_bytes
        if waiting and waiting + message.nbytes > self._max_queued:
            self.drop(peer, "slow_consumers")
            raise SlowConsumerError(f"inproc: peer {peer} was dropped: it did not read what was sent to it ({waiting} "
                                    f"bytes waiting, max_queued_bytes={self._max_queued})")
        self._stats["messages_sent"] += 1
        self._stats["bytes_sent"] += message.nbytes
        connection._put_bytes += message.nbytes
        connection._inbox.put(message)

    def drop(self, peer: int, fault: str | None = None) -> None:
        """Close one peer's connection (`fault`: the counter it adds to, when it broke a rule); what
        waited for it is gone, and its next call says the listener closed it."""
        connection = self._connections.pop(peer, None)
        if connection is None:
            return
        if fault is not None:
            self._stats[fault] += 1
            self._stats["dropped_peers"] += 1
        while _get(connection._inbox, 0) is not None:
            pass
        connection._inbox.put(_CLOSED)

    @property
    def peers(self) -> list[int]:
        return list(self._connections)

    @property
    def stats(self) -> dict[str, int]:
        return dict(self._stats)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with _listeners_lock:
            if _listeners.get(self.address) is self:
                del _listeners[self.address]
        for connection in self._connections.values():
            connection._inbox.put(_CLOSED)
        self._inbox.put((0, _CLOSED))


class InprocTransport:
    """`max_message_bytes`: the largest message a listener of this transport accepts (at most the
    capability); connections send within their listener's limit."""

    capabilities = caps.INPROC

    def __init__(self, max_message_bytes: int | None = None, max_queued_bytes: int | None = None) -> None:
        self.max_message_bytes = message_limit(max_message_bytes, self.capabilities.max_message_bytes, "inproc")
        self.max_queued_bytes = queued_bytes_limit(max_queued_bytes, "inproc")

    def listen(self, address: str | None = None) -> InprocListener:
        if address is None:
            address = f"inproc://auto-{next(_auto_names)}"
        split_address(address, "inproc")
        with _listeners_lock:
            if address in _listeners:
                raise AddressError(f"inproc address {address!r} is already in use")
            listener = _listeners[address] = InprocListener(address, self.max_message_bytes, self.max_queued_bytes)
        return listener

    def connect(self, address: str, timeout: float = 10.0) -> InprocConnection:
        split_address(address, "inproc")
        deadline = time.monotonic() + timeout
        while True:  # the listener may be starting in another thread
            with _listeners_lock:
                listener = _listeners.get(address)
            if listener is not None:
                return listener._attach()
            if time.monotonic() >= deadline:
                raise TransportClosedError(f"inproc: nothing listens on {address!r} (within {timeout} s)")
            time.sleep(0.001)
