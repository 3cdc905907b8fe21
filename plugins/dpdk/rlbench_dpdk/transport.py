"""The `dpdk` transport: rlbench's Transport protocol over the C shim's links.

Addresses:
- ``dpdk://memif/NAME`` — the listener is a memif server; each connecting peer first asks it, over
  the abstract Unix socket ``rlbench-dpdk-ctl/NAME``, for a memif interface of its own (one socket,
  one interface per peer), then talks over that interface only.
- ``dpdk://wire/TOKEN`` — the listener sits on a port on the wire (af_packet, af_xdp, a NIC); a peer
  opens a port of its own (its transport's ``port``, e.g. ``af_packet:veth1`` in another network
  namespace) and says hello to the listener with that token.

Every call into C is coarse: a whole message per send, send + wait for the reply in one request.
Waits longer than a second are cut into one-second C calls so that signals still reach Python.

`max_message_bytes` bounds what either side sends (MessageTooLargeError) and accepts: the shim
refuses a longer message from its first frame, before allocating anything, and drops that peer.

A listener's `send` never waits on its peer (rlbench.kit.framing's slow-consumer rule): what the
link's window cannot take now is copied to the peer's queue in the shim and framed as the peer
acknowledges, during the listener's later `recv` and `send` calls; a peer whose queue would pass
`max_queued_bytes` is dropped, counted in `slow_consumers`, and that send raises SlowConsumerError.
"""

from __future__ import annotations

import os
import secrets
import socket
import struct
import threading
from typing import Any

from rlbench.kit.checks import non_negative, positive_int
from rlbench.kit.framing import (AddressError, SlowConsumerError, TransportClosedError, byte_views, check_size,
                                 listener_closed, message_limit, not_connected, queued_bytes_limit)
from rlbench_dpdk.capabilities import CAPABILITIES, DEFAULT_MTU, MEMIF_MTU_RANGE
from rlbench_dpdk.native import STAT_NAMES, DpdkError, ensure_eal, error_text, library
from rlbench_dpdk.ports import PortSpec, memif_devargs

_ETIMEDOUT, _ENOTCONN, _ENOBUFS = 110, 107, 105
_SLICE_NS = 1_000_000_000
_HANDSHAKE = struct.Struct("<II")  # memif interface id, listener token


def _ns(timeout: float | None) -> int | None:
    return None if timeout is None else max(0, int(timeout * 1e9))


class _Calls:
    """Argument buffers reused across calls (allocating cdata per call costs microseconds)."""

    def __init__(self, ffi: Any) -> None:
        self.ffi = ffi
        self.capacity = 16
        self.pointers = ffi.new("uint8_t *[]", self.capacity)
        self.lengths = ffi.new("uint32_t[]", self.capacity)
        self.data = ffi.new("uint8_t **")
        self.peer = ffi.new("int *")

    def fill(self, parts: tuple[Any, ...], limit: int) -> tuple[int, list[Any]]:
        """Point the argument arrays at the parts (no copy); returns (count, objects to keep alive)."""
        ffi = self.ffi
        if len(parts) == 1 and type(parts[0]) is bytes:  # the common small message
            keep = [ffi.from_buffer("uint8_t[]", parts[0])]
            check_size(len(parts[0]), limit, "dpdk")
            self.pointers[0] = keep[0]
            self.lengths[0] = len(parts[0])
            return 1, keep
        views, total = byte_views(parts)
        check_size(total, limit, "dpdk")
        if len(views) > self.capacity:
            self.capacity = len(views)
            self.pointers = ffi.new("uint8_t *[]", self.capacity)
            self.lengths = ffi.new("uint32_t[]", self.capacity)
        keep = []
        for i, view in enumerate(views):
            buffer = ffi.from_buffer("uint8_t[]", view)
            keep.append(buffer)
            self.pointers[i] = buffer
            self.lengths[i] = view.nbytes
        return len(views), keep


