"""The runtime's real replay node over dpdk (rlbench.kit.access.replay_node), fed garbage and mutated
wire messages by unauthenticated connections: it answers each with an ERROR, counts the refusals
(`malformed`, `unauthenticated`), drops a connection after MAX_ERRORS_BEFORE_AUTH of them (the
listener's drop: the peer learns it from the goodbye, and a new connection starts afresh), and its
actor and learner go on inserting and sampling."""

from __future__ import annotations

import random
import time

import numpy as np

from rlbench.kit.access import replay_node
from rlbench.kit.framing import TransportClosedError
from rlbench.runtime.distributed.replay_node import MAX_ERRORS_BEFORE_AUTH
from rlbench_dpdk.transport import DpdkTransport

FUZZ_MESSAGES = 400  # about 1 s on a quiet machine, some 20 connections dropped before auth
# Ends a run on a machine so loaded that the messages would take minutes; never reached otherwise,
# and no assertion of speed: the checks below hold for however many messages were sent.
FUZZ_CAP_S = 60.0


def transitions(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"obs": rng.standard_normal((n, 4), dtype=np.float32), "action": rng.integers(0, 2, n),
            "reward": np.ones(n, dtype=np.float32), "next_obs": rng.standard_normal((n, 4), dtype=np.float32),
            "done": np.zeros(n, dtype=bool)}


def mutated(rng: random.Random, message: bytes) -> bytes:
    """A wire message with a few of its bytes changed, cut short, extended, or its header's fields
    (version, op, array count, descriptor length: bytes 2..11) rewritten."""
    data = bytearray(message)
    mode = rng.randrange(4)
    if mode == 0:
        for _ in range(rng.randrange(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
    elif mode == 1:
        data = data[:rng.randrange(len(data))]
    elif mode == 2:
        data += rng.randbytes(rng.randrange(1, 64))
    else:
        position = rng.randrange(2, min(12, len(data)))
        data[position] = rng.choice([0, 1, 255, rng.randrange(256)])
    return bytes(data)


def test_a_replay_node_over_dpdk_survives_garbage_and_mutated_messages(dpdk_available):
    rng = random.Random(31337)
    with replay_node("dpdk", transport_options={"port": "memif"}, capacity=8192, timeout=20.0) as node:
        node.actor.add(transitions(64))
        fuzzer = DpdkTransport().connect(node.address, timeout=10)
        try:
            # Garbage first. Each answer is an ERROR: a valid message of the node's wire, the seed
            # of the mutations that follow (decoded and refused as unauthenticated when unchanged).
            corpus = [bytes(fuzzer.request(rng.randbytes(rng.randrange(1, 300)), timeout=10)) for _ in range(4)]
            assert all(reply[:2] == b"RB" for reply in corpus), "the node's answers are not its wire's messages"
            sent = dropped = 0
            on_this_connection = len(corpus)
            cap = time.monotonic() + FUZZ_CAP_S
            while sent < FUZZ_MESSAGES and time.monotonic() < cap:
                message = rng.choice(corpus)
                sent += 1
                try:
                    reply = fuzzer.request(message if sent % 10 == 0 else mutated(rng, message), timeout=10)
                except TransportClosedError:  # dropped: a new connection starts with a new allowance
                    assert on_this_connection == MAX_ERRORS_BEFORE_AUTH, \
                        f"dropped after {on_this_connection} refusals, not {MAX_ERRORS_BEFORE_AUTH}"
                    dropped += 1
                    fuzzer.close()
                    fuzzer = DpdkTransport().connect(node.address, timeout=10)
                    on_this_connection = 0
                    continue
                assert reply[:2] == b"RB", f"message {sent}: the node answered {bytes(reply[:16])!r}"
                on_this_connection += 1
                if len(corpus) < 64:
                    corpus.append(bytes(reply))
        finally:
            fuzzer.close()
        node.actor.add(transitions(32, seed=1))
        sample = node.learner.sample(16, 0.4)
        assert len(sample.indices) == 16
        counters = node.report()["counters"]
        assert dropped > 0, f"{sent} fuzz messages and no connection dropped"
        assert counters.get("malformed", 0) > 0 and counters.get("unauthenticated", 0) > 0, counters
        assert counters.get("dropped_before_auth") == dropped, counters
        refusals = counters.get("malformed", 0) + counters.get("unauthenticated", 0)
        assert refusals == sent + 4, f"{sent + 4} messages sent, {refusals} refusals counted: {counters}"
