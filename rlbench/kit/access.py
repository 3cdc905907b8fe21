"""For transport and replay-memory authors who benchmark replay access as a run's roles see it.

    from rlbench.kit.access import replay_node

    with replay_node("dpdk", transport_options={"port": "memif"}) as node:
        node.actor.add(transitions)                 # INSERT, as an actor
        sample = node.learner.sample(32, beta=0.4)  # SAMPLE, as the learner (server placement)

`replay_node(...)` starts the runtime's real replay node in its own process, serving a registered
replay memory over a registered transport, with the run's authentication, and connects two
clients to it: `actor` and `learner` (`rlbench.runtime`'s ReplayClient: add / add_begin /
add_finish, sample, update_priorities, credit and wait_pushed for in-network placement). The node
never rate-limits (a benchmark measures access, not the algorithm's pacing) and its budget never
ends; leaving the block shuts it down. `node.report()` is the node's own report (per-op serve
times, counters, link bytes).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import secrets
from dataclasses import dataclass
from typing import Any, Iterator


def _serve(transport: str, transport_options: dict[str, Any], placement: str, replay: str, capacity: int,
           replay_options: dict[str, Any], batch_size: int, secret: bytes | None, addresses: Any) -> None:
    from rlbench.plugins import get_registry
    from rlbench.runtime.distributed.rate_limiter import RateLimiter
    from rlbench.runtime.distributed.replay_node import NodeSettings, ReplayNode

    registry = get_registry()
    transport_component = registry.get("transport", transport)
    listener = transport_component.create(**transport_options).listen(None)
    memory_component = registry.get("replay", replay)
    memory = memory_component.create(capacity=capacity, alpha=0.6, seed=0, **replay_options)
    limiter = RateLimiter(1.0, min_size_to_sample=1, error_buffer=1e18)  # never holds anyone back
    settings = NodeSettings(placement=placement, total_steps=1 << 62, batch_size=batch_size, secret=secret,
                            max_message_bytes=transport_component.capabilities.max_message_bytes)
    node = ReplayNode(listener, memory, limiter, settings, prioritized=memory_component.capabilities.prioritized)
    addresses.put(listener.address)
    try:
        node.serve()
    finally:
        listener.close()


@dataclass
class NodeUnderTest:
    address: str
    actor: Any  # ReplayClient speaking as actor 0
    learner: Any  # ReplayClient speaking as the learner
    control: Any  # Channel speaking as the launcher

    def report(self) -> dict[str, Any]:
        from rlbench.runtime.distributed import messages
        from rlbench.runtime.distributed.messages import Op

        return messages.read_json(self.control.request(Op.STATS)[1]["json"])


@contextlib.contextmanager
def replay_node(transport: str, *, transport_options: dict[str, Any] | None = None, placement: str = "server",
                replay: str = "prioritized", capacity: int = 1 << 17, replay_options: dict[str, Any] | None = None,
                batch_size: int = 32, authenticate: bool = True, timeout: float = 30.0) -> Iterator[NodeUnderTest]:
    from rlbench.plugins import get_registry
    from rlbench.runtime.distributed.channel import Channel
    from rlbench.runtime.distributed.messages import Op
    from rlbench.runtime.distributed.replay_client import ReplayClient

    transport_options = transport_options or {}
    component = get_registry().get("transport", transport)  # unknown names: did you mean
    secret = secrets.token_bytes(32) if authenticate else None
    context = multiprocessing.get_context("spawn")
    addresses = context.Queue()
    process = context.Process(target=_serve, daemon=True,
                              args=(transport, transport_options, placement, replay, capacity, replay_options or {},
                                    batch_size, secret, addresses))
    process.start()
    channels: list[Any] = []
    try:
        address = addresses.get(timeout=60)

        def channel(role: str) -> Any:
            connection = component.create(**transport_options).connect(address, timeout=timeout)
            opened = Channel(connection, reliable=component.capabilities.reliable, timeout=timeout)
            channels.append(opened)
            opened.authenticate(role, 0, secret)
            return opened

        control = channel("launcher")
        yield NodeUnderTest(address, ReplayClient(channel("actor")), ReplayClient(channel("learner")), control)
        control.request(Op.SHUTDOWN)
    finally:
        for opened in channels:
            opened.close()
        process.join(10)
        if process.is_alive():
            process.kill()
            process.join(5)
        addresses.close()
        addresses.join_thread()
