"""What every built-in transport shares: turning parts into byte views, limits, errors, counters.

The rules a transport keeps on receive, whoever sent the bytes: a message over the receiving side's
max_message_bytes is refused before anything is allocated for it, memory follows the bytes that
actually arrived (never a length the sender claims), and a peer that breaks the rules is dropped and
counted (`listener_stats`) while everyone else is still served.

And on a listener's send, whoever the peer is: `send` never waits on that peer. What its medium
cannot take now waits in the peer's `Outbox` and goes out as the peer reads, during the listener's
later calls; the outbox is bounded (ZeroMQ's high-water mark, Reverb's per-stream queues): a peer
whose outbox would grow past `max_queued_bytes` is dropped and counted in `slow_consumers`, and
that send raises `SlowConsumerError`. One slow reader thus never stalls the listener's other peers.
"""

from __future__ import annotations

import errno
import math
import time
from collections import deque
from typing import Any, Callable, Iterable

from rlbench.errors import RlbenchError
from rlbench.kit.checks import non_negative, positive_int


class MessageTooLargeError(RlbenchError, ValueError):
    """A message exceeds the transport's max_message_bytes."""


class TransportClosedError(RlbenchError, ConnectionError):
    """The other side closed (or crashed), or this side was closed."""


class SlowConsumerError(TransportClosedError):
    """A listener dropped a peer that did not read what was sent to it (its outbox reached the bound)."""


class AddressError(RlbenchError, ValueError):
    """An address string this transport cannot use."""


# glibc hands a freed block above its mmap threshold (or a heap top above its trim threshold) back to
# the kernel, so the next message of that size is fresh memory: every page of it faults on first touch.
# At an image run's sizes (0.9-6.7 MB per message, several copies each: a codec's, an outbox's, a
# reassembly's, a memory's stacks) that was most of a replay node's time: a SAMPLE of 32 Atari
# transitions took 3.4 ms over shm, 0.5 ms once freed blocks were kept for reuse (the node's own
# handling 1.6 ms -> 0.17 ms). Blocks up to MMAP_THRESHOLD_BYTES now come from the heap, and up to
# TRIM_THRESHOLD_BYTES of free heap is kept: a process's resident memory may stay that much higher.
MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's largest (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit)
TRIM_THRESHOLD_BYTES = 256 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
_reusing: bool | None = None


def reuse_freed_memory() -> bool:
    """Keep freed message-sized blocks for reuse in this process (see above); once per process, where
    the C library is glibc (elsewhere nothing changes: False)."""
    global _reusing
    if _reusing is None:
        import ctypes
        import ctypes.util

        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            mallopt = libc.mallopt
        except (OSError, AttributeError):
            _reusing = False
        else:
            _reusing = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
                mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
    return _reusing


def byte_views(parts: Iterable[Any]) -> tuple[list[memoryview], int]:
    """Flat unsigned-byte views of each part (no copy when the part is contiguous) and their total size."""
    views = []
    total = 0
    for part in parts:
        view = part if isinstance(part, memoryview) else memoryview(part)
        if view.format != "B" or view.ndim != 1:
            # cast() needs C-contiguous memory; anything else is copied once, in C order.
            view = view.cast("B") if view.c_contiguous else memoryview(view.tobytes())
        views.append(view)
        total += view.nbytes
    return views, total


def slice_views(views: list[memoryview], start: int, length: int) -> list[memoryview]:
    """The byte range [start, start+length) of the concatenated views, as views (no copy)."""
    out = []
    for view in views:
        size = view.nbytes
        if start >= size:
            start -= size
            continue
        take = min(size - start, length)
        out.append(view[start:start + take])
        length -= take
        start = 0
        if not length:
            break
    return out


