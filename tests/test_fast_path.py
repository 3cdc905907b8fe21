"""The replay node's native fast path and the native codec (rlbench/_native/wire.c): they give what the
general (Python) path gives — the same bytes, the same stored rows, the same sampled indices for the
same seed, the same priorities, the same accounting and the same refusals — and plugin memories
still take the general path."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from support import served, valid_insert
from test_hardening import answer_then_status, connected, mutations, valid_message
from rlbench import get_registry
from rlbench.config import RunConfig
from rlbench.kit.access import time_shares
from rlbench.kit.bench import numpy_sumtree_replay_class
from rlbench.metrics import Histogram
from rlbench.runner import run
from rlbench.runtime.distributed import messages
from rlbench.runtime.distributed.channel import Channel, RemoteError
from rlbench.runtime.distributed.messages import (SCHEMAS, Op, WireError, decode, encode, joined, python_decode,
                                                   python_encode)
from rlbench.runtime.distributed.rate_limiter import RateLimiter
from rlbench.runtime.distributed.replay_node import NodeSettings, ReplayNode

BUILD = "rlbench._wire is part of the build (pip install -e . with numpy importable at build time)"


def test_the_native_codec_is_built_and_serves_messages_py():
    assert messages.NATIVE is not None, f"{messages.NATIVE_REASON}: {BUILD}"
    assert encode == messages.NATIVE.encode and decode == messages.NATIVE.decode


# --------------------------------------------------------------------------------------- codec
def outcome(call, *args, **kwargs):
    """What a codec call gives: its value, or the exception's type, text and request id."""
    try:
        return "ok", call(*args, **kwargs)
    except Exception as exc:  # the comparison is the point: both raise the same
        return "raised", (type(exc).__name__, str(exc), getattr(exc, "request_id", None))


def same_decoded(native, python) -> None:
    assert native[0] == python[0], (native, python)
    if native[0] == "raised":
        assert native[1] == python[1]
        return
    (op, request_id, arrays), (op2, request_id2, arrays2) = native[1], python[1]
    assert (op, request_id, list(arrays)) == (op2, request_id2, list(arrays2))
    assert type(op) is Op
    for name, array in arrays.items():
        other = arrays2[name]
        assert (array.dtype, array.shape, array.flags.writeable, array.flags.aligned) == \
               (other.dtype, other.shape, other.flags.writeable, other.flags.aligned), name
        np.testing.assert_array_equal(array, other)


def corpus():
    """Every op's valid body and structure-aware mutations of it, as arrays and as raw bytes."""
    rng = np.random.default_rng(7)
    for op in SCHEMAS:
        body = valid_message(op)
        yield op, body
        for mutated in mutations(op, body, rng):
            yield op, mutated


def test_encode_gives_messages_py_bytes_or_its_error_for_every_op_and_mutation():
    encoded = 0
    for op, body in corpus():
        if isinstance(body, bytes):
            continue
        for request_id in (0, 7, 2**32 + 5, -1):
            native, python = outcome(encode, op, body, request_id), outcome(python_encode, op, body, request_id)
            assert native[0] == python[0], (op, body)
            if native[0] == "ok":
                assert joined(native[1]) == joined(python[1]), (op, body)
                encoded += 1
            else:
                assert native[1] == python[1]
    assert encoded > 500
    # what np.asarray would send: Python numbers, numpy scalars, views, odd dtypes, strided arrays
    for value in (5, -3, 2**62, 2**63, 2**64, 0.25, True, np.float16(1.5), np.uint64(7), np.bool_(True),
                  np.arange(12.0).reshape(3, 4)[:, ::2], np.zeros((2, 0)), np.array("text"), np.zeros(3, ">f4"),
                  np.zeros(2, np.complex64), [1, 2, 3], None):
            native, python = outcome(encode, Op.SAMPLE, {"x": value}, 3), outcome(python_encode, Op.SAMPLE, {"x": value}, 3)
            assert native[0] == python[0], value
            assert (joined(native[1]) == joined(python[1])) if native[0] == "ok" else native[1] == python[1], value


