"""Shared-memory rings between processes of one host, busy-polled: no syscalls on the fast path.

Handshake: the listener binds a Unix socket in the abstract namespace (nothing on disk). For each
connecting peer it creates the ring memory with memfd_create and passes the descriptor over that
socket (SCM_RIGHTS), so no /dev/shm name exists to leak, even after a crash. Two eventfd doorbells
travel with it: the listener's own (one for all its peers) and the peer's. The socket stays open
only so that each side notices the other dying (EOF); messages never touch it.

Memory: two rings per connection (peer->listener, listener->peer). A ring is a control block (head
written by the producer, tail by the consumer, on separate cache lines, plus a closed flag) and a
power-of-two data area of records [u32 length, u32 flags, payload padded to 8 bytes]. A record never
wraps: a WRAP record sends the consumer back to the start. Messages larger than a quarter of the ring
are cut into MORE-flagged chunks, so any size up to max_message_bytes gets through.

Trust: the far side writes the ring, so what it wrote is checked before it is used. A record must lie
inside the data area and inside what head published, its length within a chunk, its flags known:
otherwise the peer is dropped (`malformed`). A message over the receiving side's max_message_bytes is
refused as soon as its chunks add up to more (`refused_oversize`), before anything more is kept; the
peer is dropped. A chunked message is reassembled without waiting: the chunks that are there are
taken, the listener goes on serving the other peers, and a peer whose message makes no progress for
`reassembly_timeout_s` is dropped (`reassembly_timeouts`); one that leaves in the middle is counted
in `truncated`. The handshake socket lives in the abstract namespace, which has no file permissions:
anyone on the host could connect, so the listener checks the connecting process's credentials
(SO_PEERCRED) and refuses any other user than its own (`refused_peers`).

Ordering: the producer writes the payload, then stores head; the consumer loads head, then reads the
payload. x86-64 is total-store-order, so those plain stores/loads are seen in that order; weakly
ordered CPUs would need barriers, which is why probe() refuses them.

A listener never waits on a peer: a message its ring cannot take now (the peer does not read)
waits in the peer's outbox (rlbench.kit.framing.Outbox) and is written, record by record, as the
peer frees room, while the listener polls; a peer whose outbox would pass max_queued_bytes is
dropped (`slow_consumers`). A reader that frees room while the listener sleeps rings its doorbell,
so a message larger than the ring (a CNN's weights) goes out chunk after chunk, not a nap apart.
Connections, which talk to one listener only, wait for room as before.

Waiting: spin on head, then sleep on the own doorbell. A sleeping consumer sets SLEEPING in the
control block of each ring it consumes; a producer that sees it after publishing rings the far side's
doorbell (one eventfd write). Only sleepers cost a syscall, so a ping-pong stays syscall-free. The
spinner yields the core every 16 polls (the process it waits for may need it). The spin adapts to how long messages took to come (wake-up included): it stretches to cover replies a
spin would have caught and halves over idle spells longer than any spin, because on a machine with
fewer cores than processes an idle server's spin is CPU taken from the processes doing work.
The flag and the head are plain stores; x86 may let each side read the other's before its own store
lands, so a sleep is also capped at _NAP_S: a missed ring costs at most that, never a hang.
"""

from __future__ import annotations

import itertools
import mmap
import os
import platform
import secrets
import select
import selectors
import socket
import struct
import sys
import threading
import time
from typing import Any, Callable

from rlbench.builtin import capabilities as caps
from rlbench.errors import RlbenchError
from rlbench.kit.checks import non_negative
from rlbench.kit.framing import (
    ACCEPT_BACKOFF_S,
    AddressError,
    Outbox,
    RequestReply,
    SlowConsumerError,
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
    slice_views,
    split_address,
)
from rlbench.protocols import Probe

_CONTROL_BYTES = 256
_HEAD, _SLEEPING, _TAIL, _CLOSED = 0, 8, 16, 24  # u64 indices in the control block: bytes 0, 64, 128, 192
_RECORD = struct.Struct("<II")
_MORE, _WRAP = 1, 2
_HANDSHAKE = struct.Struct("<QQ")  # ring data bytes, peer id
_SPIN = 500  # polls before a full ring's producer backs off (~0.2 us each here: ~100 us)
_YIELDS = 50
_MAX_SLEEP_S = 0.0005
# A consumer's adaptive spin before it sleeps. Waking a sleeper costs ~80 us on these VMs (as much as
# a kernel UDP round trip), so a reply that takes a replay node ~50-150 us of Python is worth spinning for.
_SPIN_MAX_S, _SPIN_MIN_S = 300e-6, 2e-6
_NAP_S = 0.002  # the longest sleep between checks of the ring, the far side's liveness and the deadline
_HANDSHAKE_FDS = 3  # ring memory, the listener's doorbell, the peer's doorbell
_LIVENESS_EVERY_S = 0.01
_PEERCRED = struct.Struct("3i")  # pid, uid, gid
_EXPIRY_EVERY_S = 0.05  # how often a listener looks for stalled chunked messages while any are open


