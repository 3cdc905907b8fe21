"""For transport and replay-memory authors who benchmark replay access as a run's roles see it.

    from rlbench.kit.access import replay_node

    with replay_node("dpdk", transport_options={"port": "memif"}) as node:
        node.actor.add(transitions)                 # INSERT, as an actor
        sample = node.learner.sample(32, beta=0.4)  # SAMPLE, as the learner (server placement)

`replay_node(...)` starts the runtime's real replay node in its own process, serving a registered
replay memory over a registered transport, with the run's authentication, and connects two
clients to it: `actor` and `learner` (`rlbench.runtime`'s ReplayClient: add / add_begin /
add_finish, sample, update_priorities, credit and wait_pushed for in-network placement). The node
never rate-limits unless given `rate_limit=` (a benchmark measures access, not the algorithm's
pacing), checks the run's transition layout when given `layout=` (rlbench.runtime.transitions.transition_layout), runs
on the CPUs given as `cpus=` (os.sched_setaffinity, as its process starts; default: where the OS puts it), and
its budget never ends; leaving the block shuts it down. `node.report()` is the node's own report (per-op serve
times, counters, link bytes); `fast_path=False` makes it serve every message through its general
(Python) path, the peer of its native fast path.

Where the time of an operation went, all measured, p50s in microseconds:

    with wire_echo("dpdk", transport_options=options) as round_trip, \
            replay_node("dpdk", transport_options=options) as node:
        before = node.histograms()
        ...  # blocks of INSERTs (their p50: `measured`), and between them blocks of
        ...  # round_trip(message_bytes("INSERT", batch)) (their p50: `wire`)
        shares = time_shares("INSERT", measured, wire, before, node.histograms())

splits it into the wire's share (the transport's own round trip of a message of the same size, an
echo with nothing of rlbench's on either side), the node's own (its handling time less the memory
operation), the memory operation's, and the client's remainder (its codec and bookkeeping).

Image payloads: `rlbench.kit.bench.image_transitions(rows, seed)` are stacked uint8 frames as an Atari run's actor
produces them (4 x 84 x 84 by default, episodes ending now and then); `replay_node(..., frames=4)`
makes the actor's INSERTs carry each frame once and the node's memory store each frame once, as an
image run's do. `wire.stream(size, seconds)` (the echo's second use) is the transport's raw
bandwidth for messages of a size: bytes/s of a one-way stream of them, nothing of rlbench's in it,
the peer of an image SAMPLE reply's bytes/s.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping

# (samples per insert, min size to sample, error buffer): a node that never holds anyone back
NEVER_LIMITED = (1.0, 1, 1e18)


def _serve(transport: str, transport_options: dict[str, Any], placement: str, replay: str, capacity: int,
           replay_options: dict[str, Any], batch_size: int, secret: bytes | None, fast_path: bool,
           rate_limit: tuple[float, int, float], layout: dict[str, Any] | None, frames: int,
           cpus: tuple[int, ...] | None, addresses: Any) -> None:
    if cpus:  # first, so the node serves on these cores only
        import os

        os.sched_setaffinity(0, cpus)
    from rlbench.plugins import get_registry
    from rlbench.runtime.distributed.rate_limiter import RateLimiter
    from rlbench.runtime.distributed.replay_node import NodeSettings, ReplayNode

    registry = get_registry()
    transport_component = registry.get("transport", transport)
    listener = transport_component.create(**transport_options).listen(None)
    memory_component = registry.get("replay", replay)
    stored_frames = frames if memory_component.capabilities.frames else 0  # (as a run's node makes its memory)
    memory = memory_component.create(capacity=capacity, alpha=0.6, seed=0,
                                     **({"frames": stored_frames} if stored_frames else {}), **replay_options)
    samples_per_insert, min_size_to_sample, error_buffer = rate_limit
    limiter = RateLimiter(samples_per_insert, min_size_to_sample=min_size_to_sample, error_buffer=error_buffer)
    settings = NodeSettings(placement=placement, total_steps=1 << 62, batch_size=batch_size, secret=secret,
                            max_message_bytes=transport_component.capabilities.max_message_bytes, fast_path=fast_path,
                            layout=layout, frames=frames)
    node = ReplayNode(listener, memory, limiter, settings, prioritized=memory_component.capabilities.prioritized)
    addresses.put(listener.address)
    try:
        node.serve()
    finally:
        listener.close()


@dataclass
class NodeUnderTest:
    """What `replay_node` yields: the node's address and clients speaking to it as actor 0, as the learner
    and as the launcher (`control`)."""

    address: str
    actor: Any  # ReplayClient speaking as actor 0
    learner: Any  # ReplayClient speaking as the learner
    control: Any  # Channel speaking as the launcher
    secret: bytes | None = field(default=None, repr=False)  # the node's (None: it runs without authentication)

    def report(self) -> dict[str, Any]:
        """The node's own report (its STATS answer): counters and times, as a run's result holds them."""
        from rlbench.runtime.distributed import messages
        from rlbench.runtime.distributed.messages import Op

        return messages.read_json(self.control.request(Op.STATS)[1]["json"])

    def histograms(self) -> dict[str, Any]:
        """The node's histograms now (rlbench.metrics.Histogram by name: serve.OP, memory.OP, ...)."""
        from rlbench.metrics import Histogram

        return {name: Histogram.from_dict(data) for name, data in self.report().get("histograms", {}).items()}