def test_decode_gives_messages_py_result_or_its_error_for_every_op_mutation_and_corruption():
    rng = np.random.default_rng(11)
    for op, body in corpus():
        message = body if isinstance(body, bytes) else joined(python_encode(op, body, 9))
        for candidate in (message, bytearray(message), memoryview(message), message[:-3], message + b"\0" * 8):
            same_decoded(outcome(decode, candidate), outcome(python_decode, candidate))
        same_decoded(outcome(decode, message, max_bytes=len(message) - 1),
                     outcome(python_decode, message, max_bytes=len(message) - 1))
        for _ in range(3):
            corrupted = bytearray(message)
            for position in rng.integers(0, len(corrupted), size=rng.integers(1, 6)):
                corrupted[position] = rng.integers(0, 256)
            same_decoded(outcome(decode, bytes(corrupted)), outcome(python_decode, bytes(corrupted)))


def test_decoded_arrays_keep_the_buffer_alive_and_remembered_layouts_still_check_values():
    message = bytearray(joined(encode(Op.INSERT, valid_insert(3), 4)))
    _, _, arrays = decode(message)
    del message
    assert arrays["obs"].sum() == 12.0 and arrays["obs"].flags.writeable  # a writable buffer gives writable views
    good = joined(encode(Op.SAMPLE, {"batch_size": 4, "beta": 0.5}, 1))
    assert decode(good)[2]["beta"] == 0.5
    with pytest.raises(WireError, match=r"beta = 1.5 is outside \[0, 1\]") as error:
        decode(joined(encode(Op.SAMPLE, {"batch_size": 4, "beta": 1.5}, 8)))
    assert error.value.request_id == 8
    with pytest.raises(WireError, match="beta = nan"):
        decode(joined(encode(Op.SAMPLE, {"batch_size": 4, "beta": float("nan")}, 8)))


def test_more_layouts_than_the_codec_remembers_still_decode_the_same():
    distinct = [joined(python_encode(Op.ERROR, {"message": messages.text("x" * n)}, n)) for n in range(1, 1300)]
    for message in distinct + distinct[:10]:  # the codec forgets what it remembered when full, as messages.py does
        same_decoded(outcome(decode, message), outcome(python_decode, message))
    assert 0 < messages.NATIVE.remembered <= 1024


# ------------------------------------------------------------------- fast path vs general path
class ScriptedListener:
    """A listener fed from a script of (peer, message); what the node sends is kept in order. The
    script may be a generator that looks at what was sent so far."""

    def __init__(self, script) -> None:
        self.script = iter(script)
        self.sent: list[tuple[int, bytes]] = []
        self.node: ReplayNode | None = None
        self.stats = {"bytes_sent": 0}

    def recv(self, timeout=None):
        item = next(self.script, None)
        if item is None:
            self.node.shutdown = True
        return item

    def send(self, peer, *parts):
        self.sent.append((peer, joined(parts)))

    @property
    def peers(self):  # every peer of the script stays connected (the node forgets departed ones every second)
        return list(self.node.peers) if self.node is not None else []


def insert(rows, request_id, rng, **changes):
    arrays = {"obs": rng.standard_normal((rows, 4), dtype=np.float32), "action": rng.integers(0, 2, rows),
              "reward": rng.standard_normal(rows, dtype=np.float32),
              "next_obs": rng.standard_normal((rows, 4), dtype=np.float32), "done": rng.random(rows) < 0.1,
              "produced": rows}
    arrays.update(changes)
    return joined(python_encode(Op.INSERT, {k: v for k, v in arrays.items() if v is not None}, request_id))