class RequestReply:
    """`request` for connections whose `recv` returns None on timeout: send, then wait for the reply.
    A connection sets `scheme` and `_address`, for the error."""

    scheme = ""
    _address = ""

    def request(self, *parts: Any, timeout: float | None = None) -> memoryview:
        """Send `parts`, then return the reply; TimeoutError when none came within `timeout` seconds."""
        self.send(*parts)  # type: ignore[attr-defined]
        reply = self.recv(timeout)  # type: ignore[attr-defined]
        if reply is None:
            raise TimeoutError(f"{self.scheme}: no reply from {self._address} within {timeout} s")
        return reply


def check_size(total: int, limit: int, transport: str) -> None:
    """Raise MessageTooLargeError when a message of `total` bytes is over `limit` (a send's own check)."""
    if total > limit:
        raise MessageTooLargeError(
            f"{transport}: message of {total} bytes exceeds max_message_bytes={limit}; split it or raise the limit")


def message_limit(requested: Any, capability: int, transport: str) -> int:
    """The `max_message_bytes=` a transport factory was given: at most the registered capability (a
    server runs with the limit its protocol needs); None means the capability."""
    if requested is None:
        return capability
    limit = positive_int(requested, f"{transport}: max_message_bytes")
    if limit > capability:
        raise RlbenchError(f"{transport}: max_message_bytes={limit} exceeds what the transport can carry ({capability})")
    return limit


def split_address(address: str, scheme: str) -> str:
    """The part after "<scheme>://", or a clear error naming the expected form."""
    prefix = scheme + "://"
    if not isinstance(address, str) or not address.startswith(prefix) or len(address) == len(prefix):
        raise AddressError(f"{scheme} transport needs an address like '{prefix}...', got {address!r}")
    return address[len(prefix):]


