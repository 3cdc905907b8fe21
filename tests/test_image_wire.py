"""Image observations on the wire and over the transports (issue #39, item 4): uint8 INSERTs and BATCHes
keep their dtype through both codecs; an image run's INSERT carries each frame once, and the replay node
refuses indices that do not stack its frames (an ERROR, counted, and it goes on serving), stores the rest
and samples exact stacks; an Atari run's largest messages are what a transport is checked against
before the run; and every transport here carries an Atari run's messages (a framed INSERT of 128
transitions, a BATCH of 32 stacked ones, the Nature CNN's 6.7 MB of weights) through a real replay node.
Frames of 4 x 12 x 12 where the size does not matter."""

from __future__ import annotations

import contextlib
import multiprocessing
import threading
import time

import numpy as np
import pytest

from rlbench import get_registry, plugins
from rlbench.config import RunConfig
from rlbench.errors import InvalidCombinationError
from rlbench.hookspecs import hookimpl
from rlbench.kit.access import replay_node
from rlbench.kit.bench import image_transitions
from rlbench.kit.networks import nature_cnn
from rlbench.protocols import EnvSpec, TransportCapabilities
from rlbench.runtime import transitions
from rlbench.runtime.distributed import messages
from rlbench.runtime.distributed.channel import Channel, RemoteError
from rlbench.runtime.distributed.messages import Op, WireError, decode, joined, python_decode, python_encode
from rlbench.runtime.distributed.rate_limiter import RateLimiter
from rlbench.runtime.distributed.replay_client import ReplayClient
from rlbench.runtime.distributed.replay_node import NodeSettings, ReplayNode

SMALL = (12, 12)
STACK = 4
ATARI = EnvSpec(id="ALE/Breakout-v5", num_envs=1, observation_shape=(STACK, 84, 84), observation_dtype="uint8",
                action_kind="discrete", n_actions=4, frame_stack=STACK)
SECRET = b"i" * 32


def small_spec(stack: int = STACK) -> EnvSpec:
    shape = (stack, *SMALL) if stack > 1 else SMALL
    return EnvSpec(id="small-frames", num_envs=1, observation_shape=shape, observation_dtype="uint8",
                   action_kind="discrete", n_actions=3, frame_stack=stack if stack > 1 else 0)


def small_rows(rows: int, seed: int, stack: int = STACK) -> dict[str, np.ndarray]:
    return image_transitions(rows, seed, frame_shape=SMALL, stack=stack, episode_steps=(5, 30))


def insert_arrays(rows: dict[str, np.ndarray], stack: int = 0) -> dict[str, np.ndarray]:
    """An INSERT's arrays as an actor sends them (framed when `stack`)."""
    from rlbench.runtime.distributed.replay_client import _insert

    return _insert(rows, None, len(rows["reward"]), stack)


def both_codecs(op, arrays):
    """The message's bytes and decoded arrays: the native and the Python codec must agree exactly."""
    native, python = joined(messages.encode(op, arrays, 9)), joined(python_encode(op, arrays, 9))
    assert native == python
    decoded, python_decoded = decode(native), python_decode(native)
    assert decoded[:2] == python_decoded[:2] == (op, 9) and list(decoded[2]) == list(python_decoded[2])
    for name, array in decoded[2].items():
        assert array.dtype == python_decoded[2][name].dtype
        np.testing.assert_array_equal(array, python_decoded[2][name])
    return native, decoded[2]