def script(seed: int):
    """A run's worth of messages, hostile ones included: an actor (peer 1), the learner (2), a stranger (3)."""
    rng = np.random.default_rng(seed)
    ids = iter(range(1, 1 << 30))
    hello = {"index": np.int64(0), "nonce": np.zeros(16, np.uint8)}
    yield 1, joined(encode(Op.HELLO, {"role": messages.text("actor"), **hello}, next(ids)))
    yield 2, joined(encode(Op.HELLO, {"role": messages.text("learner"), **hello}, next(ids)))
    yield 3, insert(4, next(ids), rng)  # before authentication
    yield 1, insert(4, next(ids), rng)  # the first INSERT: the general path's
    last = next(ids)
    yield 1, insert(3, last, rng, priorities=rng.random(3) * 3)
    yield 1, insert(3, last, rng)  # a retry of it: not stored twice
    yield 2, insert(2, next(ids), rng)  # forbidden
    yield 1, joined(encode(Op.SAMPLE, {"batch_size": 2, "beta": 0.4}, next(ids)))  # forbidden
    sample = lambda n, beta=0.4: joined(encode(Op.SAMPLE, {"batch_size": n, "beta": beta}, next(ids)))
    update = lambda indices, priorities, **extra: joined(encode(Op.UPDATE_PRIORITIES, {
        "indices": indices, "priorities": priorities, "learner_updates": int(rng.integers(0, 100)), **extra}, 0))
    yield 2, sample(4)
    yield 2, update(np.arange(3), np.array([0.5, 2.0, 0.0]))
    yield 2, update(np.arange(2, dtype=np.int32), np.array([1.5, 0.1], np.float32), credit=2, beta=0.7)
    yield 2, update(np.arange(2), np.ones(2), credit=1)  # credit without beta: refused
    yield 2, update(np.array([10**6]), np.ones(1))  # out of range
    yield 2, update(np.array([1]), np.array([-1.0]))  # negative
    yield 2, update(np.array([1], np.uint8), np.array([3.0]))  # converted by the general path
    yield 2, update(np.array([0, 1]), np.array([1.0, np.inf]))  # not finite
    yield 1, insert(40, next(ids), rng)  # more than the capacity: the last 16 are kept
    yield 1, insert(2, next(ids), rng, obs=np.ones((2, 5), np.float32), next_obs=np.ones((2, 5), np.float32))
    yield 1, insert(2, next(ids), rng, action=np.ones(2, np.float32))  # another dtype than the memory's
    yield 1, insert(2, next(ids), rng, priorities=np.array([1.0, np.nan]))
    yield 1, insert(2, next(ids), rng, priorities=np.array([1.0, 2.0], np.float32))
    yield 1, insert(2, next(ids), rng, priorities=np.array([1.0, 2.0], np.float16))
    yield 1, insert(2, next(ids), rng, priorities=np.array([1e300, 2.0]))  # overflows alpha for the tree
    yield 1, insert(2, next(ids), rng)[:-5]  # truncated
    yield 1, insert(2, next(ids), rng, produced=np.int64(-4))  # out of range
    yield 2, sample(17)  # more than the capacity
    yield 2, sample(16, 0.0)
    yield 2, sample(1, 1.0)
    yield 2, joined(encode(Op.FETCH_PARAMS, {"have_version": -1}, next(ids)))
    yield 2, joined(encode(Op.STATUS, {}, next(ids)))
    for _ in range(300):  # the data path, mixed
        kind, rows = rng.integers(0, 4), int(rng.integers(1, 9))
        if kind == 0:
            yield 1, insert(rows, next(ids), rng)
        elif kind == 1:
            yield 1, insert(rows, next(ids), rng, priorities=rng.random(rows) * 2)
        elif kind == 2:
            yield 2, sample(int(rng.integers(1, 17)), float(rng.random()))
        else:
            n = int(rng.integers(0, 6))
            yield 2, update(rng.integers(0, 16, n), rng.random(n) * 2, **({"credit": 1, "beta": 0.5} if n == 3 else {}))
    yield 1, joined(encode(Op.BYE, {"report": messages.json_array({"x": 1})}, next(ids)))
    yield 1, insert(2, next(ids), rng)  # after its goodbye


def serve_script(memory_name: str, fast_path: bool, *, limiter: RateLimiter, total_steps: int = 10**9,
                 placement: str = "server", shards: int = 1):
    memory = get_registry().get("replay", memory_name).create(capacity=16, alpha=0.6, seed=3)
    listener = ScriptedListener(script(5))
    node = ReplayNode(listener, memory, limiter, NodeSettings(placement=placement, total_steps=total_steps,
                                                              batch_size=4, fast_path=fast_path, shards=shards),
                      prioritized=memory_name == "prioritized")
    listener.node = node
    report = node.serve()
    return node, listener.sent, report