@contextlib.contextmanager
def _spawned(target: Callable[..., None], args: tuple[Any, ...]) -> Iterator[str]:
    """A server process (spawned: nothing inherited) and the address it announces."""
    context = multiprocessing.get_context("spawn")
    addresses = context.Queue()
    process = context.Process(target=target, args=(*args, addresses), daemon=True)
    process.start()
    try:
        yield addresses.get(timeout=60)
    finally:
        process.join(10)
        if process.is_alive():
            process.kill()
            process.join(5)
        addresses.close()
        addresses.join_thread()


@contextlib.contextmanager
def replay_node(transport: str, *, transport_options: dict[str, Any] | None = None, placement: str = "server",
                replay: str = "prioritized", capacity: int = 1 << 17, replay_options: dict[str, Any] | None = None,
                batch_size: int = 32, authenticate: bool = True, timeout: float = 30.0,
                fast_path: bool = True, rate_limit: tuple[float, int, float] = NEVER_LIMITED,
                layout: dict[str, Any] | None = None, frames: int = 0,
                cpus: Iterable[int] | None = None) -> Iterator[NodeUnderTest]:
    """A real replay node of `transport` and replay memory `replay` serving in its own process, for
    access benchmarks; yields a NodeUnderTest and stops the node on exit. The keywords set up what a
    run's node has: its placement, capacity, batch size, authentication, rate limiter (`rate_limit`:
    samples per insert, min size, error buffer), transition `layout`, `frames` and CPUs."""
    from rlbench.plugins import get_registry
    from rlbench.runtime.distributed import messages
    from rlbench.runtime.distributed.channel import Channel
    from rlbench.runtime.distributed.messages import Op
    from rlbench.runtime.distributed.replay_client import ReplayClient

    transport_options = transport_options or {}
    component = get_registry().get("transport", transport)  # unknown names: did you mean
    secret = secrets.token_bytes(32) if authenticate else None
    channels: list[Any] = []
    with _spawned(_serve, (transport, transport_options, placement, replay, capacity, replay_options or {},
                           batch_size, secret, fast_path, rate_limit, layout, frames,
                           tuple(sorted(cpus)) if cpus else None)) as address:
        try:
            def channel(role: str) -> Any:
                connection = component.create(**transport_options).connect(address, timeout=timeout)
                opened = Channel(connection, reliable=component.capabilities.reliable, timeout=timeout)
                channels.append(opened)
                opened.authenticate(role, 0, messages.role_key(secret, role, 0) if secret else None)
                return opened

            control = channel("launcher")
            actor = ReplayClient(channel("actor"), frames=frames)  # an image run's actor: each frame once
            yield NodeUnderTest(address, actor, ReplayClient(channel("learner")), control, secret)
            control.request(Op.SHUTDOWN)
        finally:
            for opened in channels:
                opened.close()


# --------------------------------------------------------------------------- where the time went
class Wire:
    """The transport's own figures over one connection to an echo server: `wire(size)` (a round trip,
    ns) and `wire.stream(size, seconds)` (bytes/s)."""

    def __init__(self, connection: Any, timeout: float) -> None:
        self.connection = connection
        self.timeout = timeout
        self._payloads: dict[int, bytes] = {}

    def __call__(self, size: int) -> int:
        """The nanoseconds of one `connection.request` of a `size`-byte message, echoed."""
        payload = self._payloads.get(size)
        if payload is None:
            from rlbench.bench.transport import ECHO

            payload = self._payloads[size] = ECHO + bytes(max(0, size - 1))
        started = time.perf_counter_ns()
        self.connection.request(payload, timeout=self.timeout)
        return time.perf_counter_ns() - started

    def stream(self, size: int, seconds: float) -> float:
        """Bytes/s of `size`-byte messages sent one way as fast as the transport takes them, counted by
        the server as it receives them (timed until it confirms the count)."""
        from rlbench.bench.transport import stream_rate

        return stream_rate(self.connection, size, seconds)