# ------------------------------------------------------------------------------------------- wire
def test_uint8_inserts_and_batches_keep_their_dtype_through_both_codecs():
    assert messages.NATIVE is not None, messages.NATIVE_REASON
    rows = small_rows(16, seed=1)
    _, stacked = both_codecs(Op.INSERT, insert_arrays(rows))
    _, framed = both_codecs(Op.INSERT, insert_arrays(rows, STACK))
    batch = {**{k: v for k, v in insert_arrays(rows).items() if k != "produced"}, "indices": np.arange(16),
             "weights": np.ones(16, np.float32), "step": np.int64(3)}
    _, drawn = both_codecs(Op.BATCH, batch)
    for arrays in (stacked, drawn, messages.stacked(framed)):
        for name in ("obs", "next_obs"):
            assert arrays[name].dtype == np.uint8
            np.testing.assert_array_equal(arrays[name], rows[name])
    assert framed["frames"].dtype == np.uint8 and framed["obs_frames"].shape == (16, STACK)
    # other integer observations travel as they are too (the run's layout, not the wire, says which)
    counts = rows["obs"].astype(np.int16)
    _, decoded = both_codecs(Op.INSERT, {**insert_arrays(rows), "obs": counts, "next_obs": counts})
    assert decoded["obs"].dtype == np.int16


def test_an_atari_chunk_framed_is_several_times_smaller_than_stacked():
    rows = image_transitions(128, seed=2)
    stacked, _ = both_codecs(Op.INSERT, insert_arrays(rows))
    framed, decoded = both_codecs(Op.INSERT, insert_arrays(rows, STACK))
    distinct = len(np.unique(np.concatenate([rows["obs"], rows["next_obs"]]).reshape(-1, 84 * 84), axis=0))
    assert len(decoded["frames"]) == distinct  # each frame once
    assert len(stacked) / len(framed) > 7  # 7.2 MB against ~0.9 MB
    for name in ("obs", "next_obs"):
        np.testing.assert_array_equal(messages.stacked(decoded)[name], rows[name])


@pytest.mark.parametrize("change, error", [
    (lambda a, r: {**a, "obs": r["obs"], "next_obs": r["next_obs"]}, "INSERT carries obs and frames"),
    (lambda a, r: {k: v for k, v in a.items() if k != "next_obs_frames"}, "INSERT lacks next_obs_frames"),
    (lambda a, r: {**a, "obs_frames": a["obs_frames"].astype(np.float32)}, "obs_frames has dtype float32"),
    (lambda a, r: {**a, "frames": a["frames"].reshape(-1)}, r"frames must be frames \(count, \*frame\)"),
    (lambda a, r: {**a, "obs_frames": a["obs_frames"][:-1]}, "obs_frames has 7 rows, other arrays 8"),
    (lambda a, r: {**a, "next_obs_frames": a["next_obs_frames"][:, :3]}, "must have the same shape"),
])
def test_a_framed_insert_that_breaks_the_schema_is_refused_at_decode_by_both_codecs(change, error):
    rows = small_rows(8, seed=3)
    message = joined(python_encode(Op.INSERT, change(insert_arrays(rows, STACK), rows), 5))
    for codec in (decode, python_decode):
        with pytest.raises(WireError, match=error) as refused:
            codec(message)
        assert refused.value.request_id == 5


def test_a_batch_of_shifted_stacks_travels_as_one_array_and_arrives_as_the_same_views():
    rng = np.random.default_rng(6)
    for k in (STACK, 1):
        base = rng.integers(0, 256, (16, k + 1, *SMALL), dtype=np.uint8)
        obs, next_obs = (base[:, 0], base[:, 1]) if k == 1 else (base[:, :k], base[:, 1:])
        assert messages.shifted_stacks(obs, next_obs) is base
        rows = small_rows(16, seed=7)
        batch = {**{name: rows[name] for name in ("action", "reward", "done")}, "stacks": base,
                 "indices": np.arange(16), "weights": np.ones(16, np.float32), "step": np.int64(0)}
        _, decoded = both_codecs(Op.BATCH, batch)
        got = messages.unshifted(decoded)
        np.testing.assert_array_equal(got["obs"], obs)
        np.testing.assert_array_equal(got["next_obs"], next_obs)
        assert all(np.shares_memory(got[name], decoded["stacks"]) for name in ("obs", "next_obs"))  # views again
    base = rng.integers(0, 256, (16, STACK + 1, *SMALL), dtype=np.uint8)
    for obs, next_obs in [(base[:, :STACK].copy(), base[:, 1:]), (base[:, :STACK], base[:, :STACK]),
                          (base[:8, :STACK], base[:8, 1:]), (base[:, 1:], base[:, :STACK])]:
        assert messages.shifted_stacks(obs, next_obs) is None  # anything else travels as obs and next_obs
    with pytest.raises(WireError, match=r"expected \(rows, k \+ 1, \*frame\)"):
        both_codecs(Op.BATCH, {**batch, "stacks": base[:, :1]})