def _raise_for(code: int, ffi: Any, lib: Any, what: str) -> None:
    if code == -_ENOBUFS:
        raise SlowConsumerError(f"dpdk: {what}: {error_text(ffi, lib)}")
    if code == -_ENOTCONN:
        raise TransportClosedError(f"dpdk: {what}: {error_text(ffi, lib)}")
    raise DpdkError(f"dpdk: {what} failed ({os.strerror(-code)}): {error_text(ffi, lib)}")


class DpdkConnection:
    def __init__(self, lib: Any, ffi: Any, link: int, port: int, address: str, limit: int) -> None:
        self._lib, self._ffi = lib, ffi
        self._link, self._port = link, port
        self._address = address
        self._limit = limit
        self._calls = _Calls(ffi)
        self._closed = False
        self._stats = ffi.new("uint64_t[]", len(STAT_NAMES))

    def _check_open(self) -> None:
        if self._closed:
            raise TransportClosedError(f"dpdk connection to {self._address} is closed")

    def send(self, *parts: Any) -> None:
        self._check_open()
        n, _keep = self._calls.fill(parts, self._limit)
        rc = self._lib.rlb_send(self._link, self._calls.pointers, self._calls.lengths, n)
        if rc < 0:
            _raise_for(rc, self._ffi, self._lib, f"send to {self._address}")

    def _wait(self, timeout_ns: int | None) -> memoryview | None:
        lib, calls = self._lib, self._calls
        while True:
            step = _SLICE_NS if timeout_ns is None else min(timeout_ns, _SLICE_NS)
            n = lib.rlb_recv(self._link, step, calls.data)
            if n >= 0:
                return memoryview(self._ffi.buffer(calls.data[0], n))
            if n != -_ETIMEDOUT:
                _raise_for(n, self._ffi, lib, f"receive from {self._address}")
            if timeout_ns is not None:
                timeout_ns -= step
                if timeout_ns <= 0:
                    return None

    def recv(self, timeout: float | None = None) -> memoryview | None:
        self._check_open()
        return self._wait(_ns(timeout))

    def request(self, *parts: Any, timeout: float | None = None) -> memoryview:
        self._check_open()
        calls = self._calls
        n, _keep = calls.fill(parts, self._limit)
        timeout_ns = _ns(timeout)
        step = _SLICE_NS if timeout_ns is None else min(timeout_ns, _SLICE_NS)
        got = self._lib.rlb_request(self._link, calls.pointers, calls.lengths, n, step, calls.data)
        if got >= 0:
            return memoryview(self._ffi.buffer(calls.data[0], got))
        if got != -_ETIMEDOUT:
            _raise_for(got, self._ffi, self._lib, f"request to {self._address}")
        reply = self._wait(None if timeout_ns is None else timeout_ns - step) if timeout_ns != step else None
        if reply is None:
            raise TimeoutError(f"dpdk: no reply from {self._address} within {timeout} s")
        return reply

    @property
    def stats(self) -> dict[str, int]:
        if not self._closed:
            self._lib.rlb_link_stats(self._link, self._stats)
        return dict(zip(STAT_NAMES, (int(v) for v in self._stats)))

    def close(self) -> None:
        if self._closed:
            return
        self.stats  # keep the final counters readable after close
        self._closed = True
        self._lib.rlb_link_close(self._link)
        self._lib.rlb_port_close(self._port)


