"""Reference counts hold still while the replay node's native fast path (rlbench._wire.FastPath) serves
100k messages (issue #21, item 1).

The fast path hands back None (NOT_HANDLED) for every message it leaves to the general path. Early exits
that returned it without a new reference lowered None's count once per message, and CPython aborted
(none_dealloc) after ~12k retried or refused INSERTs. Here a replay node, driven in-process through
test_fast_path's ScriptedListener, takes every outcome of the fast path thousands of times, and the
reference counts of the singletons, of cached small ints and interned names the fast path reads and
writes, and of the node's own objects must come back to where they were.
"""

from __future__ import annotations

import gc
import sys
from collections import Counter
from dataclasses import dataclass

import numpy as np
import pytest

from test_fast_path import ScriptedListener, insert
from rlbench import get_registry
from rlbench.runtime.distributed import messages
from rlbench.runtime.distributed.messages import Op, decode, encode, joined
from rlbench.runtime.distributed.rate_limiter import RateLimiter
from rlbench.runtime.distributed.replay_node import NodeSettings, ReplayNode

MESSAGES_PER_MEMORY = 50_000  # two memories: 100k messages in all
CHECK_EVERY = 5_000  # messages between checks, so a leak fails the test long before None could be freed
# How far a count may move without a leak: a node field that holds a cached int (a cursor, a credit)
# or None at one check and another value at the next moves that object's count by one. The largest
# such drift seen is 4; each outcome below runs over 1,400 times per memory, so a leak of one
# reference per message of any outcome misses this by a factor of more than 80.
TOLERANCE = 16
MIN_RUNS_PER_OUTCOME = 1_000

ACTOR, LEARNER, STRANGER, REFUSED = 1, 2, 3, 4  # STRANGER never says HELLO; REFUSED failed to authenticate
CAPACITY = 16
# The fast path's names (wire.c's intern_names and FIELD_NAMES): its dict reads and writes use these objects.
INTERNED = ("refused", "authenticated", "role", "last_insert", "produced", "stored", "done", "first_insert_t",
            "last_insert_t", "params_version", "learner_updates", "credit", "beta", "_size", "_cursor", "_adds",
            "_add_calls", "_samples", "_sampled_items", "_updates", "_updated_items", "_columns", "indices",
            "weights", "step", "finished", "obs", "action", "reward", "next_obs", "priorities", "batch_size")
SMALL_INTS = (-1, 0, 1, 2, 4, CAPACITY)


@dataclass(frozen=True)
class Outcome:
    label: str
    peer: int
    message: bytes
    served_natively: str | None = None  # the op the fast path serves it as; None: the general path takes it
    counter: str | None = None  # the node counter the general path's refusal raises
    waits: bool = False  # a SAMPLE the node queues (the general path queues every SAMPLE it takes)
    held: bool = False  # an INSERT whose reply the rate limiter holds
    first_insert: bool = False  # sent with the node's clock cleared, so it is the node's first INSERT again


def request(op: Op, body: dict, request_id: int = 0) -> bytes:
    return joined(encode(op, body, request_id))