# ---------------------------------------------------------------------------------- replay node
@contextlib.contextmanager
def node_serving(memory, *, layout=None, frames=STACK, transport="tcp", prioritized=False):
    """A replay node serving `memory` in a thread; (its listener's transport, the node)."""
    transport = get_registry().get("transport", transport).create()
    listener = transport.listen(None)
    settings = NodeSettings(placement="server", total_steps=10**9, batch_size=8, secret=SECRET, layout=layout,
                            frames=frames)
    node = ReplayNode(listener, memory, RateLimiter(1.0, 1, 1e9), settings, prioritized=prioritized)
    thread = threading.Thread(target=node.serve, daemon=True)
    thread.start()
    channels = []

    def client(role, frames=0):
        channel = Channel(transport.connect(listener.address, timeout=10), timeout=10)
        channel.authenticate(role, 0, messages.role_key(SECRET, role, 0))
        channels.append(channel)
        return ReplayClient(channel, frames=frames)

    try:
        yield client, node
    finally:
        client("launcher").channel.request(Op.SHUTDOWN)
        thread.join(10)
        for channel in channels:
            channel.close()
        listener.close()
        assert not thread.is_alive()


def small_memory(frames: bool):
    """The core's uniform memory, storing each frame once (frames=k, as a run's node builds it) or not."""
    component = get_registry().get("replay", "uniform")
    if frames:
        return transitions.make_memory(component, small_spec(), capacity=1000, alpha=0.6, seed=0, options={})
    return component.create(capacity=1000, alpha=0.6, seed=0)


@pytest.mark.parametrize("stores_frames, framed", [(True, True), (False, True), (True, False), (False, False)],
                         ids=["framed-into-frames", "framed-into-stacks", "stacked-into-frames", "stacked-into-stacks"])
def test_the_node_stores_image_inserts_and_samples_exact_stacks(stores_frames, framed):
    """Framed INSERTs go to a memory that stores frames as they came (add_packed) and to any other as
    the stacks rebuilt; stacked uint8 INSERTs go through the node's native fast path where it serves."""
    memory = small_memory(stores_frames)
    chunks = [small_rows(40, seed=seed) for seed in range(5)]
    everything = {name: np.concatenate([chunk[name] for chunk in chunks]) for name in chunks[0]}
    with node_serving(memory, layout=transitions.transition_layout(small_spec())) as (client, node):
        actor, learner = client("actor", frames=STACK if framed else 0), client("learner")
        for chunk in chunks:
            actor.add(chunk)
        for _ in range(5):
            sample = learner.sample(64, 0.4)
            for name in transitions.FIELDS:
                got = sample.transitions[name]
                assert got.dtype == everything[name].dtype
                np.testing.assert_array_equal(got, everything[name][sample.indices])
        assert node.state.stored == 200 and len(memory) == 200
        assert node.packed_frames == (STACK if stores_frames else 0)  # which memory takes the frames as they come
        _, reply = learner.channel.request(Op.SAMPLE, {"batch_size": 16, "beta": 0.4})
        # a memory of frames samples shifted stacks: a row's 5 frames travel once, not 8
        assert ("stacks" in reply) == stores_frames and ("obs" in reply) != stores_frames
        if not (framed or stores_frames):  # uint8 columns on the fast path: all but the first INSERT (general)
            assert node.fast is not None and node.fast.handled["INSERT"] == len(chunks) - 1
    if stores_frames:  # the memory holds each distinct frame once
        distinct = len(np.unique(np.concatenate([everything["obs"], everything["next_obs"]]).reshape(-1, 144), axis=0))
        assert memory.stats()["frames"]["frames_held"] == distinct