class _PeerFault(Exception):
    """What the far side wrote into the ring breaks its rules; `counter` is the stat it adds to."""

    def __init__(self, counter: str, reason: str) -> None:
        super().__init__(reason)
        self.counter = counter


def probe() -> Probe:
    if not sys.platform.startswith("linux"):
        return Probe.missing(f"shm transport needs Linux (memfd_create, abstract Unix sockets); this is {sys.platform}")
    if not hasattr(os, "memfd_create") or not hasattr(socket, "send_fds"):
        return Probe.missing("shm transport needs os.memfd_create and socket.send_fds (Python >= 3.9 on Linux)")
    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64"):
        return Probe.missing(f"shm rings rely on x86-64 total store order; {machine} would need memory barriers")
    return Probe.ok()


def _pad8(n: int) -> int:
    return (n + 7) & ~7


_pack_record = _RECORD.pack_into
_unpack_record = _RECORD.unpack_from


class _Endpoint:
    """Producer on one ring, consumer on the other, and the liveness of the far side.

    The hot fields are flat attributes (no ring objects to chase): every attribute lookup costs
    tens of nanoseconds, and the whole round trip has a budget of a few microseconds.
    """

    __slots__ = ("memory", "sock", "far_doorbell", "dead", "last_liveness", "tx_control", "tx_data", "capacity", "mask",
                 "last_start", "max_chunk", "limit", "record_limit", "take_limit", "head", "tail_seen", "rx_control", "rx_data", "tail",
                 "assembled", "progress", "n_sent", "n_received", "bytes_sent", "bytes_received", "outbox")

    def __init__(self, memory: mmap.mmap, capacity: int, tx_base: int, rx_base: int,
                 sock: socket.socket | None, far_doorbell: int, limit: int) -> None:
        whole = memoryview(memory)
        self.memory = memory
        self.sock = sock  # None where another thread watches the far side for us
        self.far_doorbell = far_doorbell  # the consumer's eventfd: rung when it sleeps (owned, closed with us)
        self.dead = False  # the far side's socket reported EOF
        self.last_liveness = 0.0
        self.tx_control = whole[tx_base:tx_base + _CONTROL_BYTES].cast("Q")
        self.tx_data = whole[tx_base + _CONTROL_BYTES:tx_base + _CONTROL_BYTES + capacity]
        self.rx_control = whole[rx_base:rx_base + _CONTROL_BYTES].cast("Q")
        self.rx_data = whole[rx_base + _CONTROL_BYTES:rx_base + _CONTROL_BYTES + capacity]
        whole.release()
        self.capacity = capacity
        self.mask = capacity - 1
        self.last_start = capacity - _RECORD.size  # a record of length n may start at most n bytes before this
        self.max_chunk = capacity // 4 - _RECORD.size
        self.limit = limit  # max_message_bytes, both ways
        self.record_limit = min(self.max_chunk, limit)  # the largest single-record message
        self.take_limit = self.record_limit  # the same on receive; -1 while a chunked message is half here
        self.head = self.tx_control[_HEAD]  # our producer position (we are its only writer)
        self.tail_seen = self.tx_control[_TAIL]  # the consumer's tail when we last looked
        self.tail = self.rx_control[_TAIL]  # our consumer position; published at the next receive
        self.assembled: bytearray | None = None  # the chunks of a message so far
        self.progress = 0.0  # when its last chunk came
        self.n_sent = self.n_received = self.bytes_sent = self.bytes_received = 0
        self.outbox = Outbox()  # a listener's: what the ring could not take yet

    def stats(self) -> dict[str, int]:
        return new_stats(messages_sent=self.n_sent, messages_received=self.n_received,
                         bytes_sent=self.bytes_sent, bytes_received=self.bytes_received)

    # -- liveness (slow path only) ------------------------------------------------------------
    def far_side_gone(self) -> bool:
        if self.dead or self.rx_control[_CLOSED]:
            return True
        now = time.monotonic()
        if self.sock is not None and now - self.last_liveness >= _LIVENESS_EVERY_S:
            self.last_liveness = now
            try:
                if self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                    self.dead = True
            except BlockingIOError:
                pass
            except OSError:
                self.dead = True
        return self.dead

    # -- producing ----------------------------------------------------------------------------
    def _put_one(self, parts: tuple[Any, ...]) -> bool:
        """The common message: one byte-like part written as one record where the head is, if the
        ring has room for it now (the far side's tail is read again only when the one seen is short);
        False, with nothing written, otherwise."""
        if len(parts) != 1:
            return False
        part = parts[0]
        kind = type(part)
        if not (kind is bytes or kind is bytearray or (kind is memoryview and part.format == "B" and part.ndim == 1)):
            return False
        total = len(part)
        need = 8 + ((total + 7) & ~7)
        head = self.head
        position = head & self.mask
        capacity = self.capacity
        if total > self.record_limit or position + need > capacity:
            return False
        if head + need - self.tail_seen > capacity:
            self.tail_seen = self.tx_control[_TAIL]
            if head + need - self.tail_seen > capacity:
                return False
        data = self.tx_data
        _pack_record(data, position, total, 0)
        data[position + 8:position + 8 + total] = part
        self.head = head = head + need
        self.tx_control[0] = head  # publish after the payload (x86 TSO keeps the order)
        self.n_sent += 1
        self.bytes_sent += total
        if self.tx_control[_SLEEPING]:
            self.ring()
        return True

    def put(self, parts: tuple[Any, ...]) -> None:
        if not self._put_one(parts):
            self._put_records(*byte_views(parts))

    def put_now(self, parts: tuple[Any, ...]) -> bool:
        """`put` when the ring has room for the whole message now (nothing written otherwise): a
        listener never waits for a peer to read."""
        if self._put_one(parts):
            return True
        views, total = byte_views(parts)
        chunks = -(-total // self.max_chunk) or 1
        worst = 2 * (total + chunks * (_RECORD.size + 8))  # each record padded, and a WRAP before each at most
        if self.capacity - (self.head - self.tx_control[_TAIL]) < worst:
            return False
        self._put_records(views, total)
        return True

    def _put_records(self, views: list[memoryview], total: int) -> None:
        """A message as records (chunks of at most max_chunk), each written when the ring has room."""
        check_size(total, self.limit, "shm")
        chunk = self.max_chunk
        if total <= chunk:
            self._record(total, 0, views)
        else:
            sent = 0
            while sent < total:
                length = min(chunk, total - sent)
                self._record(length, _MORE if sent + length < total else 0, slice_views(views, sent, length))
                sent += length
        self.n_sent += 1
        self.bytes_sent += total
        if self.tx_control[_SLEEPING]:
            self.ring()

    def write_now(self, view: memoryview) -> int:
        """Write the message's remaining bytes `view` as whole records while the ring has room for
        them; the bytes taken, -1 when none (an Outbox's `write`)."""
        control, capacity, data = self.tx_control, self.capacity, self.tx_data
        total = view.nbytes
        taken = 0
        wrote = False
        while not wrote or taken < total:
            length = min(self.max_chunk, total - taken)
            need = _RECORD.size + _pad8(length)
            position = self.head & self.mask
            to_end = capacity - position
            if capacity - (self.head - control[_TAIL]) < need + (to_end if to_end < need else 0):
                break
            if to_end < need:
                _pack_record(data, position, 0, _WRAP)
                self.head += to_end
                position = 0
            _pack_record(data, position, length, _MORE if taken + length < total else 0)
            data[position + _RECORD.size:position + _RECORD.size + length] = view[taken:taken + length]
            self.head += need
            control[_HEAD] = self.head
            taken += length
            wrote = True
        if not wrote:
            return -1
        self.tail_seen = control[_TAIL]
        if control[_SLEEPING]:
            self.ring()
        return taken

    def ring(self) -> None:
        """Wake the consumer, which said it sleeps."""
        try:
            os.eventfd_write(self.far_doorbell, 1)
        except OSError:
            pass  # closed on our side at shutdown; the consumer's nap cap covers a lost ring

    def _wait_space(self, need: int) -> None:
        control, capacity = self.tx_control, self.capacity
        polls = 0
        while capacity - (self.head - control[_TAIL]) < need:
            if not polls and control[_SLEEPING]:
                self.ring()  # the records already published fill the ring: the consumer must drain them
            polls += 1
            if polls > _SPIN:
                if self.far_side_gone():
                    raise TransportClosedError("shm: the other side is gone")
                _back_off(polls)
        self.tail_seen = control[_TAIL]

    def _record(self, length: int, flags: int, views: list[memoryview]) -> None:
        """Write one record holding the views (`length` bytes in all); publish it."""
        need = _RECORD.size + _pad8(length)
        position = self.head & self.mask
        to_end = self.capacity - position
        data = self.tx_data
        if to_end < need:  # no record straddles the end: WRAP sends the consumer back to 0
            self._wait_space(to_end + need)
            _pack_record(data, position, 0, _WRAP)
            self.head += to_end
            position = 0
        else:
            self._wait_space(need)
        _pack_record(data, position, length, flags)
        offset = position + _RECORD.size
        for view in views:  # gather: copy each part straight into the ring
            data[offset:offset + view.nbytes] = view
            offset += view.nbytes
        self.head += need
        self.tx_control[_HEAD] = self.head

    # -- consuming ----------------------------------------------------------------------------
    def ready(self) -> bool:
        return self.rx_control[0] != self.tail

    def take(self, head: int) -> memoryview | None:
        """The next message (`head`, just read, is not the tail), or None while a chunked message waits
        for its next chunk. A single record comes back as a view of the ring. Raises _PeerFault for
        records that break the ring's rules."""
        tail = self.tail
        position = tail & self.mask
        length, flags = _unpack_record(self.rx_data, position)
        available = head - tail
        # The common case: one record within the limit, inside what head published, a head no further
        # ahead than the ring holds (else stale records would read as messages without end), inside
        # the data area. Anything else, or a chunked message under way, goes the slow way.
        if (not flags and length <= self.take_limit and length + 8 <= available <= self.capacity
                and position + length <= self.last_start):
            self.tail = tail + 8 + ((length + 7) & ~7)
            self.n_received += 1
            self.bytes_received += length
            return self.rx_data[position + 8:position + 8 + length]
        return self._take_records()

    def _take_records(self) -> memoryview | None:
        control, data, mask, capacity = self.rx_control, self.rx_data, self.mask, self.capacity
        while True:
            tail = self.tail
            available = control[_HEAD] - tail
            if not available:
                return None  # the rest of a chunked message is on its way; nobody waits for it here
            if not _RECORD.size <= available <= capacity:
                raise _PeerFault("malformed", f"head is {available} bytes from the tail of a {capacity}-byte ring")
            position = tail & mask
            length, flags = _unpack_record(data, position)
            if flags == _WRAP:
                if capacity - position > available:
                    raise _PeerFault("malformed", "a wrap record past what head published")
                self.tail = tail + capacity - position
                control[_TAIL] = self.tail
                continue
            need = _RECORD.size + _pad8(length)
            if flags & ~_MORE or length > self.max_chunk or position + need > capacity or need > available:
                raise _PeerFault("malformed", f"a record of {length} bytes, flags {flags:#x}, at {position} "
                                              f"with {available} bytes published")
            body = data[position + _RECORD.size:position + _RECORD.size + length]
            assembled = self.assembled
            if assembled is None and not flags:
                if length > self.limit:
                    raise _PeerFault("refused_oversize", f"a message of {length} bytes, over max_message_bytes={self.limit}")
                self.tail = tail + need  # published at the next receive, so the view stays valid
                message = body
                break
            size = length if assembled is None else len(assembled) + length
            if size > self.limit:
                raise _PeerFault("refused_oversize", f"a chunked message past {size} bytes, over max_message_bytes={self.limit}")
            if assembled is None:
                assembled = self.assembled = bytearray()
                self.take_limit = -1  # the next records belong to this message: none takes the fast path
            assembled += body
            self.progress = time.monotonic()
            self.tail = tail + need
            control[_TAIL] = self.tail  # free the chunk now so the producer can go on
            if self.tx_control[_SLEEPING]:  # a listener writes the rest as room frees, but sleeps: wake it
                self.ring()
            if not flags & _MORE:
                self.assembled = None
                self.take_limit = self.record_limit
                message = memoryview(assembled)
                break
        self.n_received += 1
        self.bytes_received += message.nbytes
        return message

    def close(self, sock_too: bool = True) -> None:
        self.tx_control[_CLOSED] = 1
        for view in (self.tx_control, self.tx_data, self.rx_control, self.rx_data):
            view.release()
        try:
            self.memory.close()
        except BufferError:
            pass  # a returned view is still alive; the mapping goes when it does
        if sock_too and self.sock is not None:
            self.sock.close()
        if self.far_doorbell >= 0:
            os.close(self.far_doorbell)
            self.far_doorbell = -1


def _back_off(polls: int) -> None:
    if polls <= _SPIN + _YIELDS:
        os.sched_yield()
    else:
        time.sleep(min(_MAX_SLEEP_S, 0.00002 * (polls - _SPIN - _YIELDS)))


class _Waiter:
    """A consumer's wait: an adaptive spin, then sleeps on its own doorbell (see the module's notes)."""

    __slots__ = ("doorbell", "spin_s", "watch")

    def __init__(self, doorbell: int, watch: tuple[Any, ...] = ()) -> None:
        self.doorbell = doorbell  # our eventfd, non-blocking
        self.spin_s = _SPIN_MAX_S
        self.watch = (doorbell, *watch)  # also wakes the sleep: e.g. the far side's socket at EOF

    def wait(self, ready: Callable[[], Any], timeout: float | None, on_idle: Callable[[], None],
             controls: Callable[[], list[memoryview]]) -> Any:
        """ready()'s first true result, or None when the timeout passes."""
        clock = time.perf_counter
        started = clock()
        spin_until = started + self.spin_s
        while True:
            for _ in range(16):
                result = ready()
                if result:
                    self.spin_s = min(_SPIN_MAX_S, max(self.spin_s, 2 * (clock() - started)))
                    return result
            if clock() >= spin_until:
                break
            os.sched_yield()  # a process this one waits for may need the core (more processes than cores)
        result = self._sleep(ready, timeout, on_idle, controls)
        # How long the message took, wake-up included: a spin that long would have caught it, so
        # spin about that long next time; an idle spell longer than any spin halves the spin.
        took = clock() - started
        self.spin_s = min(_SPIN_MAX_S, 2 * took) if took < _SPIN_MAX_S else max(_SPIN_MIN_S, self.spin_s / 2)
        return result

    def _sleep(self, ready: Callable[[], Any], timeout: float | None, on_idle: Callable[[], None],
               controls: Callable[[], list[memoryview]]) -> Any:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            on_idle()  # before the flags: it may drop peers that left, and their rings with them
            sleeping = controls()
            for control in sleeping:
                control[_SLEEPING] = 1
            result = ready()  # after the flag: a producer that published before it saw it is caught here
            if not result:
                nap = _NAP_S
                if deadline is not None:
                    nap = min(nap, deadline - time.monotonic())
                if nap > 0:
                    select.select(self.watch, (), (), nap)
                    try:
                        os.eventfd_read(self.doorbell)
                    except BlockingIOError:
                        pass
                result = ready()
            for control in sleeping:
                control[_SLEEPING] = 0
            if result:
                return result
            if deadline is not None and time.monotonic() >= deadline:
                return None

    def close(self) -> None:
        if self.doorbell >= 0:
            os.close(self.doorbell)
            self.doorbell = -1


def _new_doorbell() -> int:
    return os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)