class DpdkListener:
    def __init__(self, transport: "DpdkTransport", lib: Any, ffi: Any, address: str | None) -> None:
        self._lib, self._ffi = lib, ffi
        self._spec = transport.port_spec
        self._mtu = transport.mtu
        self._limit = transport.max_message_bytes
        self._calls = _Calls(ffi)
        self._stats = ffi.new("uint64_t[]", len(STAT_NAMES))
        self._peer_buffer = ffi.new("int[]", 64)
        self._closed = False
        self._lock = threading.Lock()
        self._control: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None
        self._anchor = -1
        kind, name = parse_address(address) if address else ("wire" if self._spec.on_wire else "memif", "")
        if kind == "memif":
            self._name = name or f"{os.getpid()}-{secrets.token_hex(4)}"
            self._token = secrets.randbits(32)
        else:
            self._token = int(name, 16) if name else secrets.randbits(32)
            self._name = f"{self._token:08x}"
        self.address = f"dpdk://{kind}/{self._name}"
        self._id = lib.rlb_listener_new(self._token, self._limit, int(transport.give_up_s * 1e9),
                                        transport.max_queued_bytes)
        if self._id < 0:
            raise DpdkError(f"dpdk: cannot listen: {error_text(ffi, lib)}")
        try:
            if kind == "memif":
                self._serve_memif_handshakes()
            else:
                self._add_port(self._spec.devargs())
        except BaseException:
            lib.rlb_listener_close(self._id)
            lib.rlb_port_close(self._anchor)
            raise

    def _open_port(self, devargs: str) -> int:
        port = self._lib.rlb_port_open(devargs.encode(), 0 if self._spec.on_wire else self._mtu)
        if port < 0:
            raise DpdkError(f"dpdk: {error_text(self._ffi, self._lib)}")
        return port

    def _add_port(self, devargs: str) -> None:
        self._lib.rlb_listener_add_port(self._id, self._open_port(devargs))

    # -- memif: one interface per peer, created when the peer asks --------------------------
    def _serve_memif_handshakes(self) -> None:
        # DPDK 22.11's memif PMD frees a socket when its last interface closes but leaves the socket's
        # listening fd open, so the name stays bound and the next interface on it fails (EADDRINUSE):
        # once every peer had left, nobody could join the listener again. An interface no peer is
        # given (id 0) holds the socket for the listener's life; it is never polled.
        self._anchor = self._open_port(memif_devargs("server", 0, self._name))
        control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            control.bind(b"\0rlbench-dpdk-ctl/" + self._name.encode())
        except OSError as exc:
            control.close()
            raise AddressError(f"dpdk: cannot listen on {self.address}: {exc.strerror}") from None
        control.listen(64)
        self._control = control
        self._accept_thread = threading.Thread(target=self._accept_loop, name=f"dpdk-memif {self._name}", daemon=True)
        self._accept_thread.start()

    def _accept_loop(self) -> None:
        interface_ids = iter(range(1, 1 << 30))
        while True:
            try:
                peer_socket, _ = self._control.accept()
            except OSError:
                return  # closed
            with peer_socket, self._lock:
                if self._closed:
                    return
                interface = next(interface_ids)
                try:
                    self._add_port(memif_devargs("server", interface, self._name))
                    peer_socket.sendall(_HANDSHAKE.pack(interface, self._token))
                except (DpdkError, OSError):
                    continue  # the peer sees the socket close without an answer and reports it

    # -- the Listener protocol ----------------------------------------------------------------
    def recv(self, timeout: float | None = None) -> tuple[int, memoryview] | None:
        if self._closed:
            raise listener_closed("dpdk", self.address)
        lib, calls = self._lib, self._calls
        timeout_ns = _ns(timeout)
        while True:
            step = _SLICE_NS if timeout_ns is None else min(timeout_ns, _SLICE_NS)
            n = lib.rlb_listener_recv(self._id, step, calls.peer, calls.data)
            if n >= 0:
                return calls.peer[0], memoryview(self._ffi.buffer(calls.data[0], n))
            if n != -_ETIMEDOUT:
                _raise_for(n, self._ffi, lib, f"listener {self.address}")
            if timeout_ns is not None:
                timeout_ns -= step
                if timeout_ns <= 0:
                    return None

    def send(self, peer: int, *parts: Any) -> None:
        if self._closed:
            raise listener_closed("dpdk", self.address)
        if not isinstance(peer, int) or not 0 <= peer < 1 << 31:
            raise not_connected("dpdk", peer, self.address)
        n, _keep = self._calls.fill(parts, self._limit)
        rc = self._lib.rlb_listener_send(self._id, peer, self._calls.pointers, self._calls.lengths, n)
        if rc < 0:
            _raise_for(rc, self._ffi, self._lib, f"send to peer {peer}")

    def drop(self, peer: int, fault: str | None = None) -> None:
        """End one peer's link (it is told by a goodbye); what it delivered before is still received.
        `fault`: the counter it adds to, when it broke a rule (refused_oversize, malformed,
        slow_consumers; each also counts in dropped_peers, and the goodbye says which)."""
        if fault is not None and fault not in _FAULT_REASONS:
            raise ValueError(f"dpdk: no such peer fault {fault!r}; one of {', '.join(_FAULT_REASONS)}")
        if self._closed or not isinstance(peer, int) or not 0 <= peer < 1 << 31:
            return
        why = 0 if fault is None else getattr(self._lib, _FAULT_REASONS[fault])
        rc = self._lib.rlb_listener_drop(self._id, peer, why)
        if rc < 0:
            _raise_for(rc, self._ffi, self._lib, f"drop peer {peer}")

    @property
    def peers(self) -> list[int]:
        """Every connected peer, however many (the shim says how many there are; the buffer grows)."""
        if self._closed:
            return []
        while True:
            capacity = len(self._peer_buffer)
            n = self._lib.rlb_listener_peers(self._id, self._peer_buffer, capacity)
            if n <= capacity:
                return [int(self._peer_buffer[i]) for i in range(max(0, n))]
            self._peer_buffer = self._ffi.new("int[]", n)

    @property
    def stats(self) -> dict[str, int]:
        if not self._closed:
            self._lib.rlb_listener_stats(self._id, self._stats)
        return dict(zip(STAT_NAMES, (int(v) for v in self._stats)))

    def close(self) -> None:
        """Ordered: stop handing out interfaces, say goodbye to every peer, then stop the ports."""
        with self._lock:
            if self._closed:
                return
            self.stats
            self._closed = True
        if self._control is not None:
            self._control.shutdown(socket.SHUT_RDWR)
            self._control.close()
            self._accept_thread.join(5)
        self._lib.rlb_listener_close(self._id)
        self._lib.rlb_port_close(self._anchor)