def test_malformed_framed_inserts_are_refused_counted_and_the_node_keeps_serving():
    rows = small_rows(8, seed=4)
    good = insert_arrays(rows, STACK)
    count = len(good["frames"])
    beyond = good["obs_frames"].copy()
    beyond[3, 2] = count
    negative = good["next_obs_frames"].copy()
    negative[0, 0] = -1
    wrong_shape = np.zeros((count, 12, 13), np.uint8)
    three = small_rows(8, seed=4, stack=3)
    bad = [
        ({**good, "obs_frames": beyond}, f"obs_frames refers to frame {count}, but the message carries {count} frames"),
        ({**good, "next_obs_frames": negative}, "next_obs_frames refers to frame -1"),
        (insert_arrays(three, 3), "obs_frames stacks 3 frames per observation, but this run's observations are 4"),
        ({**good, "frames": wrong_shape}, r"obs is uint8\[4, 12, 13\] per row, but this run's transitions carry "
                                          r"uint8\[4, 12, 12\]"),
        ({**good, "obs_frames": good["obs_frames"][:, :0], "next_obs_frames": good["obs_frames"][:, :0]},
         "obs_frames has no frame per observation"),
    ]
    with node_serving(small_memory(True), layout=transitions.transition_layout(small_spec())) as (client, node):
        actor, learner = client("actor"), client("learner")
        for arrays, error in bad:
            with pytest.raises(RemoteError, match=error):
                actor.channel.request(Op.INSERT, arrays)
        actor.channel.request(Op.INSERT, good)  # still serving: the good one is stored
        sample = learner.sample(8, 0.4)
        np.testing.assert_array_equal(sample.transitions["obs"], rows["obs"][sample.indices])
        counters = node.recorder.counters
        assert counters["refused.frames"] == 4 and counters["refused.layout"] == 1
        assert node.state.stored == 8 and len(node.memory) == 8


# ------------------------------------------------------------------------------- largest messages
def nature_weights(rng=None):
    shapes = nature_cnn(ATARI.observation_shape, ATARI.n_actions).weight_shapes()
    rng = rng or np.random.default_rng(0)
    return [rng.standard_normal(shape, dtype=np.float32) for shape in shapes]


def test_an_atari_runs_largest_messages_are_the_weights_then_the_framed_insert_then_the_batch():
    network = nature_cnn(ATARI.observation_shape, ATARI.n_actions)
    sizes = messages.message_sizes(ATARI, network.weight_shapes(), insert_rows=128, batch_size=32, frames=STACK)
    frame, overhead = 84 * 84, 2048  # headers, descriptors, padding, scalars: well under 2 KB
    weights = 4 * network.parameters()
    assert weights <= sizes["PARAMS (the policy's weights)"] < weights + overhead  # 6.7 MB
    framed = 128 * (STACK + 1) * frame + 2 * 128 * STACK * 4 + 128 * (8 + 4 + 4 + 8)  # frames, refs, the rest
    assert framed <= sizes["INSERT"] < framed + overhead
    batch = 32 * (2 * STACK * frame + 8 + 4 + 4 + 8 + 4)
    assert batch <= sizes["BATCH"] < batch + overhead  # 1.8 MB
    assert messages.largest_message(ATARI, network.weight_shapes(), insert_rows=128, batch_size=32,
                                    frames=STACK)[0] == "PARAMS (the policy's weights)"
    stacked = messages.message_sizes(ATARI, [], insert_rows=128, batch_size=32)["INSERT"]
    assert stacked > 2 * 128 * STACK * frame > sizes["INSERT"]  # what it would be without frames: 7.2 MB