def host_port(address: str, scheme: str) -> tuple[str, int]:
    """'SCHEME://HOST:PORT' -> (host, port): brackets around an IPv6 host removed, an empty host 127.0.0.1;
    AddressError when there is no numeric port."""
    rest = split_address(address, scheme)
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit():
        raise AddressError(f"{scheme} address must be '{scheme}://HOST:PORT', got {address!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def new_stats(**extra: int) -> dict[str, int]:
    """A connection's counters (messages and bytes sent and received, `lost`), zero, plus `extra`."""
    stats = {"messages_sent": 0, "messages_received": 0, "bytes_sent": 0, "bytes_received": 0, "lost": 0}
    stats.update(extra)
    return stats


# What a listener counts about peers that break the rules (every built-in listener has these keys):
#   refused_oversize: messages over the receiving side's max_message_bytes, refused before allocation
#   malformed:        frames, datagrams or ring records that do not parse
#   slow_consumers:   peers dropped because they did not read what was sent to them (Outbox)
#   dropped_peers:    peers disconnected for any of these (or, on shm, for a message that stopped coming)
PEER_FAULTS = ("refused_oversize", "malformed", "slow_consumers", "dropped_peers")


def listener_stats(**extra: int) -> dict[str, int]:
    """A listener's counters: new_stats' plus PEER_FAULTS, zero, plus `extra`."""
    return new_stats(**dict.fromkeys(PEER_FAULTS, 0), **extra)


def not_connected(transport: str, peer: int, address: str) -> TransportClosedError:
    """What `listener.send` raises for a peer id it does not (or no longer) serve."""
    return TransportClosedError(f"{transport}: peer {peer} is not connected to {address} (it left, was dropped, "
                                "or never was)")


def listener_closed(transport: str, address: str) -> TransportClosedError:
    """The TransportClosedError that `recv` and `send` on a closed listener raise."""
    return TransportClosedError(f"{transport} listener {address} is closed")


# ------------------------------------------------------------------------------ outbound queues
# The default bound of one peer's outbox. An honest rlbench peer has a reply or two and a few pushed
# batches outstanding; 8 MiB holds that many times over for any usual batch or policy, and keeps a
# listener's memory bounded while a peer misbehaves.
MAX_QUEUED_BYTES = 8 << 20
# What one queued message costs beside its bytes (its bytes object and view): counted against the
# bound, so a flood of tiny replies is bounded in memory, not only in payload
MESSAGE_OVERHEAD_BYTES = 256


def queued_bytes_limit(requested: Any, transport: str) -> int:
    """The `max_queued_bytes=` a transport factory was given (None: MAX_QUEUED_BYTES)."""
    return MAX_QUEUED_BYTES if requested is None else positive_int(requested, f"{transport}: max_queued_bytes")


class Outbox:
    """What a listener could not hand to one peer's medium yet: whole messages in order, the first
    perhaps partly written. A message is always taken into an empty outbox (so any message within
    max_message_bytes can be sent to a peer that reads); behind others, only while the outbox stays
    within `limit` bytes.

    The transport supplies `write(view) -> bytes taken` to `flush`: -1 when the medium takes nothing
    now (so an empty message is told apart from a full medium); a medium that takes a message only
    in whole pieces (ring records, datagrams) takes whole pieces.
    """

    __slots__ = ("messages", "queued", "written")

    def __init__(self) -> None:
        self.messages: deque[memoryview] = deque()
        self.queued = 0  # bytes not yet written
        self.written = 0  # bytes of the first message already written

    def __bool__(self) -> bool:
        return bool(self.messages)

    def __len__(self) -> int:
        return len(self.messages)

    def admits(self, nbytes: int, limit: int) -> bool:
        """Whether a message of `nbytes` fits under `limit` with what is queued (each message also
        counting MESSAGE_OVERHEAD_BYTES); an empty outbox always takes one."""
        return not self.messages or self.queued + (len(self.messages) + 1) * MESSAGE_OVERHEAD_BYTES + nbytes <= limit

    def push(self, message: Any) -> None:
        """Queue a message the caller will not change (bytes, or a copy the transport made)."""
        view = message if isinstance(message, memoryview) else memoryview(message)
        self.messages.append(view)
        self.queued += view.nbytes

    def flush(self, write: Callable[[memoryview], int]) -> bool:
        """Write what the medium takes now, in order; True when the outbox is empty."""
        messages = self.messages
        while messages:
            first = messages[0]
            rest = first[self.written:] if self.written else first
            taken = write(rest)
            if taken < 0:
                return False
            self.queued -= taken
            if taken < rest.nbytes:
                self.written += taken
                return False
            messages.popleft()
            self.written = 0
        return True

    def clear(self) -> int:
        """Forget everything queued (the peer is gone); how many messages that was."""
        dropped = len(self.messages)
        self.messages.clear()
        self.queued = self.written = 0
        return dropped


# ------------------------------------------------------------------------------------ admission
# What a listener in admission mode counts (every listener that declares `admission` has these keys):
#   strangers_shed:     strangers closed to keep within the bounds: the one that joined longest ago, for
#                       a newcomer past max_strangers (or out of descriptors); a newcomer turned away when
#                       every other place is an admitted peer's
#   handshake_timeouts: strangers closed because they were not admitted within handshake_s
ADMISSION_COUNTERS = ("strangers_shed", "handshake_timeouts")
# How long a listener stops accepting when the process is out of descriptors and it has no stranger to
# shed: long enough that the loop does not spin on a listening socket that stays readable, short
# enough that a connection freed meanwhile is taken soon (Twisted and Tornado pause similarly).
ACCEPT_BACKOFF_S = 0.05


class Strangers:
    """The bookkeeping of a listener's admission mode (`Listener.expect_admission`): the peers it has
    not been told are admitted (`admit`), each with the time of its last step in the handshake.

    Kept apart from admitted peers, as a SYN queue is kept apart from established connections: at
    most `limit` strangers (a newcomer past it sheds one), each shed when it says nothing for
    `handshake_s` after joining or is not admitted `handshake_s` after it first spoke (`heard`), and
    never one in an admitted peer's place. Strangers that never spoke are shed first, the one that
    joined longest ago: an honest peer speaks at once, so a flood of idle connections sheds its own
    before a peer in the middle of its handshake. The listener applies the verdicts (it closes the
    peers named here and counts them in ADMISSION_COUNTERS); every call here costs O(1).
    """

    __slots__ = ("on", "handshake_s", "limit", "_quiet", "_spoke")

    def __init__(self) -> None:
        self.on = False  # admission mode: off until `expect` (a listener then keeps today's rules)
        self.handshake_s = math.inf
        self.limit = 0
        # peer -> when it joined / first spoke (monotonic); each in that order, the oldest first
        self._quiet: dict[int, float] = {}
        self._spoke: dict[int, float] = {}

    def expect(self, handshake_s: Any, max_strangers: Any, transport: str) -> None:
        """Switch admission mode on (`handshake_s` > 0 seconds, `max_strangers` >= 1), or refuse bad values."""
        handshake_s = non_negative(handshake_s, f"{transport}: handshake_s")
        if handshake_s == 0:
            raise RlbenchError(f"{transport}: handshake_s must be more than 0 s, got 0")
        self.limit = positive_int(max_strangers, f"{transport}: max_strangers")
        self.handshake_s = handshake_s
        self.on = True

    def __len__(self) -> int:
        return len(self._quiet) + len(self._spoke)

    def __contains__(self, peer: object) -> bool:
        return peer in self._quiet or peer in self._spoke

    def join(self, peer: int) -> int | None:
        """A newcomer joins (in admission mode); the stranger to shed for it when the pool is full
        (`oldest` of those before it: a newcomer has had no time to speak)."""
        if not self.on:
            return None
        crowded = self.oldest() if len(self) >= self.limit else None
        self._quiet[peer] = time.monotonic()
        return crowded

    def heard(self, peer: int) -> None:
        """The peer sent something (a stranger's handshake has begun: its second deadline starts)."""
        if self._quiet.pop(peer, None) is not None:
            self._spoke[peer] = time.monotonic()

    def admit(self, peer: int) -> bool:
        """The peer is no stranger from now on; False when it was not one (unknown, or admitted before)."""
        return (self._quiet.pop(peer, None) if peer in self._quiet else self._spoke.pop(peer, None)) is not None

    def leave(self, peer: int) -> None:
        """The peer is gone (left, dropped or shed)."""
        self.admit(peer)

    def oldest(self) -> int | None:
        """The stranger to shed first: the quiet one that joined longest ago, else the one that spoke
        longest ago; None when there is none."""
        return next(iter(self._quiet if self._quiet else self._spoke), None)

    def overdue(self) -> int | None:
        """A stranger whose time is up, else None (two looks per call)."""
        now = time.monotonic()
        for pool in (self._quiet, self._spoke):
            for peer, since in pool.items():
                if now - since >= self.handshake_s:
                    return peer
                break
        return None


def out_of_descriptors(exc: OSError) -> bool:
    """Whether an accept (or socket) failed for want of descriptors or kernel memory, not for the peer."""
    return exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


def raise_descriptor_limit() -> dict[str, int]:
    """Raise this process's soft limit of open descriptors to its hard limit (a server holds one per
    peer: the common soft limit of 1,024 is reached by 1,024 idle connections); the figures before and
    after, for the server's report. Unchanged where the system refuses (or has no such limit)."""
    try:
        import resource
    except ImportError:  # not a POSIX system
        return {}
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    raised = soft
    if hard != resource.RLIM_INFINITY and soft != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            raised = hard
        except (OSError, ValueError):
            pass
    return {"soft_before": soft, "soft": raised, "hard": hard}


def joined(views: list[memoryview], skip: int = 0) -> bytes:
    """The bytes of the concatenated views from offset `skip` on: one copy, for an outbox."""
    if skip:
        total = sum(view.nbytes for view in views)
        views = slice_views(views, skip, total - skip)
    return b"".join(views)