def one_round(prioritized: bool) -> list[Outcome]:
    """Every outcome of the fast path once. The limiter (1 sample per insert, 8 to start, error
    buffer 6) and the rows (48 inserted and 48 sampled per round, each round starting 8 ahead) make
    the first SAMPLE wait every round, the next queue behind it, the 38-row INSERT's reply be held,
    and two SAMPLEs be served natively; each round ends as it began."""
    rng = np.random.default_rng(3)
    rows = lambda n, request_id, **changes: insert(n, request_id, rng, **changes)
    sample = lambda n, request_id, beta=0.4: request(Op.SAMPLE, {"batch_size": np.int64(n), "beta": np.float64(beta)},
                                                     request_id)
    update = lambda indices, priorities, **extra: request(Op.UPDATE_PRIORITIES, {
        "indices": indices, "priorities": priorities, "learner_updates": np.int64(5), **extra})
    refused = "rejected_requests" if prioritized else None  # a uniform memory takes any priorities, unchecked
    wider = {"obs": np.ones((2, 5), np.float32), "next_obs": np.ones((2, 5), np.float32)}
    return [
        Outcome("SAMPLE that must wait (rate limiter)", LEARNER, sample(16, 901), waits=True),
        Outcome("SAMPLE behind a waiting one", LEARNER, sample(1, 902), waits=True),
        Outcome("INSERT accepted", ACTOR, rows(4, 1001), "INSERT"),
        Outcome("INSERT retried (same request id)", ACTOR, rows(4, 1001), counter="duplicate_inserts"),
        Outcome("INSERT with priorities", ACTOR, rows(3, 1002, priorities=rng.random(3) * 3), "INSERT"),
        Outcome("INSERT over capacity, reply held (rate limiter)", ACTOR, rows(38, 1003), "INSERT", held=True),
        Outcome("SAMPLE served", LEARNER, sample(16, 903), "SAMPLE"),
        Outcome("SAMPLE whose beta is float16", LEARNER,
                request(Op.SAMPLE, {"batch_size": np.int64(1), "beta": np.float16(0.5)}, 909), waits=True),
        Outcome("INSERT refused for its dtype", ACTOR, rows(2, 1004, action=np.ones(2, np.float32)),
                counter="rejected_requests"),
        Outcome("INSERT refused for its shape", ACTOR, rows(2, 1004, **wider), counter="rejected_requests"),
        Outcome("INSERT refused for a NaN priority", ACTOR, rows(2, 1004, priorities=np.array([1.0, np.nan])),
                counter="rejected_requests"),
        Outcome("INSERT with float16 priorities", ACTOR, rows(2, 1005, priorities=np.ones(2, np.float16)),
                held=True),
        Outcome("SAMPLE over capacity", LEARNER, sample(CAPACITY + 1, 904), counter="rejected_requests"),
        Outcome("UPDATE_PRIORITIES accepted", LEARNER, update(np.arange(3), np.array([0.5, 2.0, 0.0])),
                "UPDATE_PRIORITIES"),
        Outcome("UPDATE_PRIORITIES with credit, int32 and float32", LEARNER,
                update(np.arange(2, dtype=np.int32), np.array([1.5, 0.1], np.float32), credit=np.int64(1),
                       beta=np.float64(0.7)), "UPDATE_PRIORITIES"),
        Outcome("UPDATE_PRIORITIES of nothing", LEARNER, update(np.arange(0), np.zeros(0)), "UPDATE_PRIORITIES"),
        Outcome("UPDATE_PRIORITIES with an index out of range", LEARNER, update(np.array([10**6]), np.ones(1)),
                None if prioritized else "UPDATE_PRIORITIES", refused),
        Outcome("UPDATE_PRIORITIES with a NaN priority", LEARNER, update(np.array([1]), np.array([np.nan])),
                None if prioritized else "UPDATE_PRIORITIES", refused),
        Outcome("UPDATE_PRIORITIES with credit but no beta", LEARNER,
                update(np.arange(2), np.ones(2), credit=np.int64(1)), counter="rejected_requests"),
        Outcome("UPDATE_PRIORITIES with uint8 indices", LEARNER, update(np.array([1], np.uint8), np.array([3.0])),
                None if prioritized else "UPDATE_PRIORITIES"),
        Outcome("INSERT from the learner", LEARNER, rows(2, 1006), counter="forbidden"),
        Outcome("SAMPLE from an actor", ACTOR, sample(2, 905), counter="forbidden"),
        Outcome("INSERT before authentication", STRANGER, rows(2, 1007), counter="unauthenticated"),
        Outcome("SAMPLE before authentication", STRANGER, sample(2, 906), counter="unauthenticated"),
        Outcome("INSERT from a peer that failed to authenticate", REFUSED, rows(2, 1008),
                counter="refused_peer_messages"),
        Outcome("FETCH_PARAMS (not a fast op)", LEARNER, request(Op.FETCH_PARAMS, {"have_version": np.int64(-1)}, 910)),
        Outcome("STATUS (not a fast op)", ACTOR, request(Op.STATUS, {}, 911)),
        Outcome("CREDIT (not a fast op)", LEARNER,
                request(Op.CREDIT, {"credit": np.int64(1), "beta": np.float64(0.5)})),
        Outcome("INSERT truncated", ACTOR, rows(2, 1009)[:-5], counter="malformed"),
        Outcome("INSERT with produced out of range", ACTOR, rows(2, 1010, produced=np.int64(-4)), counter="malformed"),
        Outcome("shorter than a header", ACTOR, b"RB", counter="malformed"),
        Outcome("INSERT without obs", ACTOR, rows(2, 1011, obs=None), counter="malformed"),
        Outcome("SAMPLE with beta out of range", LEARNER, sample(2, 907, 1.5), counter="malformed"),
        Outcome("the first INSERT", ACTOR, rows(1, 1012), held=True, first_insert=True),
        Outcome("SAMPLE served, last of the round", LEARNER, sample(14, 908), "SAMPLE"),
    ]