@pytest.mark.parametrize("shards", [1, 2])  # a shard of several: its BATCHes carry the memory's priority mass
@pytest.mark.parametrize("limits", ["open", "tight", "budget"])
@pytest.mark.parametrize("memory_name", ["uniform", "prioritized"])
def test_fast_and_general_paths_answer_store_sample_and_account_the_same(memory_name, limits, shards):
    def limiter():  # open: never waits; tight: SAMPLEs wait and INSERT replies are held; budget: the run ends
        return RateLimiter(1.0, 1, 1e18) if limits != "tight" else RateLimiter(1.0, min_size_to_sample=8, error_buffer=6.0)

    steps = 120 if limits == "budget" else 10**9
    fast, fast_sent, fast_report = serve_script(memory_name, True, limiter=limiter(), total_steps=steps, shards=shards)
    general, general_sent, general_report = serve_script(memory_name, False, limiter=limiter(), total_steps=steps,
                                                         shards=shards)
    batches = [python_decode(message)[2] for _, message in fast_sent if python_decode(message)[0] == Op.BATCH]
    assert batches and all(("mass" in batch) == (shards > 1) for batch in batches)
    assert general.fast is None and general_report["fast_path"] == {"on": False, "why": "off (NodeSettings.fast_path)"}
    served_natively = fast.fast.handled
    assert served_natively["INSERT"] > 20 and served_natively["UPDATE_PRIORITIES"] > 20, served_natively
    assert served_natively["SAMPLE"] > {"open": 20, "tight": 0, "budget": -1}[limits], served_natively  # tight: most wait
    assert fast_sent == general_sent  # every reply, byte for byte, in the same order
    assert fast.recorder.counters == general.recorder.counters
    assert {"malformed", "forbidden", "unauthenticated", "rejected_requests", "duplicate_inserts"} <= set(
        fast.recorder.counters)
    for name in ("produced", "stored", "done", "done_reason", "credit", "beta", "learner_updates", "first_insert_n"):
        assert getattr(fast.state, name) == getattr(general.state, name), name
    assert fast.limiter == general.limiter  # the rate limiter's counts
    assert fast_report["memory"] == general_report["memory"]  # sizes and counters
    for name, column in fast.memory._columns.items():
        np.testing.assert_array_equal(column, general.memory._columns[name])
    assert fast.memory._rng.bit_generator.state == general.memory._rng.bit_generator.state
    if memory_name == "prioritized":
        np.testing.assert_array_equal(fast.memory.priorities(np.arange(16)), general.memory.priorities(np.arange(16)))
    for report in (fast_report, general_report):  # both paths time the node's handling and the memory op
        assert {"serve.INSERT", "memory.INSERT", "serve.UPDATE_PRIORITIES"} <= set(report["histograms"])
    if limits == "budget":
        assert fast.state.done and fast.state.done_reason == "step budget reached"


def test_the_in_network_push_draws_the_same_batches_on_both_paths():
    def pushes(fast_path: bool):
        memory = get_registry().get("replay", "prioritized").create(capacity=64, alpha=0.6, seed=1)
        rng = np.random.default_rng(2)
        messages_in = [(1, joined(encode(Op.HELLO, {"role": messages.text("actor"), "index": np.int64(0),
                                                     "nonce": np.zeros(16, np.uint8)}, 1))),
                       (2, joined(encode(Op.HELLO, {"role": messages.text("learner"), "index": np.int64(0),
                                                     "nonce": np.zeros(16, np.uint8)}, 2)))]
        messages_in += [(1, insert(8, 10 + i, rng)) for i in range(6)]
        messages_in += [(2, joined(encode(Op.CREDIT, {"credit": 3, "beta": 0.5}, 0)))]
        messages_in += [(2, joined(encode(Op.UPDATE_PRIORITIES, {"indices": np.arange(4), "priorities": rng.random(4),
                                                                 "learner_updates": i, "credit": 1, "beta": 0.6}, 0)))
                        for i in range(5)]
        listener = ScriptedListener(messages_in)
        node = ReplayNode(listener, memory, RateLimiter(1.0, 1, 1e18),
                          NodeSettings(placement="in-network", total_steps=10**9, batch_size=4, fast_path=fast_path),
                          prioritized=True)
        listener.node = node
        node.serve()
        return [message for peer, message in listener.sent if peer == 2 and decode(message)[0] == Op.BATCH]

    native, general = pushes(True), pushes(False)
    assert len(native) == 8 and native == general


def test_a_plugin_memory_takes_the_general_path_and_works():
    plugin = numpy_sumtree_replay_class()(64, alpha=0.6, seed=0)
    assert plugin.native_handle() is None  # a subclass of the core's memory: its methods may differ
    listener = ScriptedListener(list(script(9))[:40])
    node = ReplayNode(listener, plugin, RateLimiter(1.0, 1, 1e18),
                      NodeSettings(placement="server", total_steps=10**9, batch_size=4), prioritized=True)
    listener.node = node
    report = node.serve()
    assert node.fast is None and "has no native handle" in report["fast_path"]["why"]
    assert node.state.stored > 0 and report["memory"]["samples"] > 0 and report["memory"]["updates"] > 0
    replies = [decode(message)[0] for _, message in listener.sent]
    assert Op.BATCH in replies and Op.INSERTED in replies


