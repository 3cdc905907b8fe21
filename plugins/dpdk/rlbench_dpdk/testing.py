"""Helpers the plugin's tests run in spawned processes (they must be importable by module name), and
a raw memif peer for tests of what a buggy or hostile process can send a listener."""

from __future__ import annotations

import secrets
import time
from typing import Any

from rlbench_dpdk.native import DpdkError, ensure_eal, error_text, library
from rlbench_dpdk.ports import memif_devargs
from rlbench_dpdk.transport import DpdkTransport, ask_for_interface, parse_address


def echo_node(addresses: Any, results: Any, peers: int, port: str = "memif") -> None:
    """A listener in its own process: echo (prefixed b"echo:") until `peers` peers said b"bye", then
    close in order and report the listener's counters."""
    listener = DpdkTransport(port).listen()
    addresses.put(listener.address)
    served = 0
    try:
        while served < peers:
            got = listener.recv(timeout=20.0)
            if got is None:
                results.put("timed out")
                return
            peer, message = got
            if bytes(message) == b"bye":
                served += 1
            else:
                listener.send(peer, b"echo:", message)
        results.put(listener.stats)
    finally:
        listener.close()


class RawMemifPeer:
    """A memif interface to a listener, asked for like any peer's, that carries no link of the shim:
    the test writes every frame itself (the shim's own header layout, any field a lie) and reads
    whatever the listener sends back. `conn` and `token` are what an honest peer would put in its
    headers."""

    def __init__(self, address: str, timeout: float = 10.0) -> None:
        self._ffi, self._lib = library()
        ensure_eal()
        _, name = parse_address(address)
        interface, self.token = ask_for_interface(name, address, timeout)
        self.conn = secrets.randbits(32) | 1
        self.port = self._lib.rlb_port_open(memif_devargs("client", interface, name).encode(), 0)
        if self.port < 0:
            raise DpdkError(f"raw memif peer: {error_text(self._ffi, self._lib)}")
        self._buffer = self._ffi.new("uint8_t[]", 16384)
        self._kind, self._reason = self._ffi.new("int *"), self._ffi.new("int *")
        deadline = time.monotonic() + timeout
        while not self.link_up():
            if time.monotonic() > deadline:
                self.close()
                raise DpdkError(f"raw memif peer: the link to {address} did not come up")
            time.sleep(0.001)
        self.receive()  # the first rx burst gives the listener room to answer (see rlb_connect)

    def link_up(self) -> bool:
        ffi = self._ffi
        driver, up = ffi.new("char[]", 64), ffi.new("int *")
        numbers = [ffi.new("uint32_t *") for _ in range(3)]
        return self._lib.rlb_port_info(self.port, driver, 64, numbers[0], numbers[1], up, numbers[2]) == 0 and bool(up[0])

    def frame(self, kind: int, *, flags: int | None = None, conn: int | None = None, token: int | None = None,
              fseq: int = 0, ack: int = 0, msg_len: int = 0, offset: int = 0, frag_len: int | None = None,
              payload: bytes = b"") -> bytes:
        """One frame, honest unless a field says otherwise: to the listener, from this peer's
        connection, `frag_len` (what the header claims) defaulting to the payload's length."""
        lib = self._lib
        flags = lib.F_TO_LISTENER if flags is None else flags
        n = lib.rlb_raw_frame(self.port, kind, flags, self.conn if conn is None else conn,
                              self.token if token is None else token, fseq, ack, msg_len, offset,
                              len(payload) if frag_len is None else frag_len, payload, len(payload),
                              self._buffer, len(self._buffer))
        if n < 0:
            raise DpdkError(f"raw memif peer: {error_text(self._ffi, lib)}")
        return bytes(self._ffi.buffer(self._buffer, n))

    def send(self, frame: bytes, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while (sent := self._lib.rlb_raw_send(self.port, frame, len(frame))) == 0:
            self.receive()
            if time.monotonic() > deadline:
                raise DpdkError("raw memif peer: the transmit ring stayed full")
        if sent < 0:
            raise DpdkError(f"raw memif peer: {error_text(self._ffi, self._lib)}")

    def receive(self) -> list[tuple[int, int]]:
        """(kind, reason) of every frame that arrived since the last call; kind -1: not the shim's."""
        got = []
        while self._lib.rlb_raw_recv(self.port, self._buffer, len(self._buffer), self._kind, self._reason) > 0:
            got.append((self._kind[0], self._reason[0]))
        return got

    def close(self) -> None:
        if self.port >= 0:
            self._lib.rlb_port_close(self.port)
            self.port = -1


def pattern(index: int, size: int) -> bytes:
    """Message `index` of a stream: its index, then bytes that differ per message and position, so
    that a message lost, repeated, reordered or cut shows."""
    block = bytes((index * 31 + i) & 0xFF for i in range(251))
    return index.to_bytes(4, "little") + (block * ((size - 4) // 251 + 1))[:size - 4]


def silent_peer(address: str, hello: bytes, quit_event: Any) -> None:
    """A peer that connects, sends `hello`, and then never reads nor acknowledges anything (it does
    not call into its connection at all) until told to quit; then it closes it."""
    connection = DpdkTransport().connect(address, timeout=10.0)
    connection.send(hello)
    quit_event.wait(120)
    connection.close()


def honest_peer(address: str, hello: bytes, results: Any) -> None:
    """A peer that asks round trips (b"ping" + its number, answered b"pong" + the same) until it is
    answered b"stop"; reports (round trips answered, slowest answer in s), or the error that stopped it."""
    connection = DpdkTransport().connect(address, timeout=10.0)
    try:
        connection.send(hello)
        slowest, rounds = 0.0, 0
        while True:
            start = time.monotonic()
            reply = bytes(connection.request(b"ping%d" % rounds, timeout=10.0))
            if reply == b"stop":
                break
            slowest = max(slowest, time.monotonic() - start)
            if reply != b"pong%d" % rounds:
                results.put(f"round {rounds}: answered {reply[:32]!r}")
                return
            rounds += 1
        results.put((rounds, slowest))
    except Exception as exc:  # reported, for the test to say
        results.put(f"{type(exc).__name__}: {exc}")
    finally:
        connection.close()


def late_reader(address: str, hello: bytes, count: int, size: int, delay_s: float, results: Any) -> None:
    """A peer that connects, sends `hello`, sleeps `delay_s` without reading, then takes `count`
    messages and checks each is pattern(i, size), in order; reports "ok" or what was wrong, and
    tells the listener b"got-all" when it has them all."""
    connection = DpdkTransport().connect(address, timeout=10.0)
    try:
        connection.send(hello)
        time.sleep(delay_s)
        for i in range(count):
            message = connection.recv(timeout=20.0)
            if message is None:
                results.put(f"message {i} of {count} did not arrive")
                return
            if bytes(message) != pattern(i, size):
                got = int.from_bytes(bytes(message[:4]), "little") if message.nbytes >= 4 else None
                results.put(f"message {i} is wrong: {message.nbytes} bytes, index {got}")
                return
        connection.send(b"got-all")
        results.put("ok")
    except Exception as exc:
        results.put(f"{type(exc).__name__}: {exc}")
    finally:
        connection.close()