def reference_counts(tracked: dict[str, object], node: ReplayNode) -> np.ndarray:
    """sys.getrefcount of each tracked object, less (for ints) the references the node's latency
    histograms and counters hold: their bucket counts are Python ints that move with timing."""
    gc.collect()
    histograms = [*node.recorder.histograms.values(), *node.depths.histograms.values()]
    counts = np.zeros(len(tracked), np.int64)  # numpy, so the counts themselves hold no cached ints
    for i, value in enumerate(tracked.values()):
        counts[i] = sys.getrefcount(value)
        if type(value) is int:
            counts[i] -= sum(h.counts.count(value) + [h.count, h.total, h.min, h.max].count(value) for h in histograms)
            counts[i] -= list(node.recorder.counters.values()).count(value)
    return counts


def hello(role: str, index: int = 0) -> bytes:
    body = {"role": messages.text(role), "index": np.int64(index), "nonce": np.zeros(16, np.uint8)}
    return request(Op.HELLO, body, 1)


@dataclass
class Driven:
    node: ReplayNode
    outcomes: list[Outcome]
    rounds: int = 0  # rounds sent after the first (which set everything up and took the baseline)
    checks: int = 0  # reference-count comparisons made
    at_baseline: dict | None = None  # what the node had served and counted after the first round


def served_so_far(node: ReplayNode) -> dict:
    return {"natively": dict(node.fast.handled), "counters": dict(node.recorder.counters),
            "waited": node.depths.histograms["pending_samples"].count,
            "held": node.depths.histograms["pending_inserts"].count, "stored": node.state.stored}