def test_the_memmap_example_plugin_memory_serves_through_the_general_path(tmp_path):
    component = get_registry().get("replay", "memmap")
    memory = component.create(capacity=64, alpha=0.6, seed=0, directory=str(tmp_path))
    listener = ScriptedListener(list(script(4))[:40])
    node = ReplayNode(listener, memory, RateLimiter(1.0, 1, 1e18),
                      NodeSettings(placement="server", total_steps=10**9, batch_size=4),
                      prioritized=component.capabilities.prioritized)
    listener.node = node
    report = node.serve()
    assert node.fast is None and report["stored"] > 0
    assert Op.BATCH in [decode(message)[0] for _, message in listener.sent]


# ------------------------------------------------------------------------- hostile peers, live
def fuzz_node(fast_path: bool) -> tuple[list, dict, dict | None]:
    """test_hardening's structure-aware fuzz of the data path's ops against a live node: every reply
    (op, request id), the node's counters, and what its fast path served."""
    rng = np.random.default_rng(13)
    seen = []
    with served("tcp", max_message_bytes=4 << 20, fast_path=fast_path) as (transport, listener, node):
        learner = connected(transport, listener, "learner")
        actor = connected(transport, listener, "actor")
        actor.request(Op.INSERT, valid_insert(64))
        for op in (Op.INSERT, Op.SAMPLE, Op.UPDATE_PRIORITIES, Op.CREDIT):
            for mutated in [valid_message(op)] * 3 + list(mutations(op, valid_message(op), rng)):
                message = mutated if isinstance(mutated, bytes) else joined(encode(op, mutated, 7))
                for connection in (actor.connection, learner.connection):
                    seen.append(answer_then_status(connection, message, 1000 + len(seen)))
        actor.request(Op.INSERT, valid_insert(4))
        learner.request(Op.SAMPLE, {"batch_size": 8, "beta": 0.5})
        counters = dict(node.recorder.counters)
        handled = node.fast.handled if node.fast is not None else None
        actor.close()
        learner.close()
    return seen, counters, handled


def test_the_hardening_fuzz_gives_the_same_answers_and_counts_with_the_fast_path_on_and_off():
    seen, counters, handled = fuzz_node(True)
    assert counters["malformed"] > 40 and counters["forbidden"] > 10
    # (every fuzzed message carries request id 7: after the first, an INSERT is a retry, the general path's)
    assert min(handled.values()) > 0 and sum(handled.values()) > 10, handled
    assert fuzz_node(False)[:2] == (seen, counters)


def test_malformed_and_refused_requests_on_the_fast_path_get_errors_and_change_nothing():
    with served("tcp", capacity=32) as (transport, listener, node):
        actor = connected(transport, listener, "actor")
        learner = connected(transport, listener, "learner")
        actor.request(Op.INSERT, valid_insert(8))
        before = node.fast.handled["INSERT"]
        actor.request(Op.INSERT, valid_insert(8))
        assert node.fast.handled["INSERT"] == before + 1  # the fast path serves this connection
        stored = node.state.stored
        bad = {"NaN priority": {**valid_insert(2), "priorities": np.array([1.0, np.nan])},
               "negative priority": {**valid_insert(2), "priorities": np.array([-1.0, 1.0])},
               "other dtype": {**valid_insert(2), "action": np.ones(2, np.float64)},
               "other row shape": {**valid_insert(2), "obs": np.ones((2, 3), np.float32),
                                   "next_obs": np.ones((2, 3), np.float32)}}
        for label, body in bad.items():
            with pytest.raises(RemoteError, match="INSERT refused"):
                actor.request(Op.INSERT, body)
        with pytest.raises(RemoteError, match="produced = -1 is outside"):
            actor.request(Op.INSERT, {**valid_insert(2), "produced": -1})
        truncated = joined(encode(Op.INSERT, valid_insert(2), 99))[:-4]
        op, request_id, arrays = decode(actor.connection.request(truncated, timeout=10))
        assert op == Op.ERROR and request_id == 99 and "truncated" in messages.read_text(arrays["message"])
        stranger = transport.connect(listener.address)
        with pytest.raises(RemoteError, match="before authentication"):  # a stranger's INSERT: refused
            Channel(stranger, timeout=10).request(Op.INSERT, valid_insert(2))
        stranger.close()
        counters = node.recorder.counters
        assert counters["rejected_requests"] == 4 and counters["malformed"] == 2 and counters["unauthenticated"] == 1
        assert node.state.stored == stored and node.memory._size == min(32, stored)
        op, _ = learner.request(Op.SAMPLE, {"batch_size": 8, "beta": 0.5})
        assert op == Op.BATCH and node.fast.handled["SAMPLE"] >= 1
        actor.close()
        learner.close()