def _socket_name(address: str) -> bytes:
    name = split_address(address, "shm")
    if "\0" in name or len(name) > 100:
        raise AddressError(f"shm address name must be 1-100 characters without NUL, got {address!r}")
    return b"\0rlbench-shm/" + name.encode()


class ShmConnection(RequestReply):
    scheme = "shm"

    def __init__(self, endpoint: _Endpoint, doorbell: int, address: str) -> None:
        self._endpoint = endpoint
        self._waiter = _Waiter(doorbell, watch=(endpoint.sock,))
        self._controls = [endpoint.rx_control]
        self._address = address
        self._closed = False

    def send(self, *parts: Any) -> None:
        if self._closed:
            raise TransportClosedError(f"shm connection to {self._address} is closed")
        self._endpoint.put(parts)

    def recv(self, timeout: float | None = None) -> memoryview | None:
        if self._closed:
            raise TransportClosedError(f"shm connection to {self._address} is closed")
        endpoint = self._endpoint
        control = endpoint.rx_control
        tail = endpoint.tail
        control[_TAIL] = tail  # the view returned last time is released now
        head = control[0]
        if head != tail:
            try:
                message = endpoint.take(head)
            except _PeerFault as fault:
                raise self._broken(fault) from None
            if message is not None:
                return message
        return self._wait(timeout)

    def _wait(self, timeout: float | None) -> memoryview | None:
        """Nothing here yet, or only the first chunks of a message: wait for the rest, up to `timeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                self._raise_if_gone()
                return None
            if self._waiter.wait(self._endpoint.ready, remaining, self._raise_if_gone, self._sleeping_on) is None:
                return None
            try:
                message = self._endpoint.take(self._endpoint.rx_control[0])
            except _PeerFault as fault:
                raise self._broken(fault) from None
            if message is not None:
                return message

    def _broken(self, fault: _PeerFault) -> TransportClosedError:
        self.close()
        return TransportClosedError(f"shm: listener {self._address} broke the ring's rules ({fault}); connection closed")

    def _sleeping_on(self) -> list[memoryview]:
        return self._controls

    def _raise_if_gone(self) -> None:
        if self._endpoint.far_side_gone() and not self._endpoint.ready():
            raise TransportClosedError(f"shm: listener {self._address} closed or died")

    @property
    def stats(self) -> dict[str, int]:
        return self._endpoint.stats()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._endpoint.close()
            self._waiter.close()


class ShmListener:
    def __init__(self, address: str, ring_bytes: int, limit: int, reassembly_timeout_s: float,
                 max_queued_bytes: int) -> None:
        self.address = address
        self._ring_bytes = ring_bytes
        self._limit = limit
        self._max_queued = max_queued_bytes
        self._backlogged: dict[int, _Endpoint] = {}  # peers with an outbox to write
        self._reassembly_timeout = reassembly_timeout_s
        self._uid = os.geteuid()
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._server.bind(_socket_name(address))
        except OSError as exc:
            self._server.close()
            raise AddressError(f"shm: cannot listen on {address!r}: {exc.strerror}") from None
        self._server.listen(64)
        self._endpoints: dict[int, _Endpoint] = {}
        self._sockets: dict[int, socket.socket] = {}  # to shut a dropped peer's socket (the accept thread owns it)
        self._order: list[tuple[int, _Endpoint]] = []  # round-robin polling order
        self._turn = 0
        self._held: _Endpoint | None = None
        self._next_peer = itertools.count(1)
        self._lock = threading.Lock()
        self._arrivals: list[tuple[int, _Endpoint, socket.socket]] = []  # filled by the accept thread
        self._wake_r, self._wake_w = os.pipe()
        self._waiter = _Waiter(_new_doorbell())
        self._closed = False
        self._departed = new_stats()  # the counters of peers no longer here
        self._closing: list[_Endpoint] = []  # dropped while their ring might be in the waiter's hands; closed when idle
        self._partials: dict[int, _Endpoint] = {}  # peers in the middle of a chunked message
        self._chores = False  # partials to watch or rings to close: one check on the fast path
        self._last_expiry = 0.0
        # truncated: chunked messages cut off by their peer leaving; refused_peers: connections from other users
        self._faults = listener_stats(reassembly_timeouts=0, truncated=0)
        self._refused_peers = 0  # written by the accept thread only
        self._accept_backoffs = 0  # (the same) pauses in accepting, out of descriptors
        # The accept thread keeps accepting (and watching peer sockets for EOF) off the polling path,
        # so polling stays free of syscalls however peers come and go.
        self._thread = threading.Thread(target=self._accept_loop, name=f"shm-accept {address}", daemon=True)
        self._thread.start()

    # -- accept thread ------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._server, selectors.EVENT_READ, "accept")
        selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        try:
            while True:
                for key, _ in selector.select():
                    if key.data == "wake":
                        return
                    if key.data == "accept":
                        accepted = self._accept()
                        if accepted is not None:
                            selector.register(accepted[0], selectors.EVENT_READ, accepted[1])
                    else:  # a peer's socket is readable: it only ever becomes so at EOF
                        key.data.dead = True
                        selector.unregister(key.fileobj)
                        key.fileobj.close()
        finally:
            for key in list(selector.get_map().values()):
                if isinstance(key.data, _Endpoint):
                    key.fileobj.close()
            selector.close()

    def _accept(self) -> tuple[socket.socket, _Endpoint] | None:
        try:
            sock, _ = self._server.accept()
        except OSError as exc:
            if out_of_descriptors(exc):  # the connection stays in the backlog and the socket readable:
                self._accept_backoffs += 1  # pause, or this thread spins (and takes the poller's GIL)
                time.sleep(ACCEPT_BACKOFF_S)
            return None
        _pid, uid, _gid = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
        if uid != self._uid:  # only the run's own processes: the abstract socket itself lets anyone connect
            self._refused_peers += 1  # counted before the peer can see the refusal
            sock.close()
            return None
        capacity = self._ring_bytes
        fd = peer_doorbell = -1
        try:  # any failure here (out of descriptors, a peer gone already) costs that peer only, never this thread
            fd = os.memfd_create("rlbench-shm", os.MFD_CLOEXEC)
            peer_doorbell = _new_doorbell()
            os.ftruncate(fd, 2 * (_CONTROL_BYTES + capacity))
            memory = mmap.mmap(fd, 2 * (_CONTROL_BYTES + capacity))
            peer = next(self._next_peer)
            socket.send_fds(sock, [_HANDSHAKE.pack(capacity, peer)], [fd, self._waiter.doorbell, peer_doorbell])
        except OSError:
            sock.close()
            if peer_doorbell >= 0:
                os.close(peer_doorbell)
            return None
        finally:
            if fd >= 0:
                os.close(fd)
        # The peer produces into the first ring, the listener into the second. The socket belongs to
        # this thread (it marks the endpoint dead at EOF), so the endpoint gets none to peek at.
        endpoint = _Endpoint(memory, capacity, tx_base=_CONTROL_BYTES + capacity, rx_base=0, sock=None,
                             far_doorbell=peer_doorbell, limit=self._limit)
        with self._lock:
            self._arrivals.append((peer, endpoint, sock))
        os.eventfd_write(self._waiter.doorbell, 1)  # a sleeping poller admits the newcomer now
        return sock, endpoint

    # -- polling ------------------------------------------------------------------------------
    def _admit(self) -> None:
        with self._lock:
            arrivals, self._arrivals = self._arrivals, []
        for peer, endpoint, sock in arrivals:
            self._endpoints[peer] = endpoint
            self._sockets[peer] = sock
        self._order = list(self._endpoints.items())

    def _poll_message(self) -> tuple[int, memoryview] | None:
        if self._backlogged:  # a dict's truth value: free while nothing waits
            self._flush_outboxes()
        if self._arrivals:  # a list's truth value: no syscall, however often we poll; a newcomer is
            self._admit()  # admitted now, not when every other peer has gone quiet
        order = self._order
        n = len(order)
        start = self._turn
        for i in range(n):  # round-robin, so a busy peer cannot starve the others
            peer, endpoint = order[(start + i) % n]
            head = endpoint.rx_control[0]
            if head != endpoint.tail:
                self._turn = (start + i + 1) % n
                try:
                    message = endpoint.take(head)
                except _PeerFault as fault:
                    self._drop(peer, fault.counter)
                    return None
                if message is None:  # part of a chunked message: keep it, serve the others meanwhile
                    self._partials[peer] = endpoint
                    self._chores = True
                    continue
                self._held = endpoint
                return peer, message
        return None

    def drop(self, peer: int, fault: str | None = None) -> None:
        """Close one peer's connection (`fault`: the counter it adds to, when it broke a rule); it is
        told, by the closed flag on its ring and the end of its socket."""
        self._drop(peer, fault, tell=True)

    def _drop(self, peer: int, fault: str | None = None, *, tell: bool | None = None) -> None:
        """Forget a peer: it left (fault None), or broke the rules (fault: the counter); the latter is
        told, by the closed flag on its ring and the end of its socket."""
        endpoint = self._endpoints.pop(peer, None)
        if endpoint is None:
            return
        self._order = list(self._endpoints.items())
        self._partials.pop(peer, None)
        self._backlogged.pop(peer, None)
        endpoint.outbox.clear()
        if endpoint is self._held:
            self._held = None
        if fault is not None:
            self._faults[fault] += 1
            self._faults["dropped_peers"] += 1
        elif endpoint.assembled is not None:
            self._faults["truncated"] += 1
        endpoint.tx_control[_CLOSED] = 1
        sock = self._sockets.pop(peer)
        if fault is not None or tell:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # the accept thread sees the EOF and closes it
            except OSError:
                pass  # closed already: the peer left first
        self._retire(endpoint)

    def _retire(self, endpoint: _Endpoint) -> None:
        """Keep a departed endpoint's counters; close it when no waiter can hold its ring."""
        for key, value in endpoint.stats().items():
            self._departed[key] += value
        self._closing.append(endpoint)
        self._chores = True

    def _close_retired(self) -> None:
        for endpoint in self._closing:
            endpoint.close(sock_too=False)
        self._closing.clear()

    def _expire_partials(self) -> None:
        """Drop peers whose chunked message stopped coming (slow path; a few times a second at most)."""
        now = time.monotonic()
        if now - self._last_expiry < _EXPIRY_EVERY_S:
            return
        self._last_expiry = now
        for peer, endpoint in list(self._partials.items()):
            if endpoint.assembled is None:
                del self._partials[peer]  # finished
            elif endpoint.ready():
                continue  # its next chunk is here
            elif endpoint.far_side_gone():
                self._drop(peer)
            elif now - endpoint.progress > self._reassembly_timeout:
                self._drop(peer, "reassembly_timeouts")

    def _on_idle(self) -> None:
        """Forget peers that left and whose ring is drained; give back the rings of dropped peers (slow path only)."""
        for peer in [peer for peer, endpoint in self._order if not endpoint.ready() and endpoint.far_side_gone()]:
            self._drop(peer)
        if self._partials:
            self._expire_partials()
        self._close_retired()  # before the waiter flags the rings it sleeps on: these are gone

    def recv(self, timeout: float | None = None) -> tuple[int, memoryview] | None:
        if self._closed:
            raise listener_closed("shm", self.address)
        held = self._held
        if held is not None:  # the view returned last time is released now
            held.rx_control[_TAIL] = held.tail
        if self._chores:
            if self._partials:
                self._expire_partials()
            if self._closing:
                self._close_retired()
            self._chores = bool(self._partials or self._closing)
        item = self._poll_message()
        if item is None:
            if timeout is not None and timeout <= 0:
                self._on_idle()
                return None
            item = self._waiter.wait(self._poll_message, timeout, self._on_idle, self._sleeping_on)
        return item

    def _sleeping_on(self) -> list[memoryview]:
        return [endpoint.rx_control for _, endpoint in self._order]

    def send(self, peer: int, *parts: Any) -> None:
        if self._closed:
            raise listener_closed("shm", self.address)
        endpoint = self._endpoints.get(peer)
        if endpoint is None and self._arrivals:
            self._admit()
            endpoint = self._endpoints.get(peer)
        if endpoint is None or endpoint.dead or endpoint.rx_control[_CLOSED]:
            raise not_connected("shm", peer, self.address)
        if peer not in self._backlogged and endpoint.put_now(parts):  # (backlogged: its outbox holds messages)
            return
        outbox = endpoint.outbox
        views, total = byte_views(parts)
        check_size(total, self._limit, "shm")
        if not outbox.admits(total, self._max_queued):
            queued = outbox.queued
            self._drop(peer, "slow_consumers")
            raise SlowConsumerError(f"shm: peer {peer} was dropped: it did not read what was sent to it ({queued} "
                                    f"bytes waiting, max_queued_bytes={self._max_queued})")
        outbox.push(joined(views))
        endpoint.n_sent += 1
        endpoint.bytes_sent += total
        self._backlogged[peer] = endpoint
        self._flush_outboxes()

    def _flush_outboxes(self) -> None:
        """Write what peers' rings take now of what waits for them (a peer that left is dropped)."""
        for peer, endpoint in list(self._backlogged.items()):
            if endpoint.outbox.flush(endpoint.write_now):
                del self._backlogged[peer]
            elif endpoint.far_side_gone():
                self._drop(peer)

    @property
    def peers(self) -> list[int]:
        if self._arrivals:
            self._admit()
        return [peer for peer, endpoint in self._endpoints.items() if not endpoint.dead]

    @property
    def stats(self) -> dict[str, int]:
        total = dict(self._faults, refused_peers=self._refused_peers, accept_backoffs=self._accept_backoffs)
        for counters in [self._departed, *(endpoint.stats() for endpoint in self._endpoints.values())]:
            for key, value in counters.items():
                total[key] += value
        return total

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        os.write(self._wake_w, b"x")
        self._thread.join(timeout=5)
        self._server.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
        self._waiter.close()
        self._admit()
        for endpoint in self._endpoints.values():
            self._retire(endpoint)
        self._close_retired()
        self._endpoints.clear()
        self._order = []


