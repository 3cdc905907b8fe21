"""check_transport: does a transport move whole messages, in order, to the right peer, and never lose
one silently? Runs the real transport: a listener here and several peers (one in a spawned process
when the transport crosses processes), driven through the transport itself.

Besides moving messages, it checks the rules every transport keeps:
- `send` copies what it sends before it returns: the caller may change its buffers right after;
- `listener.send` to a peer id it does not serve raises TransportClosedError (a ConnectionError);
- `recv` and `send` on a closed listener raise a ConnectionError;
- a message over the sending side's limit raises MessageTooLargeError (a ValueError and RlbenchError),
  on a listener and on a connection, and the link still works after;
- given a factory: it refuses an unknown keyword option (a `**options` catch-all would swallow a
  misspelt run option), and it takes `max_message_bytes=` (a limit below the capability, kept as
  the transport's `max_message_bytes`) and honours it both ways: its listener and its connections
  refuse to send more and carry exactly the limit, its listener refuses a longer message from a
  peer whose own limit is higher (nothing over the limit is delivered, stats["refused_oversize"]
  counts it, a reliable transport drops that peer, the other peers are still served), and, where
  ends are in different processes, its connection never delivers a message over its limit either;
- given a factory: it takes `max_queued_bytes=` (kept as `.max_queued_bytes`; since plugin API 1.1, so
  a factory that does not take it passes with a PluginAPIDeprecationWarning until 2.0 unless its
  plugin targets 1.1 or later, and the checks below are skipped), and its listener never
  waits on a peer: sends to a peer that never reads each return at once, and past the bound the peer
  is dropped (SlowConsumerError, stats["slow_consumers"]) while a peer that reads is still answered;
  a peer that reads late gets what was queued for it, whole and in order, while the listener is
  driven (its later recv calls);
- it listens where a run's server role would under `--bind HOST` or a cluster launcher (Ray): at
  what `rlbench.runtime.launchers.listen_address` gives for 127.0.0.2 (its own
  `listen_address(host)`, else NAME://127.0.0.2:0 for a transport that crosses hosts), a loopback
  address other than the default one, so that a transport that ignores HOST is seen: given
  NAME://HOST:PORT, the listener's address names HOST, and a peer reaches that listener at the
  address it then reports;
- its listener has `expect_admission` and `admit` exactly when its capabilities say `admission`,
  and then keeps strangers apart: bad values are refused (RlbenchError), a stranger past
  max_strangers sheds the oldest, strangers are closed after handshake_s, an admitted peer is
  neither shed nor closed and is still served (the Listener protocol's admission rules).

The peers obey a tiny command set carried in the first byte of each message the listener sends:
  E echo the message back          U upload messages of the given seeds and sizes, then Z
  V a pushed message to verify     R make n request() calls        T check recv timeout
  S report status (JSON)           Q close and exit
  M upload messages built in buffers that are overwritten as soon as send returns, then Z
  O try to send one message over the limit, report what happened
Payloads are derived from a seed (`_payload`), so both sides verify bytes without shipping them twice.
"""

from __future__ import annotations

import json
import multiprocessing
import pickle
import struct
import threading
import time
from typing import Any, Callable

import numpy as np

from rlbench.errors import RlbenchError
from rlbench.kit import api
from rlbench.kit.framing import AddressError
from rlbench.testing.environment import UNKNOWN_OPTION

_U32 = struct.Struct("<I")
_MiB = 1 << 20
# Sizes around the usual boundaries: tiny, cache lines, Ethernet/UDP payloads, pages, the built-in
# udp fragment (8168 B) and shm chunk (262136 B), datagram and 64 KiB limits, and multi-MB.
DEFAULT_SIZES = (0, 1, 2, 7, 8, 9, 63, 64, 65, 1471, 1472, 1473, 4095, 4096, 4097, 8167, 8168, 8169,
                 16337, 65507, 65536, 65537, 262135, 262136, 262137, 524288, _MiB - 1, _MiB + 9,
                 3 * _MiB + 7)
_PEERS = 3
_REQUESTS = 20
_OWNERSHIP_SIZES = (1, 100, 5000, 70_000)


def _bind_host() -> str:
    """The host the kit hands listen_address, as `--bind HOST` would: 127.0.0.2, a loopback address that
    is not the one a transport falls back to, so one that ignores HOST is caught (it listens at 127.0.0.1
    or reports it); 127.0.0.1 on a host whose loopback has no other address (macOS: lo0 has 127.0.0.1 only)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.2", 0))
        except OSError:
            return "127.0.0.1"
    return "127.0.0.2"


BIND_HOST = _bind_host()


def _payload(seed: int, size: int) -> bytes:
    return np.random.default_rng(seed).bytes(size)


def _gather(data: bytes) -> tuple[Any, ...]:
    """Cut a payload into differently typed parts, to exercise gather-send."""
    third = len(data) // 3
    return data[:third], np.frombuffer(data, dtype=np.uint8)[third:2 * third], memoryview(data)[2 * third:]


def _mutable_parts(header: bytes, data: bytes, variant: int) -> list[Any]:
    """The message header + data in buffers the caller owns and may overwrite: one bytearray (a
    transport might hand over a view of a single part), or a bytearray and a numpy array."""
    if variant % 2 == 0:
        return [bytearray(header + data)]
    return [bytearray(header), np.frombuffer(data, dtype=np.uint8).copy()]


def _scribble(parts: list[Any]) -> None:
    """Overwrite the caller's buffers, as a caller reusing them for the next message would."""
    for part in parts:
        if isinstance(part, np.ndarray):
            part.fill(0xEE)
        else:
            part[:] = b"\xee" * len(part)


def _limit_of(transport: Any) -> int:
    """The message limit a transport instance works with: its `max_message_bytes` when it was
    configured below the capability, else the capability."""
    return int(getattr(transport, "max_message_bytes", transport.capabilities.max_message_bytes))