@contextlib.contextmanager
def wire_echo(transport: str, *, transport_options: dict[str, Any] | None = None,
              timeout: float = 30.0) -> Iterator[Wire]:
    """The transport's own round trip, with nothing of rlbench's codec or node on either side: an
    echo server in its own process over the same transport and options. Yields a `Wire`:
    `round_trip(size)`, the nanoseconds of one `connection.request` of a `size`-byte message, and
    `round_trip.stream(size, seconds)`, the bytes/s of a one-way stream of them. Measure in blocks
    interleaved with the replay node's (on a small machine two busy-polling servers slow each other
    while both are active; an idle one soon sleeps)."""
    from rlbench.bench.transport import QUIT, serve_echo
    from rlbench.kit.framing import reuse_freed_memory
    from rlbench.plugins import get_registry

    reuse_freed_memory()  # as a replay client does
    transport_options = transport_options or {}
    component = get_registry().get("transport", transport)
    with _spawned(serve_echo, (transport, transport_options)) as address:
        connection = component.create(**transport_options).connect(address, timeout=timeout)
        try:
            yield Wire(connection, timeout)
        finally:
            connection.send(QUIT)
            connection.close()


def message_bytes(op: str, transitions: Mapping[str, Any]) -> int:
    """Bytes each way of an echo that carries what one op's round trip carries (the mean of its
    request and its reply): INSERT of these transitions, or SAMPLE of as many rows as they hold."""
    import numpy as np

    from rlbench.runtime.distributed import messages
    from rlbench.runtime.distributed.messages import Op

    rows = len(transitions["obs"])
    if op == "INSERT":
        request = {**transitions, "produced": np.int64(rows)}
        reply = (Op.INSERTED, {"produced": np.int64(0), "params_version": np.int64(0),
                               "learner_updates": np.int64(0), "finished": np.uint8(0)})
    elif op == "SAMPLE":
        request = {"batch_size": np.int64(rows), "beta": np.float64(0.4)}
        reply = (Op.BATCH, {"indices": np.zeros(rows, np.int64), "weights": np.zeros(rows, np.float32),
                            **transitions, "step": np.int64(0)})
    else:
        raise ValueError(f"message_bytes: INSERT or SAMPLE, not {op!r}")
    sizes = [len(messages.joined(messages.encode(Op[op], request))), len(messages.joined(messages.encode(*reply)))]
    return (sum(sizes) + 1) // 2


def _since(before: Any, after: Any) -> Any:
    """What a histogram recorded between two snapshots of it."""
    from rlbench.metrics import Histogram

    recorded = Histogram()
    if after is None:
        return recorded
    previous = before or Histogram()
    recorded.counts = [a - b for a, b in zip(after.counts, previous.counts)]
    recorded.count, recorded.total = after.count - previous.count, after.total - previous.total
    recorded.min, recorded.max = after.min, after.max  # the window's own extremes are not kept: the run's
    return recorded


def time_shares(op: str, measured_us: float, wire_us: float, before: Mapping[str, Any],
                after: Mapping[str, Any]) -> dict[str, Any]:
    """Where one op's time went, p50s in microseconds (all measured): `measured_us` as its client
    saw it, `wire_us` the transport's own round trip of a message of the same size, and the node's
    histograms before and after the op's requests (NodeUnderTest.histograms). The node's own share
    is its handling time (serve.OP) less the memory operation's (memory.OP); what is left of the
    measured time is the client's (its codec and bookkeeping; negative when the p50s do not add up,
    e.g. on a busy machine). Each share also as a % of the measured time."""
    serve = _since(before.get(f"serve.{op}"), after.get(f"serve.{op}"))
    memory = _since(before.get(f"memory.{op}"), after.get(f"memory.{op}"))
    serve_us = serve.percentile(50) / 1e3 if serve.count else float("nan")
    memory_us = memory.percentile(50) / 1e3 if memory.count else 0.0
    shares = {"wire_us": wire_us, "node_us": serve_us - memory_us, "memory_us": memory_us,
              "client_us": measured_us - wire_us - serve_us}
    return {"op": op, "measured_us": measured_us, "node_messages": serve.count, **shares,
            "percent": {name[:-3]: 100.0 * value / measured_us for name, value in shares.items()}}
