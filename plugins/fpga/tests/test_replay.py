"""The fpga replay memory, run for real on the chosen OpenCL device (PoCL in CI)."""

import numpy as np
import pytest

from rlbench import get_registry
from rlbench.errors import RlbenchError
from rlbench.testing import check_replay_memory
from rlbench_fpga.replay import FpgaReplay, tree_shape


@pytest.mark.parametrize("fanout, depth, alpha", [(16, None, 0.6), (2, None, 0.5), (3, 6, 1.0)])
def test_conformance_kit(fanout, depth, alpha):
    report = check_replay_memory(lambda capacity: FpgaReplay(capacity, alpha=alpha, seed=3, fanout=fanout, depth=depth))
    assert report["prioritized"] and min(report["p_values"]) >= 1e-6


def test_registered_factory_builds_the_memory():
    memory = get_registry().get("replay", "fpga").create(capacity=100, alpha=0.6, seed=0, fanout=4)
    assert isinstance(memory, FpgaReplay) and memory.depth == 4 and memory.capabilities.device == "opencl"


def test_tree_shape_and_refusals():
    assert tree_shape(1_000_000, 16, None)[0] == 5
    assert tree_shape(17, 4, None)[1] == [0, 16, 32, 48]  # levels start on 64-byte lines
    with pytest.raises(RlbenchError, match="depth 2 gives 16 leaves"):
        FpgaReplay(100, fanout=4, depth=2)
    with pytest.raises(RlbenchError, match="fanout must be at least 2"):
        FpgaReplay(100, fanout=1)


def _cartpole(rng, n):
    return {"obs": rng.standard_normal((n, 4)).astype(np.float32), "action": rng.integers(0, 2, n),
            "done": rng.random(n) < 0.1}


def test_priorities_match_a_float64_reference_after_many_updates():
    rng = np.random.default_rng(0)
    memory = FpgaReplay(5000, alpha=0.6, seed=0, fanout=8)
    raw = rng.exponential(1.0, 5000)
    memory.add(_cartpole(rng, 5000), raw)
    for _ in range(20):
        indices = rng.integers(0, 5000, 256)
        priorities = rng.exponential(1.0, 256)
        memory.update_priorities(indices, priorities)
        for index, priority in zip(indices, priorities):  # in order: a repeated index keeps its last value
            raw[index] = priority
    expected = raw ** 0.6
    got = memory.priorities(np.arange(5000))
    assert np.max(np.abs(got - expected) / expected) < 1e-5
    stats = memory.stats()
    assert stats["total_priority"] == pytest.approx(expected.sum(), rel=1e-4)
    assert stats["min_priority"] == pytest.approx(expected.min(), rel=1e-5)


def test_duplicate_indices_resolve_to_the_last_priority():
    memory = FpgaReplay(16, alpha=1.0, seed=0, fanout=2)
    memory.add(_cartpole(np.random.default_rng(1), 16), np.ones(16))
    memory.update_priorities(np.array([3, 5, 3, 3]), np.array([7.0, 2.0, 9.0, 4.0]))
    np.testing.assert_allclose(memory.priorities(np.array([3, 5])), [4.0, 2.0])


def test_sampled_rows_and_weights_come_back_from_the_device():
    rng = np.random.default_rng(2)
    memory = FpgaReplay(1000, alpha=0.6, seed=0)
    batch = _cartpole(rng, 1000)
    memory.add(batch, rng.exponential(1.0, 1000) + 0.01)
    sample = memory.sample(256, 0.4)
    np.testing.assert_array_equal(sample.transitions["obs"], batch["obs"][sample.indices])
    np.testing.assert_array_equal(sample.transitions["done"], batch["done"][sample.indices])
    scaled = memory.priorities(np.arange(1000))
    np.testing.assert_allclose(sample.weights, (scaled[sample.indices] / scaled.min()) ** -0.4, rtol=1e-5)


def test_a_priority_beyond_float32_is_refused_and_nothing_changes():
    memory = FpgaReplay(8, alpha=1.0, seed=0, fanout=2)
    memory.add(_cartpole(np.random.default_rng(6), 4), np.ones(4))
    with pytest.raises(RlbenchError, match=r"priority 1e\+39 is invalid: the device stores float32 priorities"):
        memory.update_priorities(np.array([0, 1]), np.array([2.0, 1e39]))
    with pytest.raises(RlbenchError, match="float32"):
        memory.add(_cartpole(np.random.default_rng(7), 2), np.array([1e39, 1.0]))
    assert len(memory) == 4 and memory.stats()["max_priority_seen"] == 1.0
    np.testing.assert_allclose(memory.priorities(np.arange(4)), np.ones(4))