def _oversize_parts(limit: int) -> list[Any]:
    """Parts adding up to more than `limit` without allocating that much (one buffer, repeated)."""
    piece = np.zeros(min(limit, 1 << 24), dtype=np.uint8)
    return [piece] * (limit // piece.nbytes + 1)


def _refusal(send: Any, limit: int, parts: list[Any] | None = None) -> str:
    """'' when sending more than `limit` bytes raised a clear size error, else what went wrong."""
    parts = _oversize_parts(limit) if parts is None else parts
    try:
        send(*parts)
    except (RlbenchError, ValueError) as exc:
        return "" if str(exc) else "the oversize error has no message"
    except Exception as exc:
        return f"an oversize send raised {type(exc).__name__} ({exc}), not MessageTooLargeError (ValueError, RlbenchError)"
    return f"a message of {sum(part.nbytes for part in parts)} B over max_message_bytes={limit} was accepted"


# ------------------------------------------------------------------------------------------------
# The peer side (a thread here, or a spawned process)
# ------------------------------------------------------------------------------------------------
def _run_peer(transport: Any, address: str, index: int, timeout: float) -> dict[str, Any]:
    errors: list[str] = []
    pushed: list[int] = []
    connection = transport.connect(address, timeout=timeout)
    sent = 0
    try:
        connection.send(b"H", _U32.pack(index))
        sent += 1
        while True:
            message = connection.recv(timeout=timeout * 4)
            if message is None:
                errors.append(f"peer {index}: nothing from the listener for {timeout * 4} s")
                break
            op = bytes(message[:1])
            if op == b"E":
                connection.send(message)
                sent += 1
            elif op == b"U":
                values = struct.unpack(f"<{(len(message) - 1) // 4}I", message[1:])
                first_seed, sizes = values[0], values[1:]
                for i, size in enumerate(sizes):
                    connection.send(b"D", _U32.pack(first_seed + i), *_gather(_payload(first_seed + i, size)))
                connection.send(b"Z")
                sent += len(sizes) + 1
            elif op == b"V":
                (seed,) = _U32.unpack(message[1:5])
                if bytes(message[5:]) != _payload(seed, len(message) - 5):
                    errors.append(f"peer {index}: pushed message seed {seed} ({len(message) - 5} B) arrived corrupted")
                pushed.append(seed)
            elif op == b"R":
                (n,) = _U32.unpack(message[1:5])
                for i in range(n):
                    body = _U32.pack(i) + _payload(9000 + i, 1 + 97 * i)
                    reply = connection.request(b"r", body, timeout=timeout)
                    sent += 1
                    if bytes(reply) != b"a" + body:
                        errors.append(f"peer {index}: request {i} got a wrong reply ({len(reply)} B)")
            elif op == b"T":
                started = time.monotonic()
                got = connection.recv(timeout=0.05)
                waited = time.monotonic() - started
                ok = got is None and waited < 2.0
                if not ok:
                    errors.append(f"peer {index}: recv(timeout=0.05) returned {got!r} after {waited:.3f} s, not None")
                connection.send(b"t")
                sent += 1
            elif op == b"M":
                (first_seed,) = _U32.unpack(message[1:5])
                sizes = [size for size in _OWNERSHIP_SIZES if size + 5 <= _limit_of(transport)]
                for i, size in enumerate(sizes):
                    parts = _mutable_parts(b"D" + _U32.pack(first_seed + i), _payload(first_seed + i, size), i)
                    connection.send(*parts)
                    _scribble(parts)
                connection.send(b"Z")
                sent += len(sizes) + 1
            elif op == b"O":
                problem = _refusal(connection.send, _limit_of(transport))
                connection.send(b"o", problem.encode())
                sent += 1
            elif op == b"S":
                status = {"errors": errors, "pushed": pushed, "sent": sent, "stats": dict(connection.stats)}
                connection.send(b"s", json.dumps(status).encode())
                sent += 1
            elif op == b"Q":
                break
            else:
                errors.append(f"peer {index}: unexpected message starting {bytes(message[:8])!r}")
    finally:
        connection.close()
    return {"errors": errors}


def _resolve(transport_or_factory: Any) -> Any:
    """A transport instance (a class or any other callable is a factory)."""
    if isinstance(transport_or_factory, type) or not hasattr(transport_or_factory, "listen"):
        return transport_or_factory()
    return transport_or_factory


def _peer_process(transport_pickle: bytes, address: str, index: int, timeout: float, results: Any) -> None:
    try:
        transport = _resolve(pickle.loads(transport_pickle))
        results.put(_run_peer(transport, address, index, timeout))
    except BaseException as exc:  # reported to the parent, which fails the check with it
        results.put({"errors": [f"peer {index} (spawned process) failed: {type(exc).__name__}: {exc}"]})


# ------------------------------------------------------------------------------------------------
# The listener side
# ------------------------------------------------------------------------------------------------
class _Listener:
    """The listener under test plus bookkeeping the checks need."""

    def __init__(self, listener: Any, timeout: float) -> None:
        self.listener = listener
        self.timeout = timeout
        self.received = 0

    def next(self, what: str) -> tuple[int, bytes]:
        item = self.listener.recv(timeout=self.timeout)
        assert item is not None, f"listener: {what} did not arrive within {self.timeout} s"
        self.received += 1
        peer, message = item
        return peer, bytes(message)

    def status(self, peer: int) -> dict[str, Any]:
        self.listener.send(peer, b"S")
        got_peer, reply = self.next("a peer's status report")
        assert got_peer == peer and reply[:1] == b"s", f"expected a status report from peer {peer}, got {reply[:8]!r} from {got_peer}"
        return json.loads(reply[1:])


def still_serves(listener: Any, connection: Any, payload: bytes = b"ping", timeout: float = 5.0) -> None:
    """Assert that `listener` still answers an honest peer: `connection` sends `payload`, the listener
    receives it (other peers' messages in between are skipped) and replies, the reply arrives. For
    hostile-input tests: after a malformed or oversized message, the transport must go on serving."""
    connection.send(payload)
    deadline = time.monotonic() + timeout
    while True:
        item = listener.recv(timeout=max(0.0, deadline - time.monotonic()))
        assert item is not None, "the listener stopped answering an honest peer"
        peer, message = item
        if bytes(message) == payload:
            break
    listener.send(peer, b"re:" + payload)
    assert bytes(connection.recv(timeout=timeout)) == b"re:" + payload


def check_transport(transport_or_factory: Any, *, cross_process: bool = True,
                    sizes: tuple[int, ...] | None = None, timeout: float = 10.0) -> None:
    """Raise AssertionError naming the first defect found; return quietly when the transport conforms.

    `transport_or_factory`: a Transport, a callable returning one, or the name of a registered
    transport (its factory then comes from the registry). For the spawned peer it is pickled (a
    class, a functools.partial or a plain module-level object all work). The checks of the factory
    itself (options, a lowered limit) need a factory. The name a run hands the transport
    (NAME://HOST:0) is the one it is registered under, else the scheme of its listener's address.
    """
    name = None
    if isinstance(transport_or_factory, str):
        name, transport_or_factory = _registered_factory(transport_or_factory)
    transport = _resolve(transport_or_factory)
    capabilities = transport.capabilities
    assert hasattr(capabilities, "max_message_bytes"), "transport.capabilities must be a TransportCapabilities"
    limit = _limit_of(transport)
    assert 0 < limit <= capabilities.max_message_bytes, \
        f"the transport's max_message_bytes={limit} is not within 1..capabilities.max_message_bytes"
    sizes = tuple(s for s in (DEFAULT_SIZES if sizes is None else sizes) if s <= limit - 5)
    spawn = cross_process and capabilities.crosses_processes

    listener = transport.listen(None)
    assert isinstance(listener.address, str) and listener.address, "listener.address must be a non-empty string"
    side = _Listener(listener, timeout)
    process = None
    results: Any = None
    threads: list[threading.Thread] = []
    thread_results: list[dict[str, Any]] = []
    try:
        first_thread = 0
        if spawn:
            context = multiprocessing.get_context("spawn")
            results = context.Queue()
            try:
                spec = pickle.dumps(transport_or_factory)
            except Exception as exc:
                raise AssertionError(f"cannot send the transport to a spawned peer (pickle failed: {exc})") from None
            process = context.Process(target=_peer_process, args=(spec, listener.address, 0, timeout, results),
                                      daemon=True)
            process.start()
            first_thread = 1
        def peer_thread(index: int) -> None:
            try:
                thread_results.append(_run_peer(transport, listener.address, index, timeout))
            except Exception as exc:  # e.g. the listener closed after a failed check
                thread_results.append({"errors": [f"peer {index} (thread) failed: {type(exc).__name__}: {exc}"]})

        for index in range(first_thread, _PEERS):
            thread = threading.Thread(target=peer_thread, args=(index,), daemon=True)
            thread.start()
            threads.append(thread)

        # Every peer says hello; peer ids must be distinct and listed.
        peer_of: dict[int, int] = {}
        for _ in range(_PEERS):
            peer, hello = side.next("a peer's hello" + (" (the spawned peer may have failed to start)" if spawn else ""))
            assert hello[:1] == b"H" and len(hello) == 5, f"hello arrived mangled: {hello!r}"
            peer_of[_U32.unpack(hello[1:])[0]] = peer
        assert sorted(peer_of) == list(range(_PEERS)) and len(set(peer_of.values())) == _PEERS, \
            f"peers and peer ids do not match one to one: {peer_of}"
        assert set(peer_of.values()) <= set(listener.peers), f"listener.peers {list(listener.peers)} misses {peer_of}"

        _check_timeouts(side, peer_of)
        main = peer_of[0]
        _check_upload(side, main, sizes, capabilities.reliable)
        _check_push(side, main, sizes, capabilities.reliable)
        _check_routing(side, peer_of)
        _check_requests(side, main)
        _check_buffer_ownership(side, main, limit)
        _check_unknown_peer(side, peer_of)
        _check_oversize(side, main, limit)
        _check_stats(side, main)

        for peer in peer_of.values():
            listener.send(peer, b"Q")
        peer_reports = []
        if process is not None:
            try:
                peer_reports.append(results.get(timeout=timeout))
            except Exception:
                raise AssertionError("the spawned peer did not report back after being told to quit") from None
            process.join(timeout)
            assert process.exitcode == 0, f"the spawned peer exited with code {process.exitcode}"
        for thread in threads:
            thread.join(timeout)
            assert not thread.is_alive(), "a peer thread did not finish after being told to quit"
        for report in peer_reports + thread_results:
            assert not report["errors"], "; ".join(report["errors"])
        registered = name or _registered_name(transport_or_factory)
        name = registered or listener.address.partition("://")[0]
        _check_close(transport, listener, timeout, capabilities.reliable)
        _check_listen_address(transport, name, timeout)
        _check_admission(transport, name, timeout)
        if transport is not transport_or_factory:  # a factory, not an instance
            _check_unknown_option(transport_or_factory, name)
            _check_lowered_limit(transport_or_factory, timeout)
            _check_slow_consumers(transport_or_factory, name, spawn, timeout, _targeted_api(registered))
    finally:
        listener.close()
        if process is not None and process.is_alive():
            process.kill()
            process.join(5)
        if results is not None:
            results.close()


def _check_timeouts(side: _Listener, peer_of: dict[int, int]) -> None:
    started = time.monotonic()
    got = side.listener.recv(timeout=0.05)
    waited = time.monotonic() - started
    assert got is None, f"listener.recv(timeout=0.05) with nothing sent returned {got!r}"
    assert waited < 2.0, f"listener.recv(timeout=0.05) took {waited:.2f} s"
    for peer in peer_of.values():
        side.listener.send(peer, b"T")
        got_peer, reply = side.next("the answer to the timeout check")
        assert reply == b"t" and got_peer == peer, f"timeout check answered {reply[:8]!r} by {got_peer}, not peer {peer}"


def _lost(side: _Listener) -> int:
    return int(side.listener.stats.get("lost", 0))


def _check_upload(side: _Listener, peer: int, sizes: tuple[int, ...], reliable: bool) -> None:
    """peer -> listener: every size, gathered from mixed parts, verified byte for byte and in order."""
    first_seed = 1000
    lost_before = _lost(side)
    side.listener.send(peer, b"U", struct.pack(f"<{len(sizes) + 1}I", first_seed, *sizes))
    seeds: list[int] = []
    while True:
        got_peer, message = side.next("an uploaded message (or the end marker)")
        assert got_peer == peer, f"upload from peer {peer} arrived attributed to peer {got_peer}"
        if message == b"Z":
            break
        assert message[:1] == b"D", f"upload arrived mangled: starts {message[:8]!r}"
        (seed,) = _U32.unpack(message[1:5])
        assert seed - first_seed in range(len(sizes)), f"upload carries unknown seed {seed}: corrupted header bytes"
        size = sizes[seed - first_seed]
        assert len(message) - 5 == size, f"message of {size} B arrived with {len(message) - 5} B"
        assert message[5:] == _payload(seed, size), f"message of {size} B (seed {seed}) arrived corrupted"
        assert not seeds or seed > seeds[-1], f"messages reordered: seed {seed} arrived after {seeds[-1]}"
        seeds.append(seed)
    expected = list(range(first_seed, first_seed + len(sizes)))
    if reliable:
        missing = sorted(set(expected) - set(seeds))
        assert seeds == expected, f"reliable transport lost {len(missing)} message(s) of sizes {[sizes[s - first_seed] for s in missing]}"
    else:
        lost = _lost(side) - lost_before
        assert len(seeds) + lost == len(sizes), \
            f"unreliable transport: {len(seeds)} received + {lost} counted lost != {len(sizes)} sent (silent loss)"


def _check_push(side: _Listener, peer: int, sizes: tuple[int, ...], reliable: bool) -> None:
    """listener -> peer, unsolicited (server push): every size, verified by the peer, in order."""
    first_seed = 5000
    before = side.status(peer)
    for i, size in enumerate(sizes):
        side.listener.send(peer, b"V", _U32.pack(first_seed + i), *_gather(_payload(first_seed + i, size)))
    after = side.status(peer)
    assert not after["errors"], "; ".join(after["errors"])
    pushed = after["pushed"][len(before["pushed"]):]
    expected = list(range(first_seed, first_seed + len(sizes)))
    assert pushed == sorted(set(pushed)), f"pushed messages reordered or duplicated: {pushed}"
    if reliable:
        assert pushed == expected, f"reliable transport: peer got {len(pushed)} of {len(sizes)} pushed messages"
    else:
        lost = after["stats"].get("lost", 0) - before["stats"].get("lost", 0)
        assert len(pushed) + lost == len(sizes), \
            f"unreliable transport: {len(pushed)} received + {lost} counted lost != {len(sizes)} pushed (silent loss)"


def _check_routing(side: _Listener, peer_of: dict[int, int]) -> None:
    """Several peers at once: each echo comes back from the peer it was sent to."""
    for round_ in range(3):
        for index, peer in peer_of.items():
            side.listener.send(peer, b"E", _U32.pack(index), _payload(index * 100 + round_, 100 + index))
        for _ in peer_of:
            got_peer, message = side.next("an echo")
            (index,) = _U32.unpack(message[1:5])
            assert message[:1] == b"E" and message[5:] == _payload(index * 100 + round_, 100 + index), "an echo arrived corrupted"
            assert got_peer == peer_of[index], f"the reply meant for peer {peer_of[index]} came back as peer {got_peer}"


def _check_requests(side: _Listener, peer: int) -> None:
    side.listener.send(peer, b"R", _U32.pack(_REQUESTS))
    for i in range(_REQUESTS):
        got_peer, message = side.next(f"request {i}")
        assert got_peer == peer and message[:1] == b"r", f"expected request {i} from peer {peer}, got {message[:8]!r}"
        side.listener.send(got_peer, b"a", message[1:])


def _check_buffer_ownership(side: _Listener, peer: int, limit: int) -> None:
    """`send` may not keep references to the caller's buffers: each is overwritten right after send
    returns, both ways, and the far side must still get what was sent."""
    sizes = [size for size in _OWNERSHIP_SIZES if size + 5 <= limit]
    first_seed = 7000
    before = side.status(peer)
    for i, size in enumerate(sizes):
        parts = _mutable_parts(b"V" + _U32.pack(first_seed + i), _payload(first_seed + i, size), i)
        side.listener.send(peer, *parts)
        _scribble(parts)
    after = side.status(peer)
    assert not after["errors"], "listener.send kept the caller's buffers: " + "; ".join(after["errors"])
    assert len(after["pushed"]) > len(before["pushed"]) or not sizes, "the ownership check's pushes did not arrive"

    side.listener.send(peer, b"M", _U32.pack(first_seed + 100))
    while True:
        got_peer, message = side.next("a message built in buffers the peer overwrote after sending")
        assert got_peer == peer, f"ownership check: a message from peer {got_peer}, not {peer}"
        if message == b"Z":
            break
        (seed,) = _U32.unpack(message[1:5])
        assert message[:1] == b"D" and message[5:] == _payload(seed, len(message) - 5), \
            "connection.send kept the caller's buffers: a message changed after send returned"


def _check_unknown_peer(side: _Listener, peer_of: dict[int, int]) -> None:
    unknown = max(peer_of.values()) + 1000
    try:
        side.listener.send(unknown, b"E", b"to nobody")
    except ConnectionError as exc:
        assert str(exc), "the error for an unknown peer has no message"
    except Exception as exc:
        raise AssertionError(f"listener.send to unknown peer {unknown} raised {type(exc).__name__} ({exc}), "
                             "not a ConnectionError (TransportClosedError)") from None
    else:
        raise AssertionError(f"listener.send to unknown peer {unknown} did not raise")


def _check_oversize(side: _Listener, peer: int, limit: int) -> None:
    """A message over the limit is refused with a clear error, on either side, and the link still
    works after. Many parts of one buffer reach the limit without allocating it."""
    problem = _refusal(lambda *parts: side.listener.send(peer, *parts), limit)
    assert not problem, f"listener.send: {problem}"
    side.listener.send(peer, b"O")
    got_peer, reply = side.next("the peer's report of its oversize send")
    assert got_peer == peer and reply[:1] == b"o", f"expected the oversize report from peer {peer}, got {reply[:8]!r}"
    assert reply == b"o", f"connection.send: {reply[1:].decode()}"
    side.listener.send(peer, b"E", b"after-oversize")
    got_peer, message = side.next("the echo after an oversize refusal")
    assert message == b"Eafter-oversize" and got_peer == peer, "the link broke after refusing an oversize message"


def _registered_factory(name: str) -> tuple[str, Any]:
    """(registered name, factory) of a registered transport."""
    import rlbench

    component = rlbench.get_registry().get("transport", name)
    probe = component.probe()
    assert probe.available, f"transport {component.name} is unavailable here: {probe.reason}"
    return component.name, component.load()


def _registered_name(transport_or_factory: Any) -> str | None:
    """The name the transport is registered under, found without loading any other factory."""
    import rlbench

    factory = isinstance(transport_or_factory, type) or not hasattr(transport_or_factory, "listen")  # as _resolve
    target = transport_or_factory if factory else type(transport_or_factory)
    target = getattr(target, "func", target)  # a functools.partial registers its function
    reference = f"{getattr(target, '__module__', '')}:{getattr(target, '__qualname__', '')}"
    for component in rlbench.get_registry().components("transport"):
        if component.factory is target or component.factory == reference:
            return component.name
    return None


def _host_of(address: str) -> str | None:
    """HOST of an address of the form NAME://HOST:PORT (brackets of an IPv6 host dropped), None for any other form."""
    scheme, separator, rest = address.partition("://")
    host, colon, port = rest.rpartition(":")
    if not separator or not scheme or not colon or not host or not port.isdigit():
        return None
    return host.strip("[]")


def _check_listen_address(transport: Any, name: str, timeout: float) -> None:
    """Listen where a run's server role listens under `--bind BIND_HOST` or a cluster launcher (the
    launcher's own rule, `listen_address`), and reach that listener at the address it reports. Given
    NAME://BIND_HOST:PORT, it must listen at BIND_HOST and say so: a run's peers on other hosts reach
    the replay node at the host it was given, not at the loopback a transport falls back to."""
    from rlbench.runtime.launchers import listen_address

    given = f"what --bind {BIND_HOST} and --launcher ray hand it"
    try:
        address = listen_address(transport, name, BIND_HOST)
    except AddressError:
        return  # as configured it cannot be reached from another host, and says so: runs refuse it up front
    except Exception as exc:
        raise AssertionError(f"{name}: listen_address({BIND_HOST!r}) raised {type(exc).__name__} ({exc}); it returns "
                             "an address, None (its default listener) or raises AddressError") from None
    if address is None:
        return  # its default listener, checked above
    try:
        listener = transport.listen(address)
    except Exception as exc:
        raise AssertionError(f"{name}: listen({address!r}) ({given}) raised {type(exc).__name__} ({exc}); a "
                             "transport that crosses hosts takes NAME://HOST:0 (any free port), or defines "
                             "listen_address(host)") from None
    try:
        assert isinstance(listener.address, str) and listener.address, \
            f"{name}: listening at {address} ({given}), listener.address is {listener.address!r}"
        if _host_of(address) == BIND_HOST:
            assert _host_of(listener.address) == BIND_HOST, (
                f"{name}: told to listen at {address} ({given}), its listener's address is {listener.address}: "
                f"listen at the HOST of NAME://HOST:PORT and report it (a run's peers on other hosts reach the "
                f"replay node only at the host it was given)")
        try:
            connection = transport.connect(listener.address, timeout=timeout)
        except Exception as exc:
            raise AssertionError(f"{name}: listening at {address} ({given}), its address {listener.address} cannot "
                                 f"be reached: {type(exc).__name__} ({exc}); report the address peers connect to "
                                 "(the port actually bound)") from None
        try:
            still_serves(listener, connection, payload=b"bound", timeout=timeout)
        except AssertionError as exc:
            raise AssertionError(f"{name}: listening at {address} ({given}): {exc}") from None
        finally:
            connection.close()
    finally:
        listener.close()


ADMISSION_HANDSHAKE_S = 0.5  # the kit's short deadline: long enough for a loaded host's loopback round trip


def _check_admission(transport: Any, name: str, timeout: float) -> None:
    """Admission mode, where the capabilities declare it (and its methods only then): an admitted
    peer stays and is served while three strangers that speak come (the third sheds the first, with
    max_strangers=2) and the other two are closed once handshake_s has passed."""
    listener = transport.listen(None)
    connections: list[Any] = []
    try:
        has_methods = all(callable(getattr(listener, method, None)) for method in ("expect_admission", "admit"))
        if not transport.capabilities.admission:
            assert not has_methods, (f"{name}: its listener has expect_admission and admit, but its capabilities do "
                                     "not say admission=True: declare it, so the kit checks it")
            return
        assert has_methods, f"{name}: its capabilities say admission=True, but its listener has no expect_admission/admit"
        for bad in ({"handshake_s": 0, "max_strangers": 2}, {"handshake_s": 1.0, "max_strangers": 0}):
            try:
                listener.expect_admission(**bad)
            except RlbenchError:
                continue
            except Exception as exc:
                raise AssertionError(f"{name}: expect_admission({bad}) raised {type(exc).__name__} ({exc}), not a "
                                     "one-line RlbenchError") from None
            raise AssertionError(f"{name}: expect_admission({bad}) was accepted")
        listener.expect_admission(handshake_s=ADMISSION_HANDSHAKE_S, max_strangers=2)

        def joined(payload: bytes) -> int:
            connection = transport.connect(listener.address, timeout=timeout)
            connections.append(connection)
            connection.send(payload)
            deadline = time.monotonic() + timeout
            while (item := listener.recv(timeout=max(0.0, deadline - time.monotonic()))) is not None:
                if bytes(item[1]) == payload:
                    return item[0]
            raise AssertionError(f"{name}: in admission mode, a newcomer's first message did not arrive")

        admitted = joined(b"admitted")
        listener.admit(admitted)
        strangers = [joined(b"stranger %d" % i) for i in range(3)]
        live = set(listener.peers)
        assert admitted in live and strangers[0] not in live and set(strangers[1:]) <= live, \
            (f"{name}: with max_strangers=2, an admitted peer (id {admitted}) and strangers {strangers} joining in "
             f"that order should leave {[admitted, *strangers[1:]]} connected, not {sorted(live)}")
        assert listener.stats.get("strangers_shed") == 1, \
            f"{name}: one stranger shed should count strangers_shed=1, stats say {listener.stats.get('strangers_shed')}"
        deadline = time.monotonic() + 2 * ADMISSION_HANDSHAKE_S + timeout
        while set(strangers) & set(listener.peers):
            assert time.monotonic() < deadline, \
                f"{name}: strangers {sorted(set(strangers) & set(listener.peers))} outlived handshake_s={ADMISSION_HANDSHAKE_S}"
            listener.recv(timeout=0.05)
        assert listener.stats.get("handshake_timeouts") == 2, \
            f"{name}: two strangers timed out, stats say handshake_timeouts={listener.stats.get('handshake_timeouts')}"
        assert admitted in listener.peers, f"{name}: the admitted peer was closed with the strangers"
        try:
            still_serves(listener, connections[0], payload=b"admitted, later", timeout=timeout)
        except AssertionError as exc:
            raise AssertionError(f"{name}: in admission mode, after the strangers were closed: {exc}") from None
    finally:
        for connection in connections:
            connection.close()
        listener.close()


def _check_unknown_option(factory: Any, name: str) -> None:
    try:
        transport = factory(**{UNKNOWN_OPTION: 1})
    except (TypeError, RlbenchError, ValueError) as exc:
        assert UNKNOWN_OPTION in str(exc), f"{name}: an unknown option was refused, but the error does not name it: {exc}"
        return
    raise AssertionError(f"{name}: the factory accepted an unknown option ({UNKNOWN_OPTION}=1) and ignored it "
                         f"(made {type(transport).__name__}); refuse unknown keywords (no **options catch-all), or a "
                         "run option whose parameter the factory does not take vanishes silently")


# ------------------------------------------------------------------------------------------------
# A peer that does not read (the slow-consumer rule of rlbench.protocols.Listener)
# ------------------------------------------------------------------------------------------------
_QUEUE_BOUND = 1 << 20  # the max_queued_bytes the check gives the factory
QUEUE_BOUND_SINCE = "1.1"  # the plugin API that made max_queued_bytes= and the bounded outbox the rule


def _targeted_api(registered: str | None) -> str | None:
    """The plugin API targeted by the plugin that registers transport `registered` (None: a factory
    of no registered transport, taken as written for 1.0)."""
    import rlbench

    registry = rlbench.get_registry()
    try:
        return registry.targets.get(registry.get("transport", registered).plugin) if registered else None
    except RlbenchError:
        return None
_SEND_WAIT_S = 0.5  # a listener's send may take this long at most (it must not wait on the peer)
_FLOOD_BYTES = 256 << 20  # what the check sends a peer that never reads before it calls the bound ignored


def _late_reader(transport: Any, address: str, hold_s: float, expect: list[tuple[int, int]], timeout: float) -> dict:
    """A peer that says hello (b"W"), reads nothing for `hold_s`, then reads what it expects (seed,
    size), checks it and reports (b"L" + JSON). With hold_s long and nothing expected: a peer that
    never reads. Returns what it saw."""
    errors: list[str] = []
    connection = transport.connect(address, timeout=timeout)
    try:
        connection.send(b"W")
        time.sleep(hold_s)
        for seed, size in expect:
            message = connection.recv(timeout=timeout)
            if message is None:
                errors.append(f"late reader: message seed {seed} did not arrive")
                break
            if bytes(message) != _U32.pack(seed) + _payload(seed, size):
                errors.append(f"late reader: message seed {seed} ({size} B) arrived changed or out of order")
                break
        connection.send(b"L", json.dumps({"errors": errors}).encode())
        connection.recv(timeout=timeout)  # (the listener's goodbye, or its end)
    except ConnectionError as exc:
        errors.append(f"late reader: {type(exc).__name__}: {exc}")
    finally:
        connection.close()
    return {"errors": errors}


def _late_reader_process(spec: bytes, address: str, hold_s: float, expect: list[tuple[int, int]], timeout: float,
                         results: Any) -> None:
    try:
        results.put(_late_reader(_resolve(pickle.loads(spec)), address, hold_s, expect, timeout))
    except BaseException as exc:
        results.put({"errors": [f"late reader (spawned process) failed: {type(exc).__name__}: {exc}"]})


def _check_slow_consumers(factory: Any, name: str, spawn: bool, timeout: float, target: str | None) -> None:
    """A listener's send never waits on a peer: to one that never reads, each send returns at once
    and, past `max_queued_bytes` (a factory option), the peer is dropped (SlowConsumerError, counted
    in slow_consumers) while a peer that reads is still answered; one that reads late gets what was
    queued for it, whole and in order, while the listener is driven."""
    from rlbench.kit.framing import SlowConsumerError

    try:
        transport = factory(max_queued_bytes=_QUEUE_BOUND)
    except TypeError as exc:
        # the rule came in plugin API 1.1: a transport written for 1.0 passes with a warning until 2.0
        message, refused = api.deprecation(
            f"{name}: the factory must take max_queued_bytes= (how much a listener holds for one peer that does "
            f"not read; rlbench.kit.framing.Outbox), and its listener must keep a bounded outbox per peer ({exc}); "
            "the slow-consumer checks did not run", target=target, since=QUEUE_BOUND_SINCE)
        if refused:
            raise AssertionError(message) from None
        api.warn(message, stacklevel=3)
        return
    assert getattr(transport, "max_queued_bytes", None) == _QUEUE_BOUND, \
        f"{name}: a transport made with max_queued_bytes={_QUEUE_BOUND} must keep it as .max_queued_bytes"
    limit = _limit_of(transport)
    listener = transport.listen(None)
    context = multiprocessing.get_context("spawn")
    results = context.Queue() if spawn else None
    workers: list[Any] = []
    thread_results: list[dict[str, Any]] = []
    size = max(1, min(64 << 10, limit - 8))
    late = [(7000 + i, size) for i in range(max(1, (_QUEUE_BOUND // 4) // (size + 4)))]

    def start(target: Callable[..., dict], args: tuple) -> None:
        if spawn:
            worker = context.Process(target={_run_peer: _peer_process, _late_reader: _late_reader_process}[target],
                                     args=(pickle.dumps(factory), listener.address, *args, results), daemon=True)
        else:
            def run() -> None:
                try:
                    thread_results.append(target(factory(), listener.address, *args))
                except Exception as exc:  # the listener closed after a failed check
                    thread_results.append({"errors": [f"{type(exc).__name__}: {exc}"]})

            worker = threading.Thread(target=run, daemon=True)
        worker.start()
        workers.append(worker)

    try:
        start(_late_reader, (timeout * 6, [], timeout))  # never reads while the check runs
        start(_run_peer, (0, timeout))  # reads: echoes what it is sent
        hello: dict[bytes, int] = {}
        while len(hello) < 2:
            item = listener.recv(timeout=timeout)
            assert item is not None, f"{name}: a peer of the slow-consumer check did not say hello within {timeout} s"
            hello[bytes(item[1][:1])] = item[0]
        silent, honest = hello[b"W"], hello[b"H"]
        message = bytes(size)
        flood: dict[str, Any] = {"sent": 0, "dropped": None, "failed": None, "longest": 0.0}

        def send_until_dropped() -> None:  # in a thread: a send that waits for ever must not hang the check
            while flood["sent"] * size < _FLOOD_BYTES:
                started = time.monotonic()
                try:
                    listener.send(silent, message)
                except ConnectionError as exc:
                    flood["dropped"] = exc
                    return
                except OSError as exc:  # e.g. the listener closed under a send the check gave up on
                    flood["failed"] = exc
                    return
                flood["longest"] = max(flood["longest"], time.monotonic() - started)
                flood["sent"] += 1

        flooder = threading.Thread(target=send_until_dropped, daemon=True)
        flooder.start()
        flooder.join(timeout * 3)
        waited = " (it was still in a send when the check gave up)" if flooder.is_alive() else ""
        assert not waited and flood["longest"] < _SEND_WAIT_S, (
            f"{name}: listener.send to a peer that does not read took {flood['longest']:.2f} s{waited}: a listener "
            "never waits on a peer (queue what its medium cannot take now, rlbench.kit.framing.Outbox)")
        dropped, failed = flood["dropped"], flood["failed"]
        assert failed is None, f"{name}: listener.send to a peer that does not read raised {failed!r}"
        assert dropped is not None, (f"{name}: a peer that never read was sent {flood['sent'] * size:,} bytes and never "
                                     f"dropped: max_queued_bytes={_QUEUE_BOUND} bounds what waits for it")
        assert isinstance(dropped, SlowConsumerError), \
            f"{name}: a peer dropped as a slow consumer must raise SlowConsumerError, got {type(dropped).__name__}"
        stats = listener.stats
        assert stats.get("slow_consumers") == 1 and stats.get("dropped_peers", 0) >= 1, \
            f"{name}: the slow consumer is not counted (stats slow_consumers={stats.get('slow_consumers')!r})"
        assert silent not in listener.peers, f"{name}: the dropped slow consumer is still listed in listener.peers"
        listener.send(honest, b"E", b"still served")
        got_peer, reply = _Listener(listener, timeout).next("an honest peer's echo beside a slow consumer")
        assert got_peer == honest and reply == b"Estill served", f"{name}: the reading peer was not served"
        listener.send(honest, b"Q")

        start(_late_reader, (0.5, late, timeout))  # reads, but only after the listener sent everything
        item = listener.recv(timeout=timeout)
        assert item is not None and bytes(item[1]) == b"W", f"{name}: the late reader did not say hello"
        reader = item[0]
        for seed, length in late:
            listener.send(reader, _U32.pack(seed), _payload(seed, length))
        deadline = time.monotonic() + timeout * 2
        while True:  # drive the listener, as a server's loop does, until the reader reports
            item = listener.recv(timeout=0.05)
            if item is not None and item[0] == reader and bytes(item[1][:1]) == b"L":
                report = json.loads(bytes(item[1][1:]))
                break
            assert time.monotonic() < deadline, f"{name}: what was queued for a late reader never reached it"
        assert not report["errors"], f"{name}: " + "; ".join(report["errors"])
        listener.send(reader, b"Q")
    finally:
        listener.close()
        for worker in workers:
            worker.join(2)
            if spawn and worker.is_alive():
                worker.kill()
                worker.join(5)
        if results is not None:
            results.close()


def _check_lowered_limit(factory: Any, timeout: float) -> None:
    """A transport made with a limit below the capability honours it both ways (a run that lowers it
    builds every role's transport so, and checks its largest message against it before it starts)."""
    default = _resolve(factory)
    capabilities = default.capabilities
    limit = min(300_000, _limit_of(default) // 2)
    try:
        limited = factory(max_message_bytes=limit)
    except TypeError as exc:
        raise AssertionError(f"factory(max_message_bytes={limit}) raised TypeError ({exc}): every transport factory "
                             "takes max_message_bytes= (at most the capability)") from None
    assert limited.capabilities == capabilities, "max_message_bytes= changed the capabilities; they stay the maximum"
    assert _limit_of(limited) == limit, f"factory(max_message_bytes={limit}).max_message_bytes is {_limit_of(limited)}"
    _check_receive_limit(default, limited, limit, timeout)
    _check_connection_limit(limited, limit, timeout)
    if capabilities.crosses_processes:  # in one process the sender's check against the receiver's limit does it
        _check_connection_receive_limit(default, limited, limit, timeout)


def _check_receive_limit(default: Any, limited: Any, limit: int, timeout: float) -> None:
    """A listener made with a limit below the capability refuses a longer message from a peer whose
    own limit is higher, counts it, drops that peer where the transport is reliable, and goes on
    serving the others."""
    capabilities = default.capabilities
    listener = limited.listen(None)
    outcome: dict[str, str] = {}
    thread = None
    connections: list[Any] = []
    try:
        good = default.connect(listener.address, timeout=timeout)
        connections.append(good)
        bad = default.connect(listener.address, timeout=timeout)
        connections.append(bad)

        def peers() -> None:  # beside the listener: some transports need it reading while they send
            try:
                good.send(b"G", _payload(11, limit - 1))  # exactly the limit
                bad.send(b"B")
                try:
                    bad.send(b"X", _payload(12, limit))  # one byte over
                    outcome["sent"] = "accepted"
                except (RlbenchError, ValueError):
                    outcome["sent"] = "refused"
                except ConnectionError:
                    outcome["sent"] = "dropped"
                if capabilities.reliable and outcome["sent"] == "accepted":
                    try:
                        outcome["after"] = f"recv returned {bad.recv(timeout=timeout)!r}"
                    except ConnectionError:
                        outcome["after"] = "dropped"
                good.send(b"A")
            except Exception as exc:
                outcome["error"] = f"{type(exc).__name__}: {exc}"

        thread = threading.Thread(target=peers, daemon=True)
        thread.start()
        arrived: dict[bytes, tuple[int, int]] = {}
        while b"A" not in arrived and "error" not in outcome:
            item = listener.recv(timeout=timeout)
            assert item is not None, f"receive limit: nothing arrived within {timeout} s ({outcome})"
            peer, message = item
            assert message.nbytes <= limit, \
                f"a listener with max_message_bytes={limit} delivered a message of {message.nbytes} B"
            arrived[bytes(message[:1])] = (peer, message.nbytes)
            if message[:1] == b"G":
                assert bytes(message[1:]) == _payload(11, limit - 1), "a message of exactly the limit arrived corrupted"
        thread.join(timeout)
        assert "error" not in outcome, f"receive limit: a peer failed: {outcome['error']}"
        assert b"G" in arrived, f"a message of exactly max_message_bytes={limit} did not arrive"
        assert b"X" not in arrived, "a message over the listener's limit was delivered"
        refused = listener.stats.get("refused_oversize", 0)
        assert refused >= 1, f"listener.stats['refused_oversize'] is {refused} after refusing a message over its limit"
        if capabilities.reliable and outcome["sent"] == "accepted":
            assert outcome.get("after") == "dropped", \
                f"a reliable listener kept a peer that sent over its limit ({outcome.get('after')}), instead of dropping it"
        good_peer = arrived[b"A"][0]
        problem = _refusal(lambda *parts: listener.send(good_peer, *parts), limit, [np.zeros(limit + 1, dtype=np.uint8)])
        assert not problem, f"a listener with max_message_bytes={limit}: {problem}"
        listener.send(good_peer, b"still here")
        reply = good.recv(timeout=timeout)
        assert reply is not None and bytes(reply) == b"still here", "the other peer was not served after a refusal"
    finally:
        listener.close()
        if thread is not None:
            thread.join(timeout)
        for connection in connections:
            connection.close()


def _check_connection_limit(limited: Any, limit: int, timeout: float) -> None:
    """Between a listener and a connection both made with the lowered limit (as every role of a run
    that lowers it), each refuses to send more and carries exactly the limit."""
    listener = limited.listen(None)
    connection = None
    try:
        connection = limited.connect(listener.address, timeout=timeout)
        problem = _refusal(connection.send, limit, [np.zeros(limit + 1, dtype=np.uint8)])
        assert not problem, f"a connection made with max_message_bytes={limit}: {problem}"
        connection.send(b"H")  # the listener learns the peer
        hello = listener.recv(timeout=timeout)
        assert hello is not None, f"a connection made with max_message_bytes={limit}: its hello did not arrive"
        payload = b"E" + _payload(13, limit - 1)
        # to its listener: a connection may wait for room, so it sends beside the listener's receive
        lost = listener.stats.get("lost", 0)
        sender = threading.Thread(target=connection.send, args=(payload[:1], payload[1:]), daemon=True)
        sender.start()
        item = listener.recv(timeout=timeout)
        sender.join(timeout)
        _check_exact_limit(item[1] if item is not None else None, payload, limit, "to its listener",
                           limited.capabilities.reliable, listener.stats.get("lost", 0) > lost)
        # from its listener: its send never waits; what the medium cannot take now goes out while
        # the listener is driven (its later calls), as a server's loop drives it
        lost = connection.stats.get("lost", 0)
        listener.send(hello[0], payload[:1], payload[1:])
        received: dict[str, Any] = {}
        receiver = threading.Thread(target=lambda: received.setdefault("message", connection.recv(timeout=timeout)),
                                    daemon=True)
        receiver.start()
        _drive(listener, receiver, timeout)
        _check_exact_limit(received.get("message"), payload, limit, "from its listener",
                           limited.capabilities.reliable, connection.stats.get("lost", 0) > lost)
    finally:
        if connection is not None:
            connection.close()
        listener.close()


def _drive(listener: Any, worker: threading.Thread, timeout: float) -> None:
    """Call the listener (as a server's loop does, so what waits in its outboxes goes out) until the
    worker thread is done or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while worker.is_alive() and time.monotonic() < deadline:
        listener.recv(timeout=0.01)
    worker.join(max(0.0, deadline - time.monotonic()))


def _check_exact_limit(message: Any, payload: bytes, limit: int, direction: str, reliable: bool,
                       lost_counted: bool) -> None:
    if message is None and not reliable and lost_counted:
        return  # lost, and counted: what an unreliable transport may do
    assert message is not None and bytes(message) == payload, \
        f"a connection made with max_message_bytes={limit}: a message of exactly the limit {direction} did not " \
        "arrive whole"


def _check_connection_receive_limit(default: Any, limited: Any, limit: int, timeout: float) -> None:
    """A connection is a receiving side too: from a listener whose limit is higher, a message over
    the connection's limit is never delivered (the sender is refused, or the connection is closed,
    or, where the transport may lose messages, it is not delivered)."""
    listener = default.listen(None)
    connection = None
    thread = None
    try:
        connection = limited.connect(listener.address, timeout=timeout)
        connection.send(b"H")
        item = listener.recv(timeout=timeout)
        assert item is not None, "connection receive limit: the peer's hello did not arrive"
        outcome: dict[str, str] = {}

        def push() -> None:
            try:
                listener.send(item[0], b"X", _payload(15, limit))  # one byte over the connection's limit
                outcome["sent"] = "accepted"
            except (RlbenchError, ValueError, ConnectionError):
                outcome["sent"] = "refused"
            except Exception as exc:
                outcome["sent"] = f"{type(exc).__name__}: {exc}"

        push()  # a listener's send never waits: what the medium cannot take now goes out as it is driven
        received: dict[str, Any] = {"got": None}

        def receive() -> None:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                try:
                    received["got"] = connection.recv(timeout=0.2)
                except ConnectionError:
                    received["got"] = "closed"
                if received["got"] is not None or outcome.get("sent") == "refused":
                    return

        thread = threading.Thread(target=receive, daemon=True)
        thread.start()
        _drive(listener, thread, timeout)
        got = received["got"]
        if got is not None and got != "closed":
            raise AssertionError(f"a connection made with max_message_bytes={limit} delivered a message of "
                                 f"{got.nbytes} B from a listener whose limit is higher")
        assert outcome.get("sent") in ("accepted", "refused"), f"connection receive limit: the listener's send " \
                                                             f"raised {outcome.get('sent')}"
        if default.capabilities.reliable:
            assert got == "closed" or outcome["sent"] == "refused", (
                f"a connection made with max_message_bytes={limit} neither refused a message over its limit (recv "
                "raises a ConnectionError and the connection closes) nor had its sender refused: it vanished")
    finally:
        if thread is not None:
            thread.join(timeout)
        if connection is not None:
            connection.close()
        listener.close()


def _check_stats(side: _Listener, peer: int) -> None:
    stats = side.listener.stats
    for key in ("messages_sent", "messages_received", "bytes_sent", "bytes_received", "lost"):
        assert key in stats, f"listener.stats lacks {key!r}"
    assert stats["messages_received"] >= side.received, \
        f"listener.stats says {stats['messages_received']} received, but {side.received} were"
    report = side.status(peer)
    assert report["stats"]["messages_sent"] == report["sent"], \
        f"peer's stats say {report['stats']['messages_sent']} sent, but it sent {report['sent']}"


def _check_close(transport: Any, listener: Any, timeout: float, reliable: bool) -> None:
    """A connection learns that its listener closed (reliable transports: an error, not a hang)."""
    connection = transport.connect(listener.address, timeout=timeout)
    try:
        connection.send(b"bye")
        item = listener.recv(timeout=timeout)
        assert item is not None and bytes(item[1]) == b"bye", "a late peer's message did not arrive"
        listener.close()
        listener.close()  # twice is harmless
        for what, call in (("recv", lambda: listener.recv(timeout=0)), ("send", lambda: listener.send(item[0], b"x"))):
            try:
                call()
            except ConnectionError:
                continue
            except Exception as exc:
                raise AssertionError(f"listener.{what} on a closed listener raised {type(exc).__name__} ({exc}), "
                                     "not a ConnectionError") from None
            raise AssertionError(f"listener.{what} on a closed listener did not raise ConnectionError")
        if reliable:
            try:
                got = connection.recv(timeout=timeout)
            except ConnectionError:
                return
            raise AssertionError(f"recv on a connection whose listener closed returned {got!r} instead of raising ConnectionError")
    finally:
        connection.close()
        connection.close()