class NarrowTcp:
    """tcp under another name, whose run options lower what it carries and what it queues for a peer."""

    @hookimpl
    def rlbench_register_transports(self, register):
        register("narrow", "rlbench.builtin.transports.tcp:TcpTransport",
                 capabilities=TransportCapabilities(max_message_bytes=1 << 31, reliable=True, ordered=True,
                                                    crosses_processes=True, crosses_hosts=True))

    @hookimpl
    def rlbench_register_run_options(self, option):
        option("transport", "narrow", "--narrow-max-message-bytes", "max_message_bytes", type=int)
        option("transport", "narrow", "--narrow-max-queued-bytes", "max_queued_bytes", type=int)


def test_an_atari_run_is_refused_before_it_starts_by_a_transport_too_small_naming_the_option_to_raise():
    from rlbench.runner import check
    from rlbench.validate import options_from_flags

    registry, _ = plugins.build([("narrow", NarrowTcp())], load_entry_points=False)
    config = RunConfig(env="ALE/Breakout-v5", placement="server", transport="narrow", actors=2, eval_episodes=0)
    config.options = options_from_flags({"narrow-max-message-bytes": 4 << 20}, config, registry)
    with pytest.raises(InvalidCombinationError, match=r"largest message, PARAMS \(the policy's weights\), is "
                                                      r"6,7\d\d,\d\d\d bytes; raise --narrow-max-message-bytes to "
                                                      r"at least 6,7\d\d,\d\d\d"):
        check(config, registry)
    config.options = options_from_flags({"narrow-max-message-bytes": 8 << 20}, config, registry)
    check(config, registry)  # the Nature CNN's weights fit
    # in network, the batches pushed ahead of the learner must fit what the transport queues for it
    config.placement = "in-network"
    config.options = options_from_flags({"narrow-max-queued-bytes": 3 << 20}, config, registry)
    with pytest.raises(InvalidCombinationError, match=r"pushes up to 2 batches of 1,8\d\d,\d\d\d bytes.*raise "
                                                      r"--narrow-max-queued-bytes to at least 3,6\d\d,\d\d\d"):
        check(config, registry)
    config.options = options_from_flags({"narrow-max-queued-bytes": 4 << 20}, config, registry)
    check(config, registry)


def test_a_default_atari_run_passes_every_transport_here_before_it_starts():
    from rlbench.runner import check

    registry = get_registry()
    checked = []
    for name in registry.names("transport"):
        component = registry.get("transport", name)
        if not (component.capabilities.crosses_processes and component.probe().available):
            continue
        for placement in ("server", "in-network"):
            check(RunConfig(env="ALE/Breakout-v5", placement=placement, transport=name, actors=2, eval_episodes=0),
                  registry)
        checked.append(name)
    assert {"shm", "tcp", "udp"} <= set(checked)


# ------------------------------------------------------------------- an Atari run's messages, carried
def atari_round_trip(transport: str, options: dict) -> None:
    """A real replay node over `transport` (its own process) storing frames once: an actor's framed
    INSERT of 128 Atari transitions, the learner's SAMPLE of 32 stacked ones (exact), and the Nature
    CNN's 6.7 MB of weights published by the learner and fetched by the actor (exact)."""
    rows = image_transitions(128, seed=5)
    layout = transitions.transition_layout(ATARI)
    with replay_node(transport, transport_options=options, replay="prioritized", capacity=256, frames=STACK,
                     layout=layout, timeout=60) as node:
        node.actor.add(rows)
        sample = node.learner.sample(32, 0.4)
        for name in transitions.FIELDS:
            np.testing.assert_array_equal(sample.transitions[name], rows[name][sample.indices])
        assert sample.transitions["obs"].dtype == np.uint8
        weights = nature_weights()
        node.learner.publish_params(weights, 7)  # one way: the actor asks until the node has them
        deadline = time.monotonic() + 30
        while (fetched := node.actor.fetch_params(-1)) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert fetched is not None and fetched[0] == 7
        assert all(np.array_equal(a, b) for a, b in zip(fetched[1], weights))
        report = node.report()
        assert report["stored"] == 128 and report["memory"]["frames"]["frames_held"] <= 128 * 2
        received = report["link"]["bytes_received"]
        assert received > sum(w.nbytes for w in weights) + 128 * 84 * 84  # what came in: the weights, the frames