def test_a_refused_first_batch_does_not_fix_the_layout():
    memory = FpgaReplay(8, alpha=1.0, seed=0, fanout=2)
    with pytest.raises(RlbenchError, match="got 3 indices but 2 priorities"):
        memory.add(_cartpole(np.random.default_rng(8), 3), np.ones(2))
    assert memory.record_bytes == 0 and memory.stats()["fields"] == {}
    memory.add({"obs": np.zeros((2, 3), dtype=np.float16)})  # 6 bytes, padded to two 32-bit words
    assert memory.record_bytes == 8 and memory.stats()["fields"] == {"obs": "float16[3]"}
    np.testing.assert_array_equal(memory.sample(4).transitions["obs"], np.zeros((4, 3), dtype=np.float16))


def test_every_priority_zero_is_refused_with_one_line():
    memory = FpgaReplay(8, alpha=0.6, seed=0)
    memory.add(_cartpole(np.random.default_rng(3), 4), np.zeros(4))
    with pytest.raises(RlbenchError, match="every stored priority is zero"):
        memory.sample(4)


def test_updates_from_several_calls_reach_the_next_sample_in_call_order():
    memory = FpgaReplay(64, alpha=1.0, seed=0, fanout=4)
    memory.add(_cartpole(np.random.default_rng(4), 64), np.ones(64))
    memory.update_priorities(np.array([3, 5, 9]), np.array([7.0, 2.0, 5.0]))
    memory.update_priorities(np.array([3, 9]), np.array([0.5, 0.0]))  # 3 ends at 0.5; 9 at zero
    expected = np.ones(64)
    expected[[3, 5, 9]] = [0.5, 2.0, 0.0]
    sample = memory.sample(64, beta=1.0)  # its kernel applies both updates before it samples
    assert 9 not in sample.indices
    np.testing.assert_allclose(sample.weights, (expected[sample.indices] / 0.5) ** -1.0, rtol=1e-5)
    np.testing.assert_allclose(memory.priorities(np.arange(64)), expected, rtol=1e-6)
    assert memory.stats()["min_priority"] == pytest.approx(0.5)  # the zero is not the minimum


def test_an_add_that_wraps_around_keeps_sum_and_minimum_exact():
    rng = np.random.default_rng(5)
    memory = FpgaReplay(100, alpha=0.5, seed=0, fanout=4)
    first, second = rng.exponential(1.0, 70) + 0.1, rng.exponential(1.0, 60) + 0.1
    memory.add(_cartpole(rng, 70), first)
    memory.add(_cartpole(rng, 60), second)  # slots 70..99, then 0..29
    expected = np.concatenate([second[30:], first[30:], second[:30]]) ** 0.5
    np.testing.assert_allclose(memory.priorities(np.arange(100)), expected, rtol=1e-6)
    stats = memory.stats()
    assert stats["total_priority"] == pytest.approx(expected.sum(), rel=1e-5)
    assert stats["min_priority"] == pytest.approx(expected.min(), rel=1e-6)


def test_image_observations_are_stored_whole_and_frames_once_is_refused():
    from rlbench_fpga.capabilities import REPLAY_CAPABILITIES

    assert not REPLAY_CAPABILITIES.frames  # a record per transition: frames are not shared
    memory = FpgaReplay(64, alpha=0.6, seed=0, fanout=4)
    stacks = np.random.default_rng(0).integers(0, 256, (16, 4, 12, 12), dtype=np.uint8)
    memory.add({"obs": stacks, "action": np.arange(16), "next_obs": stacks[::-1].copy()})
    sample = memory.sample(16)
    assert sample.transitions["obs"].dtype == np.uint8
    assert np.array_equal(sample.transitions["obs"], stacks[sample.indices])
    assert np.array_equal(sample.transitions["next_obs"], stacks[::-1][sample.indices])
    with pytest.raises(RlbenchError, match="not frames once .frames=4.: use --replay prioritized or uniform"):
        get_registry().get("replay", "fpga").create(capacity=64, alpha=0.6, seed=0, frames=4)