# ------------------------------------------------------------------------------- a real run
@pytest.mark.parametrize("placement", ["server", "in-network"])
def test_a_run_is_served_by_the_fast_path_with_exact_accounting(placement):
    result = run(RunConfig(placement=placement, transport="shm", actors=2, steps=3000, eval_episodes=0,
                           hyperparameters={"learning_starts": 200, "batch_size": 32, "publish_every": 5}))
    assert result["status"] == "complete", result["status_reason"]
    accounting = result["accounting"]
    assert accounting["balanced"] and accounting["dropped"] == 0 and accounting["produced"] >= 3000
    node = result["loop"]["roles"]["replay"]
    served_natively = node["fast_path"]["served"]
    assert node["fast_path"]["on"] and served_natively["INSERT"] > 0 and served_natively["UPDATE_PRIORITIES"] > 0
    if placement == "server":
        assert served_natively["SAMPLE"] > 0
    latency = result["latency"]
    assert latency["replay_node.serve.INSERT"]["count"] > 0 and latency["replay_node.memory.INSERT"]["count"] > 0


# ------------------------------------------------------------------------------------ shares
def test_time_shares_split_the_measured_time_into_wire_node_memory_and_client():
    def histogram(values):
        h = Histogram()
        for value in values:
            h.record(value)
        return h

    before = {"serve.INSERT": histogram([1000] * 5), "memory.INSERT": histogram([400] * 5)}
    after = {"serve.INSERT": histogram([1000] * 5 + [2000] * 11), "memory.INSERT": histogram([400] * 5 + [500] * 11)}
    shares = time_shares("INSERT", 10.0, 4.0, before, after)
    assert shares["node_messages"] == 11  # only what was recorded between the snapshots
    assert shares["node_us"] == pytest.approx(1.5, rel=0.02) and shares["memory_us"] == pytest.approx(0.5, rel=0.02)
    assert shares["wire_us"] + shares["node_us"] + shares["memory_us"] + shares["client_us"] == pytest.approx(10.0)
    assert sum(shares["percent"].values()) == pytest.approx(100.0)


def test_bench_access_puts_the_fast_path_beside_the_general_path_and_splits_their_time():
    import json

    from click.testing import CliRunner

    from rlbench.bench.access import command

    result = CliRunner().invoke(command, ["--transport", "shm", "--transport", "inproc", "--requests", "40",
                                          "--seconds", "0.1", "--json"])
    assert result.exit_code == 0, result.output
    measured = json.loads(result.output)["transports"]
    assert not measured["inproc"]["available"] and "cross processes" in measured["inproc"]["reason"]
    shm = measured["shm"]
    assert shm["fast_path"]["on"] and shm["fast_path"]["served"]["INSERT"] > 0
    assert [(row["op"], row["path"]) for row in shm["ops"]] == [("INSERT 1", "fast"), ("INSERT 1", "general"),
                                                               ("SAMPLE 32", "fast"), ("SAMPLE 32", "general")]
    for row in shm["ops"]:
        shares = row["shares"]
        assert shares["node_messages"] >= 40 and shares["memory_us"] > 0
        parts = shares["wire_us"] + shares["node_us"] + shares["memory_us"] + shares["client_us"]
        assert parts == pytest.approx(row["p50_us"])
    assert set(shm["insert_throughput"]) == {"fast", "general"} and min(shm["insert_throughput"].values()) > 0


def test_a_codec_or_fast_path_never_initialised_refuses_instead_of_crashing():
    """Made with __new__ (or after an __init__ that failed), their fields are NULL: each method used
    to read them and the process died (SIGSEGV). In a child, so a crash is a failure, not the suite's end."""
    script = """
from rlbench._wire import Codec, FastPath
for call in (lambda: Codec.__new__(Codec).decode(b"RB" + bytes(20)), lambda: Codec.__new__(Codec).encode(300),
             lambda: FastPath.__new__(FastPath).batch(1, 0.5), lambda: FastPath.__new__(FastPath).handle(1, b"")):
    try:
        call()
    except RuntimeError as exc:
        assert "was not initialised" in str(exc), exc
    else:
        raise AssertionError("no refusal")
print("refused")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "refused", (done.returncode, done.stderr[-2000:])