def _in_a_process_of_its_own(transport: str, options: dict, failures) -> None:
    try:
        atari_round_trip(transport, options)
    except BaseException as exc:  # handed to the test
        failures.put(f"{type(exc).__name__}: {exc}")
        raise
    failures.put("")


@pytest.mark.parametrize("transport", ["shm", "tcp", "udp", "uds"])
def test_every_transport_carries_an_atari_runs_messages_through_a_replay_node(transport):
    component = get_registry().get("transport", transport)
    if not component.probe().available:
        pytest.skip(component.probe().reason)
    atari_round_trip(transport, {})


def test_ray_carries_an_atari_runs_messages_through_a_replay_node():
    """In a process of its own: the clients join the Ray the node's listener starts, which this test
    process must not stay connected to."""
    pytest.importorskip("ray", reason="Ray is not installed (scripts/setup.sh installs it)")
    context = multiprocessing.get_context("spawn")
    failures = context.Queue()
    process = context.Process(target=_in_a_process_of_its_own, args=("ray", {}, failures))
    process.start()
    try:
        outcome = failures.get(timeout=180)
    finally:
        process.join(60)
        if process.is_alive():
            process.kill()
    assert outcome == "", outcome


# ------------------------------------------------------------------------------------------ benches
def test_bench_transport_puts_image_sample_replies_beside_a_stream_of_messages_of_their_size():
    import json

    from click.testing import CliRunner

    from rlbench.bench.transport import command

    result = CliRunner().invoke(command, ["--transport", "shm", "--transport", "tcp", "--sizes", "64",
                                          "--seconds", "0.1", "--json"])
    assert result.exit_code == 0, result.output
    batch = messages.message_sizes(ATARI, [], insert_rows=1, batch_size=32)["BATCH"]
    for name, entry in json.loads(result.output)["transports"].items():
        image = entry["image"]
        assert image["reply_bytes"] == batch and image["replies"] > 0, name
        assert image["replies_mb_per_s"] > 0 and image["stream_mb_per_s"] > 0
        assert image["stream_vs_replies"] == pytest.approx(image["stream_mb_per_s"] / image["replies_mb_per_s"])


def test_bench_access_puts_image_inserts_and_sample_replies_beside_streams_of_their_sizes():
    import json

    from click.testing import CliRunner

    from rlbench.bench.access import IMAGE_STORED, command

    result = CliRunner().invoke(command, ["--transport", "tcp", "--requests", "100", "--seconds", "0.1", "--json"])
    assert result.exit_code == 0, result.output
    image = json.loads(result.output)["transports"]["tcp"]["image"]
    stacked = messages.message_sizes(ATARI, [], insert_rows=128, batch_size=32)
    assert image["stacked_bytes"] == {"INSERT": stacked["INSERT"], "SAMPLE": stacked["BATCH"]}
    assert image["bytes"]["INSERT"] < stacked["INSERT"] / 7  # each frame once: ~0.9 MB of 7.2
    assert image["bytes"]["SAMPLE"] < stacked["BATCH"] * 5 / 8 + 2048  # each row's 5 frames once: 1.1 MB of 1.8
    assert image["memory"]["size"] == IMAGE_STORED and image["memory"]["frames"]["frames_held"] < 2 * IMAGE_STORED
    for op in ("INSERT", "SAMPLE"):
        row = image["ops"][op]
        assert row["requests"] > 0 and row["mb_per_s"] > 0 and row["stream_mb_per_s"] > 0
