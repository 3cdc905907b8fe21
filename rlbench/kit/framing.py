"""What every built-in transport shares: turning parts into byte views, limits, errors, counters.

The rules a transport keeps on receive, whoever sent the bytes: a message over the receiving side's
max_message_bytes is refused before anything is allocated for it, memory follows the bytes that
actually arrived (never a length the sender claims), and a peer that breaks the rules is dropped and
counted (`listener_stats`) while everyone else is still served.
"""

from __future__ import annotations

from typing import Any, Iterable

from rlbench.errors import RlbenchError
from rlbench.kit.checks import positive_int


class MessageTooLargeError(RlbenchError, ValueError):
    """A message exceeds the transport's max_message_bytes."""


class TransportClosedError(RlbenchError, ConnectionError):
    """The other side closed (or crashed), or this side was closed."""


class AddressError(RlbenchError, ValueError):
    """An address string this transport cannot use."""


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
        self.send(*parts)  # type: ignore[attr-defined]
        reply = self.recv(timeout)  # type: ignore[attr-defined]
        if reply is None:
            raise TimeoutError(f"{self.scheme}: no reply from {self._address} within {timeout} s")
        return reply


def check_size(total: int, limit: int, transport: str) -> None:
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
    rest = split_address(address, scheme)
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit():
        raise AddressError(f"{scheme} address must be '{scheme}://HOST:PORT', got {address!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def new_stats(**extra: int) -> dict[str, int]:
    stats = {"messages_sent": 0, "messages_received": 0, "bytes_sent": 0, "bytes_received": 0, "lost": 0}
    stats.update(extra)
    return stats


# What a listener counts about peers that break the rules (every built-in listener has these keys):
#   refused_oversize: messages over the receiving side's max_message_bytes, refused before allocation
#   malformed:        frames, datagrams or ring records that do not parse
#   dropped_peers:    peers disconnected for either (or, on shm, for a message that stopped coming)
PEER_FAULTS = ("refused_oversize", "malformed", "dropped_peers")


def listener_stats(**extra: int) -> dict[str, int]:
    return new_stats(**dict.fromkeys(PEER_FAULTS, 0), **extra)


def not_connected(transport: str, peer: int, address: str) -> TransportClosedError:
    """What `listener.send` raises for a peer id it does not (or no longer) serve."""
    return TransportClosedError(f"{transport}: peer {peer} is not connected to {address} (it left, was dropped, "
                                "or never was)")


def listener_closed(transport: str, address: str) -> TransportClosedError:
    return TransportClosedError(f"{transport} listener {address} is closed")