# Each ring's data bytes (a connection has two; the listener creates them). 4 MiB: an image run's
# largest messages (an Atari BATCH of 32, 1.1-1.8 MB; a framed INSERT, ~0.9 MB) go into an empty ring
# at once, where 1 MiB cut them into chunks that wait for the reader: measured here, a 1.8 MB reply
# 0.17-0.20 ms at p50 against 0.35-0.53 ms, a replay node's image SAMPLE 0.36 ms against 0.66 ms, a
# 22 KB echo unchanged (27-31 us at 1, 4 and 8 MiB). 8 MiB gained nothing more on a SAMPLE (0.33 ms).
RING_BYTES = 4 << 20


class ShmTransport:
    capabilities = caps.SHM

    def __init__(self, ring_bytes: int = RING_BYTES, max_message_bytes: int | None = None,
                 reassembly_timeout_s: float = 2.0, max_queued_bytes: int | None = None) -> None:
        if ring_bytes < 4096 or ring_bytes & (ring_bytes - 1):
            raise RlbenchError(f"shm ring_bytes must be a power of two >= 4096, got {ring_bytes}")
        self.ring_bytes = ring_bytes
        self.max_message_bytes = message_limit(max_message_bytes, self.capabilities.max_message_bytes, "shm")
        self.reassembly_timeout_s = non_negative(reassembly_timeout_s, "shm: reassembly_timeout_s")
        self.max_queued_bytes = queued_bytes_limit(max_queued_bytes, "shm")

    def listen(self, address: str | None = None) -> ShmListener:
        if address is None:
            address = f"shm://{os.getpid()}-{secrets.token_hex(4)}"
        return ShmListener(address, self.ring_bytes, self.max_message_bytes, self.reassembly_timeout_s,
                           self.max_queued_bytes)

    def connect(self, address: str, timeout: float = 10.0) -> ShmConnection:
        name = _socket_name(address)
        deadline = time.monotonic() + timeout
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        while True:  # the listener may still be starting in another process
            try:
                sock.connect(name)
                break
            except (ConnectionRefusedError, FileNotFoundError) as exc:
                if time.monotonic() >= deadline:
                    sock.close()
                    raise TransportClosedError(f"shm: nothing listens on {address} (within {timeout} s): {exc}") from None
                time.sleep(0.01)
        try:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            message, fds, _, _ = socket.recv_fds(sock, _HANDSHAKE.size, _HANDSHAKE_FDS)
            sock.settimeout(None)
        except (socket.timeout, OSError) as exc:
            sock.close()
            raise TransportClosedError(f"shm: handshake with {address} failed: {exc}") from None
        if len(message) != _HANDSHAKE.size or len(fds) != _HANDSHAKE_FDS:
            sock.close()
            for fd in fds:
                os.close(fd)
            if not message:
                raise TransportClosedError(f"shm: {address} closed the connection without a handshake (an shm listener "
                                           f"accepts only processes of its own user; this one runs as uid {os.geteuid()})")
            raise TransportClosedError(f"shm: {address} did not answer the handshake (is it an rlbench shm listener?)")
        capacity, _peer = _HANDSHAKE.unpack(message)
        memory_fd, listener_doorbell, own_doorbell = fds
        try:
            memory = mmap.mmap(memory_fd, 2 * (_CONTROL_BYTES + capacity))
        finally:
            os.close(memory_fd)
        endpoint = _Endpoint(memory, capacity, tx_base=0, rx_base=_CONTROL_BYTES + capacity, sock=sock,
                             far_doorbell=listener_doorbell, limit=self.max_message_bytes)
        return ShmConnection(endpoint, own_doorbell, address)