_FAULT_REASONS = {"refused_oversize": "C_OVERSIZE", "malformed": "C_MALFORMED", "slow_consumers": "C_SLOW"}


def parse_address(address: str) -> tuple[str, str]:
    prefix = "dpdk://"
    if not isinstance(address, str) or not address.startswith(prefix):
        raise AddressError(f"dpdk transport needs an address like 'dpdk://memif/NAME' or 'dpdk://wire/TOKEN', got {address!r}")
    kind, _, name = address[len(prefix):].partition("/")
    if kind not in ("memif", "wire") or not name or "/" in name:
        raise AddressError(f"dpdk address must be 'dpdk://memif/NAME' or 'dpdk://wire/TOKEN', got {address!r}")
    if kind == "wire":
        try:
            int(name, 16)
        except ValueError:
            raise AddressError(f"dpdk wire address needs a hexadecimal token, got {address!r}") from None
    return kind, name


class DpdkTransport:
    """DPDK ports from Python. `port`: memif (default), af_packet:IFACE, af_xdp:IFACE or a PCI
    address; `eal_args`: extra EAL arguments (they win over the defaults); `mtu`: the largest IP
    packet on memif ports (576..9202; the shim builds frames that size, jumbo by default), while wire
    ports keep their interface's MTU; `give_up_s`: how long a peer may leave frames unacknowledged,
    or stop in the middle of a message, before it is declared gone; `max_message_bytes`: the largest
    message this side sends or accepts (at most the capability); `max_queued_bytes`: how much a
    listener holds for one peer beyond its window before dropping it as a slow consumer
    (rlbench.kit.framing.MAX_QUEUED_BYTES by default)."""

    capabilities = CAPABILITIES

    def __init__(self, port: str = "memif", eal_args: str = "", mtu: int = DEFAULT_MTU, give_up_s: float = 10.0,
                 max_message_bytes: int | None = None, max_queued_bytes: int | None = None) -> None:
        self.port_spec = PortSpec.parse(port)
        self.eal_args = eal_args or ""
        self.mtu = positive_int(mtu, "dpdk: mtu")
        if not MEMIF_MTU_RANGE[0] <= self.mtu <= MEMIF_MTU_RANGE[1]:
            raise DpdkError(f"dpdk: mtu={self.mtu} is outside {MEMIF_MTU_RANGE[0]}..{MEMIF_MTU_RANGE[1]} (the largest "
                            "frame one mbuf of the shim's pool holds)")
        self.give_up_s = non_negative(give_up_s, "dpdk: give_up_s")
        if not self.give_up_s:
            raise DpdkError("dpdk: give_up_s must be more than 0")
        self.max_message_bytes = message_limit(max_message_bytes, CAPABILITIES.max_message_bytes, "dpdk")
        self.max_queued_bytes = queued_bytes_limit(max_queued_bytes, "dpdk")

    def _native(self) -> tuple[Any, Any]:
        ffi, _ = library()
        lib = ensure_eal(self.eal_args, self.port_spec.target if self.port_spec.kind == "pci" else None)
        return ffi, lib

    def listen_address(self, host: str) -> str | None:
        """Where to listen for peers on other hosts: a wire port listens on its own interface
        (--dpdk-port af_packet:IFACE, af_xdp:IFACE or a NIC), whatever `host` is; memif cannot."""
        if not self.port_spec.on_wire:
            raise AddressError("dpdk's memif port links processes of one host; across hosts give every role a "
                               "wire port: --dpdk-port af_packet:IFACE, af_xdp:IFACE or a NIC's PCI address")
        return None

    def listen(self, address: str | None = None) -> DpdkListener:
        ffi, lib = self._native()
        return DpdkListener(self, lib, ffi, address)

    def connect(self, address: str, timeout: float = 10.0) -> DpdkConnection:
        kind, name = parse_address(address)
        ffi, lib = self._native()
        if kind == "memif":
            interface, token = ask_for_interface(name, address, timeout)
            devargs = memif_devargs("client", interface, name)
        else:
            if not self.port_spec.on_wire:
                raise AddressError(f"dpdk: {address} is reached over the wire; give this side a port too "
                                   "(--dpdk-port af_packet:IFACE, af_xdp:IFACE or a PCI address)")
            token, devargs = int(name, 16), self.port_spec.devargs()
        port = lib.rlb_port_open(devargs.encode(), self.mtu if kind == "memif" else 0)
        if port < 0:
            raise DpdkError(f"dpdk: {error_text(ffi, lib)}")
        link = lib.rlb_connect(port, token, int(timeout * 1e9), self.max_message_bytes, int(self.give_up_s * 1e9))
        if link < 0:
            message = error_text(ffi, lib)
            lib.rlb_port_close(port)
            raise TransportClosedError(f"dpdk: cannot connect to {address}: {message}")
        return DpdkConnection(lib, ffi, link, port, address, self.max_message_bytes)

    def __reduce__(self) -> tuple[Any, ...]:
        return (DpdkTransport, (str(self.port_spec), self.eal_args, self.mtu, self.give_up_s, self.max_message_bytes,
                                self.max_queued_bytes))


def ask_for_interface(name: str, address: str, timeout: float) -> tuple[int, int]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as control:
        control.settimeout(timeout)
        try:
            control.connect(b"\0rlbench-dpdk-ctl/" + name.encode())
            reply = b""
            while len(reply) < _HANDSHAKE.size:
                chunk = control.recv(_HANDSHAKE.size - len(reply))
                if not chunk:
                    raise TransportClosedError(f"dpdk: the listener at {address} could not create a memif interface")
                reply += chunk
        except (ConnectionRefusedError, FileNotFoundError):
            raise TransportClosedError(f"dpdk: nothing listens at {address} (memif listeners live on this host only)") from None
        except socket.timeout:
            raise TransportClosedError(f"dpdk: the listener at {address} did not answer within {timeout} s") from None
    return _HANDSHAKE.unpack(reply)
