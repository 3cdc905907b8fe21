"""Replay gpu on the CPU device: the conformance kit, and agreement with the core's prioritized memory."""

import numpy as np
import pytest
import torch

import rlbench
from rlbench.errors import RlbenchError
from rlbench.testing import check_replay_memory
from rlbench_gpu.replay import GpuPrioritizedReplay


def make(capacity, **kw):
    return GpuPrioritizedReplay(capacity, alpha=kw.pop("alpha", 0.6), seed=kw.pop("seed", 0), device="cpu", **kw)


def rows(n, start=0):
    items = np.arange(start, start + n)
    return {"obs": (items[:, None] + np.zeros((1, 4))).astype(np.float32), "action": items.astype(np.int64),
            "done": (items % 2).astype(np.float32)}


def test_conformance_kit_on_the_cpu_device():
    report = check_replay_memory(lambda capacity, **options: make(capacity, **options))
    assert report["prioritized"] and min(report["p_values"]) >= 1e-6
    assert set(report["frames"]) == {"frames=4", "frames=1"}  # frames stored once on the device, exactly


def test_priorities_and_weights_match_the_core_memory_after_the_same_calls():
    rng = np.random.default_rng(3)
    ours = make(1000, alpha=0.7)
    core = rlbench.get_registry().get("replay", "prioritized").create(capacity=1000, alpha=0.7, seed=0)
    first = rng.exponential(1.0, 700)
    for memory in (ours, core):
        memory.add(rows(700), first)
    for _ in range(5):  # overwrite past the end (FIFO), then updates with repeated indices
        batch, priorities = rows(300), rng.exponential(2.0, 300)
        assert np.array_equal(ours.add(batch, priorities), core.add(batch, priorities))
        indices = rng.integers(0, 1000, 400)
        new = rng.exponential(1.0, 400)
        ours.update_priorities(indices, new)
        core.update_priorities(indices, new)
    assert np.allclose(ours.priorities(np.arange(1000)), core.priorities(np.arange(1000)), rtol=1e-6)  # the C tree computes p**alpha in float32
    ours_stats, core_stats = ours.stats(), core.stats()
    for key in ("size", "total_priority", "min_priority", "max_priority_seen"):
        assert ours_stats[key] == pytest.approx(core_stats[key], rel=1e-6), key
    sample = ours.sample(512, beta=0.5)
    scaled = ours.priorities(sample.indices)
    assert np.allclose(sample.weights, (scaled / core_stats["min_priority"]) ** -0.5, rtol=1e-5)
    assert np.array_equal(sample.transitions["action"] % 1000, sample.transitions["action"])


def test_torch_tensors_in_and_numpy_out_on_the_cpu_device():
    memory = make(64)
    batch = {k: torch.from_numpy(v) for k, v in rows(40).items()}
    memory.add(batch, torch.full((40,), 2.0))
    memory.update_priorities(torch.tensor([1, 1, 2]), torch.tensor([5.0, 0.0, 3.0]))  # last wins: 1 -> 0
    assert memory.priorities([1, 2]) == pytest.approx([0.0, 3.0 ** 0.6])
    sample = memory.sample(256)
    assert isinstance(sample.indices, np.ndarray) and isinstance(sample.transitions["obs"], np.ndarray)
    assert 1 not in sample.indices  # zero priority: never sampled
    assert np.array_equal(sample.transitions["action"], sample.indices)
    with pytest.raises(RlbenchError, match="index 64 out of range"):
        memory.update_priorities(torch.tensor([64]), torch.tensor([1.0]))
    with pytest.raises(RlbenchError, match="indices must be integers"):
        memory.update_priorities(torch.tensor([1.5]), torch.tensor([1.0]))


def test_all_zero_priorities_are_refused_at_sample_time():
    memory = make(16)
    memory.add(rows(4), np.zeros(4))
    with pytest.raises(RlbenchError, match="every stored priority is zero"):
        memory.sample(2)


def test_a_batch_longer_than_the_memory_keeps_its_last_items():
    memory = make(8)
    indices = memory.add(rows(20))
    assert len(memory) == 8 and indices.tolist() == [i % 8 for i in range(20)]
    items = memory.sample(200).transitions["action"]
    assert set(items.tolist()) == set(range(12, 20))


def test_tree_layout_covers_odd_capacities():
    for capacity in (1, 2, 3, 17, 1000, 4097):
        memory = make(capacity)
        assert memory.n_blocks * memory.block >= capacity
        memory.add(rows(capacity))
        assert set(memory.sample(max(64, 4 * capacity)).indices.tolist()) <= set(range(capacity))


def test_refusals_say_what_is_wrong_in_one_line_and_change_nothing():
    memory = make(16, alpha=1.0)
    memory.add(rows(8), np.ones(8))
    refusals = [
        (lambda: memory.add({**rows(2), "obs": torch.zeros((2, 4), dtype=torch.float64)}),
         r"field 'obs': got float64\[2, 4\], but this memory stores float32 rows of shape \[4\] \(set by the first add\)"),
        (lambda: memory.add({"obs": torch.zeros((2, 4))}), r"add\(\) needs exactly the fields \['action', 'done', 'obs'\]"),
        (lambda: memory.add(rows(2), torch.tensor([1.0, -1.0])), r"add: priority -1.0 is invalid"),
        (lambda: memory.update_priorities(torch.tensor([1, 2]), torch.tensor([1.0, float("nan")])),
         r"update_priorities: priority nan is invalid: priorities must be finite and >= 0"),
        (lambda: memory.update_priorities(torch.tensor([1, 2]), torch.tensor([1.0])),
         r"update_priorities: got 2 indices but 1 priorities"),
        (lambda: memory.update_priorities(np.array([8]), np.array([1.0])),
         r"update_priorities: index 8 out of range for a memory holding 8 items"),
        (lambda: memory.sample(4, beta=1.5), r"beta must lie in \[0, 1\]"),
    ]
    for refuse, message in refusals:
        with pytest.raises(RlbenchError, match=message) as error:
            refuse()
        assert "\n" not in str(error.value)
    assert len(memory) == 8 and memory.stats()["adds"] == 8
    assert memory.priorities(np.arange(8)) == pytest.approx(np.ones(8))


def test_a_refused_first_batch_does_not_fix_the_layout():
    memory = make(16)
    with pytest.raises(RlbenchError, match="has dtype bfloat16; this memory stores float32, float64"):
        memory.add({"obs": torch.zeros((2, 4), dtype=torch.bfloat16)})
    with pytest.raises(RlbenchError, match="add: got 3 indices but 2 priorities"):
        memory.add(rows(3), np.ones(2))
    memory.add({"obs": torch.zeros((2, 4), dtype=torch.float16)})
    assert memory.stats()["fields"] == {"obs": "float16[4]"}