def drive(memory_name: str, messages_to_send: int) -> Driven:
    """A node over `memory_name` served rounds of every outcome until `messages_to_send`; every
    CHECK_EVERY messages the tracked counts are compared with those after the first round."""
    prioritized = memory_name == "prioritized"
    memory = get_registry().get("replay", memory_name).create(capacity=CAPACITY, alpha=0.6, seed=3)
    listener = ScriptedListener(())
    node = ReplayNode(listener, memory, RateLimiter(1.0, min_size_to_sample=8, error_buffer=6.0),
                      NodeSettings(placement="server", total_steps=10**15, batch_size=4),
                      prioritized=prioritized)
    driven = Driven(node, one_round(prioritized))

    def traffic():
        # The node has no secret, so HELLO is the whole handshake (the fast path reads only its outcome,
        # the peer's fields); REFUSED is left as a failed AUTH leaves a peer.
        yield ACTOR, hello("actor")
        yield LEARNER, hello("learner")
        yield REFUSED, hello("actor", 1)
        node.peers[REFUSED].authenticated, node.peers[REFUSED].refused = False, True
        # 8 rows ahead of the learner: every round then starts 8 ahead, where one_round's pattern holds
        yield ACTOR, insert(8, 999, np.random.default_rng(0))
        tracked = baseline = None
        count = 0
        while count < messages_to_send:
            stranger = node.peers.get(STRANGER)
            if stranger is not None:  # a fresh allowance of refusals before it is dropped, every round
                stranger.errors = 0
            for outcome in driven.outcomes:
                if outcome.first_insert:
                    node.state.first_insert_t = None  # the node's clock restarts: this INSERT is its first again
                yield outcome.peer, outcome.message
            count += len(driven.outcomes)
            listener.sent.clear()  # the node counts what it answered; 100k replies kept would only cost memory
            if tracked is None:  # after one round: every layout, histogram, counter and column exists
                tracked = {repr(value): value for value in (None, True, False, Ellipsis, NotImplemented, *SMALL_INTS)}
                tracked.update((f"interned {name!r}", sys.intern(name)) for name in INTERNED)
                tracked.update((f"peer {peer}", node.peers[peer]) for peer in (ACTOR, LEARNER, STRANGER, REFUSED))
                tracked.update({"the node's state": node.state, "the memory": node.memory,
                                "its columns": node.memory._columns, "its generator": node.memory._rng,
                                "the rate limiter": node.limiter, "waiting SAMPLEs": node.pending_samples,
                                "held INSERTs": node.pending_inserts, "the fast path": node.fast})
                if prioritized:
                    tracked["its sum tree"] = node.memory._tree
                driven.at_baseline = served_so_far(node)
                baseline = reference_counts(tracked, node)
                continue
            driven.rounds += 1
            if count // CHECK_EVERY != (count - len(driven.outcomes)) // CHECK_EVERY or count >= messages_to_send:
                drift = reference_counts(tracked, node) - baseline
                driven.checks += 1
                moved = {name: int(d) for name, d in zip(tracked, drift) if abs(d) > TOLERANCE}
                assert not moved, (f"reference counts moved over {driven.rounds} rounds of {len(driven.outcomes)} "
                                   f"messages (tolerance {TOLERANCE}): {moved}")

    listener.script = traffic()
    listener.node = node
    node.serve()
    return driven


@pytest.mark.parametrize("memory_name", ["prioritized", "uniform"])
def test_every_fast_path_outcome_leaves_reference_counts_where_they_were(memory_name):
    driven = drive(memory_name, MESSAGES_PER_MEMORY)
    node, outcomes, rounds = driven.node, driven.outcomes, driven.rounds
    assert node.fast is not None, node.fast_path_note
    assert rounds >= MIN_RUNS_PER_OUTCOME and driven.checks >= MESSAGES_PER_MEMORY // CHECK_EVERY - 1
    before, after = driven.at_baseline, served_so_far(node)

    # each outcome took the path it was sent for: the fast path served exactly these ...
    def per_round(field: str) -> Counter:
        return Counter({key: rounds * n for key, n in Counter(getattr(o, field) for o in outcomes).items() if key})

    natively = {op: after["natively"][op] - before["natively"][op] for op in after["natively"]}
    assert +Counter(natively) == per_round("served_natively")
    # ... the general path refused exactly these (an exception inside the fast path would add to them) ...
    counted = Counter(after["counters"])
    counted.subtract(before["counters"])
    assert +counted == per_round("counter")
    # ... the rate limiter queued exactly these SAMPLEs and held exactly these INSERTs' replies (the
    # 38-row one's by the fast path), and each round stored what it inserted and ended as it began
    assert after["waited"] - before["waited"] == per_round("waits")[True]
    assert after["held"] - before["held"] == per_round("held")[True]
    assert not node.pending_samples and not node.pending_inserts
    stored_per_round = sum(len(decode(outcome.message)[2]["obs"]) for outcome in outcomes
                           if outcome.served_natively == "INSERT" or outcome.held)
    assert after["stored"] - before["stored"] == stored_per_round * rounds
