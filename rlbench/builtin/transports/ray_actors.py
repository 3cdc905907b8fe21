"""The `ray` transport: messages carried by Ray actor calls, the baseline for "what does a Ray
actor (RLlib's replay actors) cost next to a transport?".

A listener owns an inbox: an async Ray actor placed on the listener's own node. A peer's message is
one actor call into it (`deliver`); a request and its reply are one call (`exchange`, which returns
the reply); the listener takes what arrived with one call that waits (`take`) and answers with one
call (`reply`). So a round trip costs two actor calls' worth of Ray (the peer's, and the listener's
take), where a direct `ray.get(actor.method.remote(x))` costs one: compare with that in mind
(`rlbench bench launchers` prints a direct actor call beside it). Messages are bytes in the calls'
arguments and results (Ray inlines small ones and moves large ones through its object store).

Ray actor calls may start out of order on an async actor, so each caller numbers its calls and the
inbox applies them in order. The inbox shares its owner's fate: when the listener's process ends,
its peers' next receive raises TransportClosedError.

A slow peer stalls no one: the listener's `send` is one actor call it does not wait for (it waits
only when more than _IN_FLIGHT of its calls are unfinished, for the oldest, which no peer holds up).
What it sends a peer waits in that peer's outbox in the inbox (a `rlbench.kit.framing.Outbox`) until
the peer takes it; the outbox is bounded by the transport option `max_queued_bytes`
(MAX_QUEUED_BYTES by default; a message into an empty outbox is always taken). A peer whose outbox
would pass the bound is dropped there, by the inbox: what waited for it is forgotten and its next
call says it was dropped. The listener learns of it asynchronously, with no call of its own: from
a "slow" event among what its next `recv` takes (its takes come in order after its replies), or,
when it only sends, from the result of the overflowing reply once its pacing waits for that call
(at most _IN_FLIGHT sends later). It then counts the drop (`slow_consumers`, `dropped_peers`), and
its next `send` to that peer raises SlowConsumerError: not necessarily the send that overflowed,
unlike the socket transports. What it sends that peer in between is forgotten by the inbox.

Address: ``ray://GCS_HOST:PORT/NAME`` (the cluster, and the inbox's name in the `rlbench-transport`
namespace). A process not yet connected to Ray joins that cluster; a listener in a process not
connected to Ray joins the cluster in RAY_ADDRESS, or starts a small Ray of its own (stopped when
the listener closes). Ray is imported on first use only.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import os
import secrets
import sys
import time
from typing import Any, Iterator

from rlbench.builtin.capabilities import RAY as CAPABILITIES
from rlbench.builtin.capabilities import RAY_REQUIREMENT
from rlbench.kit.framing import (
    AddressError,
    Outbox,
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
from rlbench.protocols import Probe, probe_modules

NAMESPACE = "rlbench-transport"
# Ray's minimum, for a Ray started here: messages Ray inlines in its calls (up to 100 KiB) never use it; an image
# run's (~1-7 MB: frames, batches, a CNN's weights) pass through it a few at a time (30 one-way sends of 6.7 MB
# in a row got through, at ~33 MB/s here)
SMALL_OBJECT_STORE_BYTES = 75 << 20
_LISTENER = -1  # the listener's own sequence of calls into its inbox
_MARGIN_S = 30.0  # beyond a call's own timeout, before ray.get gives up on it
CLOSE_DRAIN_S = 5.0  # how long a closing listener's inbox waits for peers to take its last replies
_IN_FLIGHT = 256  # one-way calls a sender may have unfinished before it waits for the oldest (Ray queues the rest)


def probe() -> Probe:
    return probe_modules("ray", hint=f"pip install {RAY_REQUIREMENT}")


def _ray(address: str | None) -> tuple[Any, bool]:
    """Ray, connected: to `address` (a peer joining its listener's cluster), to RAY_ADDRESS, or to a
    Ray of its own (started here: True)."""
    target = address or os.environ.get("RAY_ADDRESS")
    if target and "ray" not in sys.modules:
        _token_mode_when_a_token_is_here()
    import ray

    if ray.is_initialized():
        return ray, False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    options: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.WARNING}
    if target:
        ray.init(address=target, **options)
        return ray, False
    with quiet_token_notice():
        ray.init(address="local", num_cpus=1, include_dashboard=False,
                 object_store_memory=SMALL_OBJECT_STORE_BYTES, **options)
    return ray, True


@contextlib.contextmanager
def quiet_token_notice() -> Iterator[None]:
    """Ray 2.60 logs a WARNING each time it starts a local instance with token authentication on
    (its default): expected here, so not printed on every run's terminal."""
    notice = logging.getLogger("ray._private.authentication.authentication_token_setup")
    level = notice.level
    notice.setLevel(logging.ERROR)
    try:
        yield
    finally:
        notice.setLevel(level)


def _token_mode_when_a_token_is_here() -> None:
    """A Ray started by ray.init (a listener's own) uses token authentication, and Ray enables it for
    a driver that joins by explicit address only when told (RAY_AUTH_MODE, read at import): when this
    user has a token and said nothing, use it, as Ray itself does for a cluster it finds on its own."""
    if "RAY_AUTH_MODE" in os.environ:
        return
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.expanduser("~/.ray/auth_token")
    if os.environ.get("RAY_AUTH_TOKEN") or os.path.exists(path):
        os.environ["RAY_AUTH_MODE"] = "token"


def _parse(address: str) -> tuple[str, str]:
    rest = split_address(address, "ray")
    cluster, sep, name = rest.partition("/")
    if not sep or not cluster or not name or "/" in name:
        raise AddressError(f"ray transport address must be 'ray://GCS_HOST:PORT/NAME', got {address!r}")
    return cluster, name


class RayInbox:
    """The Ray actor behind a listener (async: calls that wait do not block the others).

    Events for the listener, in `take`: ("join", peer), ("message", peer, bytes), ("leave", peer),
    and ("slow", peer) when the inbox dropped a peer whose outbox would have passed the bound."""

    def __init__(self, max_queued_bytes: int) -> None:
        self._changed = asyncio.Condition()
        self._inbound: collections.deque[tuple[str, int, bytes]] = collections.deque()  # (event, peer, message)
        self._outbound: dict[int, Outbox] = {}  # per peer: what the listener sent it, not yet taken
        self._max_queued = max_queued_bytes
        self._expected: dict[int, int] = {}  # caller -> the sequence number of its next call
        self._peer_ids = itertools.count(1)
        self._closed = False

    async def _turn(self, caller: int, seq: int) -> None:
        """Wait until it is this call's turn among its caller's calls (the lock is held)."""
        await self._changed.wait_for(lambda: self._expected.get(caller, 0) == seq)
        self._expected[caller] = seq + 1

    async def join(self) -> int:
        async with self._changed:
            peer = next(self._peer_ids)
            if not self._closed:
                self._outbound[peer] = Outbox()
                self._inbound.append(("join", peer, b""))
            self._changed.notify_all()
            return peer if not self._closed else 0

    async def deliver(self, peer: int, seq: int, message: bytes) -> None:
        async with self._changed:
            await self._turn(peer, seq)
            if peer in self._outbound and not self._closed:
                self._inbound.append(("message", peer, message))
            self._changed.notify_all()

    async def leave(self, peer: int, seq: int) -> None:
        async with self._changed:
            await self._turn(peer, seq)
            if self._outbound.pop(peer, None) is not None:
                self._inbound.append(("leave", peer, b""))
            self._changed.notify_all()

    async def take(self, timeout: float | None, seq: int | None = None) -> list[tuple[str, int, bytes]]:
        """What arrived (waiting up to `timeout` for something). `seq`: the listener's number for this
        call, so that it comes after the listener's earlier replies and sees the drops they caused."""
        async with self._changed:
            if seq is not None:
                await self._turn(_LISTENER, seq)
            await self._wait(lambda: bool(self._inbound) or self._closed, timeout)
            taken = list(self._inbound)
            self._inbound.clear()
            return taken

    async def reply(self, seq: int, peer: int, message: bytes) -> int | None:
        """Into the peer's outbox; or, when that would pass the bound, the peer is dropped (a slow
        consumer), the listener told with a "slow" event, and the peer returned (the listener reads
        it too when it waits for this call to finish)."""
        async with self._changed:
            await self._turn(_LISTENER, seq)
            outbox = self._outbound.get(peer)
            dropped = None
            if outbox is not None:
                if outbox.admits(len(message), self._max_queued):
                    outbox.push(message)
                else:
                    del self._outbound[peer]
                    self._inbound.append(("slow", peer, b""))
                    dropped = peer
            self._changed.notify_all()
            return dropped

    async def drop(self, seq: int, peer: int) -> None:
        async with self._changed:
            await self._turn(_LISTENER, seq)
            self._outbound.pop(peer, None)
            self._changed.notify_all()

    async def poll(self, peer: int, timeout: float | None) -> list[bytes] | None:
        """What the listener sent this peer (waiting up to `timeout` for something); None when the
        listener dropped the peer, or closed and everything it sent before was taken."""
        async with self._changed:
            await self._wait(lambda: peer not in self._outbound or bool(self._outbound[peer]) or self._closed,
                             timeout)
            outbox = self._outbound.get(peer)
            if not outbox:
                return None if outbox is None or self._closed else []
            taken = [view.obj for view in outbox.messages]  # the bytes each reply pushed (a view of them)
            outbox.clear()
            self._changed.notify_all()
            return taken

    async def exchange(self, peer: int, seq: int, message: bytes, timeout: float | None) -> list[bytes] | None:
        """deliver, then poll: a request and its reply in one actor call."""
        await self.deliver(peer, seq, message)
        return await self.poll(peer, timeout)

    async def close(self, seq: int, drain_s: float) -> None:
        """After the listener's earlier calls: no new peers or messages; what it sent is still handed
        out (waiting up to `drain_s` for peers to take it), then every peer's next poll says closed."""
        async with self._changed:
            await self._turn(_LISTENER, seq)
            self._closed = True
            self._changed.notify_all()
            await self._wait(lambda: not any(self._outbound.values()), drain_s)

    async def _wait(self, ready, timeout: float | None) -> None:
        if ready():
            return
        try:
            await asyncio.wait_for(self._changed.wait_for(ready), timeout)
        except TimeoutError:
            pass


def _pace(ray: Any, in_flight: collections.deque, ref: Any) -> Any:
    """Keep at most _IN_FLIGHT one-way calls unfinished: a sender never outruns the inbox by more.
    What the oldest call returned when this waited for it, else None."""
    in_flight.append(ref)
    if len(in_flight) > _IN_FLIGHT:
        try:
            return ray.get(in_flight.popleft())
        except ray.exceptions.RayActorError:
            raise TransportClosedError("ray: the inbox is gone") from None
    return None


def _joined(parts: tuple[Any, ...], limit: int) -> bytes:
    views, total = byte_views(parts)
    check_size(total, limit, "ray")
    return b"".join(views)  # a copy: the caller may reuse its buffers once send returns


class _InboxCaller:
    """What both ends keep about their calls into an inbox: their numbering, and counters."""

    _seqs: Iterator[int]  # itertools.count(): next() on it is atomic, so calls from two threads never share a number
    _stats: dict[str, int]

    def _next_seq(self) -> int:
        return next(self._seqs)

    @property
    def stats(self) -> dict[str, int]:
        return dict(self._stats)


class RayConnection(_InboxCaller, RequestReply):
    scheme = "ray"

    def __init__(self, ray: Any, inbox: Any, peer: int, address: str, limit: int) -> None:
        self._ray, self._inbox, self._peer = ray, inbox, peer
        self._address = address
        self._limit = limit
        self._ready: collections.deque[bytes] = collections.deque()
        self._in_flight: collections.deque[Any] = collections.deque()
        self._seqs = itertools.count()
        self._closed = False
        self._stats = new_stats()

    def _check_open(self) -> None:
        if self._closed:
            raise TransportClosedError(f"ray connection to {self._address} is closed")

    def _call(self, method: str, *args: Any) -> Any:
        """Submit a call to the inbox; Ray refuses one to an actor it knows is gone."""
        try:
            return getattr(self._inbox, method).remote(*args)
        except Exception as exc:
            raise TransportClosedError(f"ray: the listener at {self._address} is gone ({exc})") from None

    def send(self, *parts: Any) -> None:
        self._check_open()
        message = _joined(parts, self._limit)
        _pace(self._ray, self._in_flight, self._call("deliver", self._peer, self._next_seq(), message))
        self._stats["messages_sent"] += 1
        self._stats["bytes_sent"] += len(message)

    def _wait(self, ref: Any, timeout: float | None) -> None:
        try:
            got = self._ray.get(ref, timeout=None if timeout is None else timeout + _MARGIN_S)
        except self._ray.exceptions.RayActorError:
            raise TransportClosedError(f"ray: the listener at {self._address} is gone") from None
        if got is None:
            raise TransportClosedError(f"ray: the listener at {self._address} closed or dropped this peer")
        self._ready.extend(got)

    def _take(self) -> memoryview | None:
        if not self._ready:
            return None
        message = self._ready.popleft()
        if len(message) > self._limit:  # this side's receive limit: the stream cannot go on past it
            self.close()
            raise TransportClosedError(f"ray: {self._address} sent a message of {len(message)} bytes, over this "
                                       f"side's max_message_bytes={self._limit}; the connection is closed")
        self._stats["messages_received"] += 1
        self._stats["bytes_received"] += len(message)
        return memoryview(message)

    def recv(self, timeout: float | None = None) -> memoryview | None:
        self._check_open()
        if not self._ready:
            self._wait(self._call("poll", self._peer, timeout), timeout)
        return self._take()

    def request(self, *parts: Any, timeout: float | None = None) -> memoryview:
        self._check_open()
        if self._ready:  # an earlier message is still unread: it answers first
            return super().request(*parts, timeout=timeout)
        message = _joined(parts, self._limit)
        self._stats["messages_sent"] += 1
        self._stats["bytes_sent"] += len(message)
        self._wait(self._call("exchange", self._peer, self._next_seq(), message, timeout), timeout)
        reply = self._take()
        if reply is None:
            raise TimeoutError(f"ray: no reply from {self._address} within {timeout} s")
        return reply

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._inbox.leave.remote(self._peer, self._next_seq())
        except Exception:  # Ray itself is gone (shut down): nothing to tell
            pass
        self._inbox = None  # the inbox ends once no one holds it


class RayListener(_InboxCaller):
    def __init__(self, ray: Any, inbox: Any, address: str, limit: int, owns_ray: bool) -> None:
        self._ray, self._inbox = ray, inbox
        self.address = address
        self._limit = limit
        self._owns_ray = owns_ray
        self._peers: set[int] = set()
        self._slow: set[int] = set()  # dropped by the inbox as slow consumers; the next send to each raises
        self._ready: collections.deque[tuple[int, bytes]] = collections.deque()
        self._in_flight: collections.deque[Any] = collections.deque()
        self._seqs = itertools.count()
        self._closed = False
        self._stats = listener_stats()

    def _absorb(self, events: list[tuple[str, int, bytes]]) -> None:
        for event, peer, message in events:
            if event == "join":
                self._peers.add(peer)
            elif event == "leave":
                self._peers.discard(peer)
            elif event == "slow":
                self._dropped_slow(peer)
            elif peer in self._peers:
                if len(message) > self._limit:  # refused, and the peer dropped (the stream cannot go on)
                    self.drop(peer, "refused_oversize")
                else:
                    self._ready.append((peer, message))

    def _dropped_slow(self, peer: int) -> None:
        """The inbox dropped this peer as a slow consumer (told by an event, or by a reply's result)."""
        if peer in self._peers:
            self._peers.discard(peer)
            self._slow.add(peer)
            self._stats["slow_consumers"] += 1
            self._stats["dropped_peers"] += 1

    def drop(self, peer: int, fault: str | None = None) -> None:
        """Close one peer's connection (`fault`: the counter it adds to, when it broke a rule): what
        waited for it in the inbox is forgotten, and its next call says it was dropped."""
        if peer not in self._peers:
            return
        self._peers.discard(peer)
        if fault is not None:
            self._stats[fault] += 1
            self._stats["dropped_peers"] += 1
        try:
            self._inbox.drop.remote(self._next_seq(), peer)
        except Exception:  # the inbox (or Ray) is gone: so is the peer's connection
            pass

    def recv(self, timeout: float | None = None) -> tuple[int, memoryview] | None:
        if self._closed:
            raise listener_closed("ray", self.address)
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._ready:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                self._absorb(self._ray.get(self._inbox.take.remote(remaining, self._next_seq())))
            except self._ray.exceptions.RayActorError:
                raise TransportClosedError(f"ray: the inbox of {self.address} is gone") from None
            if not self._ready and remaining is not None and time.monotonic() >= deadline:
                return None
        peer, message = self._ready.popleft()
        self._stats["messages_received"] += 1
        self._stats["bytes_received"] += len(message)
        return peer, memoryview(message)

    def send(self, peer: int, *parts: Any) -> None:
        if self._closed:
            raise listener_closed("ray", self.address)
        if peer not in self._peers:
            self._raise_if_slow(peer)
            raise not_connected("ray", peer, self.address)
        message = _joined(parts, self._limit)
        dropped = _pace(self._ray, self._in_flight, self._inbox.reply.remote(self._next_seq(), peer, message))
        if dropped:  # an earlier reply found its peer's outbox full: the inbox dropped that peer
            self._dropped_slow(dropped)
            self._raise_if_slow(peer)  # this very peer: this message was not taken either
        self._stats["messages_sent"] += 1
        self._stats["bytes_sent"] += len(message)

    def _raise_if_slow(self, peer: int) -> None:
        """Once, for a peer the inbox dropped as a slow consumer: SlowConsumerError."""
        if peer in self._slow:
            self._slow.discard(peer)
            raise SlowConsumerError(f"ray: peer {peer} was dropped: it did not take what was sent to it (its "
                                    f"outbox in the inbox would have passed max_queued_bytes)")

    @property
    def peers(self) -> list[int]:
        return sorted(self._peers)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:  # in order after our replies, which peers may still take; the inbox then ends with its last handle
            self._ray.get(self._inbox.close.remote(self._next_seq(), CLOSE_DRAIN_S), timeout=_MARGIN_S)
        except Exception:  # the inbox (or Ray) is gone already
            pass
        self._inbox = None
        if self._owns_ray:
            self._ray.shutdown()


class RayTransport:
    """`max_message_bytes`: the largest message this side sends or accepts (at most the capability);
    `max_queued_bytes`: how much a listener's inbox holds for one peer that does not take what it is
    sent (MAX_QUEUED_BYTES of rlbench.kit.framing by default)."""

    capabilities = CAPABILITIES

    def __init__(self, max_message_bytes: int | None = None, max_queued_bytes: int | None = None) -> None:
        self.max_message_bytes = message_limit(max_message_bytes, CAPABILITIES.max_message_bytes, "ray")
        self.max_queued_bytes = queued_bytes_limit(max_queued_bytes, "ray")

    def listen_address(self, host: str) -> None:
        """The inbox is placed on the listener's own node and found by name: nothing to bind."""
        return None

    def listen(self, address: str | None = None) -> RayListener:
        name = _parse(address)[1] if address else f"inbox-{os.getpid()}-{secrets.token_hex(4)}"
        ray, owns_ray = _ray(None)
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = ray.get_runtime_context().get_node_id()
        inbox = ray.remote(num_cpus=0, max_concurrency=1000)(RayInbox).options(
            name=name, namespace=NAMESPACE, scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False),
        ).remote(self.max_queued_bytes)
        ray.get(inbox.take.remote(0))  # started and serving
        cluster = ray.get_runtime_context().gcs_address
        return RayListener(ray, inbox, f"ray://{cluster}/{name}", self.max_message_bytes, owns_ray)

    def connect(self, address: str, timeout: float = 10.0) -> RayConnection:
        cluster, name = _parse(address)
        ray, _ = _ray(cluster)
        deadline = time.monotonic() + timeout
        while True:  # the listener may still be starting in another process
            try:
                inbox = ray.get_actor(name, namespace=NAMESPACE)
                peer = ray.get(inbox.join.remote(), timeout=max(0.1, deadline - time.monotonic()))
                break
            except (ValueError, ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
                if time.monotonic() >= deadline:
                    raise TransportClosedError(f"ray: cannot connect to {address} within {timeout} s ({exc})") from None
                time.sleep(0.05)
        if not peer:
            raise TransportClosedError(f"ray: the listener at {address} is closed")
        return RayConnection(ray, inbox, peer, address, self.max_message_bytes)
