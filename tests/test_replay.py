"""The core's replay memories, the C sum tree, the conformance check (and that it catches real
defects), and the benchmark's textbook baseline (`rlbench bench replay` itself: tests/test_benches.py)."""

from __future__ import annotations

import math
import sys
import types

import numpy as np
import pytest

from rlbench.kit.bench import SCALAR_UPDATE_MAX, cartpole_batch, numpy_sumtree_replay_class
from rlbench.builtin.replay import PrioritizedReplay, ReplayError, UniformReplay, probe_native
from rlbench.errors import RlbenchError
from rlbench.protocols import ReplayCapabilities, Sample
from rlbench.testing.replay import check_replay_memory, chi_square_sf


def cartpole(n: int, start: int = 0) -> dict[str, np.ndarray]:
    ids = np.arange(start, start + n)
    return {
        "obs": np.repeat(ids[:, None], 4, axis=1).astype(np.float32),
        "action": ids.astype(np.int64),
        "reward": ids.astype(np.float32),
        "done": (ids % 2).astype(np.float32),
    }


# -- conformance of the built-ins and the benchmark's baseline ------------------------------------------------
@pytest.mark.parametrize("factory", [
    lambda capacity, **options: UniformReplay(capacity, seed=0, **options),
    lambda capacity, **options: PrioritizedReplay(capacity, alpha=0.6, seed=0, **options),
    lambda capacity, **options: PrioritizedReplay(capacity, alpha=1.0, seed=None, **options),
    lambda capacity: numpy_sumtree_replay_class()(capacity, alpha=0.7, seed=3),
], ids=["uniform", "prioritized", "prioritized-alpha1-unseeded", "numpy-sumtree-baseline"])
def test_conformance(factory):
    report = check_replay_memory(factory)
    assert all(p >= 1e-6 for p in report["p_values"])


def test_conformance_through_the_registry():
    from rlbench import get_registry

    registry = get_registry()
    for name, prioritized in (("uniform", False), ("prioritized", True)):
        component = registry.get("replay", name)
        assert component.probe().available, component.probe().reason
        check_replay_memory(lambda capacity, **options: component.create(capacity=capacity, alpha=0.6, seed=1,
                                                                         **options), prioritized=prioritized)


def test_check_refuses_a_wrong_claim():
    with pytest.raises(AssertionError, match="prioritized=False, expected True"):
        check_replay_memory(lambda capacity: UniformReplay(capacity), prioritized=True)


# -- deliberately broken memories: the check must fail on each, for the right reason --------------------
class ClaimsPrioritizedSamplesUniformly(UniformReplay):
    capabilities = ReplayCapabilities(prioritized=True)


class IgnoresAlpha(PrioritizedReplay):
    """Says alpha=0.6, samples as if alpha were 1."""

    def __init__(self, capacity, **options):
        super().__init__(capacity, **{**options, "alpha": 1.0})
        self.alpha = 0.6


class UnnormalisedWeights(PrioritizedReplay):
    """Returns (N P(i))**-beta without dividing by the largest weight."""

    def sample(self, batch_size, beta=0.4):
        sample = super().sample(batch_size, beta)
        probability = self.priorities(sample.indices) / self._tree.total
        weights = ((len(self) * probability) ** -beta).astype(np.float32)
        return Sample(sample.indices, sample.transitions, np.minimum(weights, 1.0))


class NormalisesPerBatch(PrioritizedReplay):
    """Divides by the largest weight in the batch instead of over the whole memory."""

    def sample(self, batch_size, beta=0.4):
        sample = super().sample(batch_size, beta)
        return Sample(sample.indices, sample.transitions, sample.weights / sample.weights.max())


class RowsFromTheWrongIndex(PrioritizedReplay):
    """Off by one between the indices it reports and the rows it returns."""

    def sample(self, batch_size, beta=0.4):
        sample = super().sample(batch_size, beta)
        return Sample((sample.indices + 1) % len(self), sample.transitions, sample.weights)


class FirstWinsOnRepeats(PrioritizedReplay):
    """Keeps the first priority given for a repeated index."""

    def update_priorities(self, indices, priorities):
        indices, priorities = np.asarray(indices), np.asarray(priorities)
        if indices.shape != priorities.shape:
            return super().update_priorities(indices, priorities)
        _, first = np.unique(indices, return_index=True)
        super().update_priorities(indices[first], priorities[first])


class NewItemsGetOne(PrioritizedReplay):
    """Gives items added without priorities 1.0 instead of the largest priority seen."""

    def add(self, transitions, priorities=None):
        if priorities is None:
            priorities = np.ones(len(next(iter(transitions.values()))))
        return super().add(transitions, priorities)


class OverwritesNewest(UniformReplay):
    """When full, overwrites its newest item instead of the oldest."""

    def add(self, transitions, priorities=None):
        written = []
        for k in range(len(next(iter(transitions.values())))):
            if len(self) == self.capacity:
                self._cursor = self.capacity - 1
            one = {name: value[k:k + 1] for name, value in transitions.items()}
            written.append(super().add(one, None if priorities is None else priorities[k:k + 1]))
        return np.concatenate(written)


class ClampsNegativePriorities(PrioritizedReplay):
    def update_priorities(self, indices, priorities):
        super().update_priorities(indices, np.maximum(np.nan_to_num(np.asarray(priorities, float)), 0.0))


class RaisesPlainValueError(UniformReplay):
    def sample(self, batch_size, beta=0.4):
        if batch_size < 1:
            raise ValueError("batch_size must be positive")
        return super().sample(batch_size, beta)


class KeepsDtypeLoosely(UniformReplay):
    """Returns float64 rows for a float32 field."""

    def _gather(self, indices):
        rows = super()._gather(indices)
        rows["obs"] = rows["obs"].astype(np.float64)
        return rows


@pytest.mark.parametrize("broken, message", [
    (ClaimsPrioritizedSamplesUniformly, "do not follow the expected distribution"),
    (IgnoresAlpha, "do not follow the expected distribution"),
    (UnnormalisedWeights, "importance weights"),
    (NormalisesPerBatch, "importance weights"),
    (RowsFromTheWrongIndex, "is not the row stored there"),
    (FirstWinsOnRepeats, "after update_priorities"),
    (NewItemsGetOne, "after add"),
    (OverwritesNewest, "FIFO"),
    (ClampsNegativePriorities, "negative priority: accepted"),
    (RaisesPlainValueError, "expected an RlbenchError"),
    (KeepsDtypeLoosely, "field 'obs'"),
])
def test_check_catches_broken_memories(broken, message):
    with pytest.raises(AssertionError, match=message):
        check_replay_memory(lambda capacity: broken(capacity, alpha=0.6, seed=0))


def test_chi_square_survival_function_matches_closed_forms():
    # Even degrees of freedom have a closed form: Q(m, x/2) = e^(-x/2) sum_{i<m} (x/2)^i / i!.
    for dof in (2, 4, 10, 20):
        for statistic in (0.5, 3.0, dof + 0.0, 25.0, 80.0):
            half = statistic / 2
            exact = math.exp(-half) * sum(half**i / math.factorial(i) for i in range(dof // 2))
            assert chi_square_sf(statistic, dof) == pytest.approx(exact, rel=1e-9)
    assert chi_square_sf(30.1435, 19) == pytest.approx(0.05, rel=1e-4)  # table values
    assert chi_square_sf(36.1909, 19) == pytest.approx(0.01, rel=1e-4)
    assert chi_square_sf(3.841459, 1) == pytest.approx(0.05, rel=1e-5)


# -- behaviour of the built-ins ------------------------------------------------------------------------------
def test_storage_layout_is_fixed_by_the_first_add():
    memory = UniformReplay(10, seed=0)
    with pytest.raises(ReplayError, match="different batch lengths"):
        memory.add({"obs": np.zeros((2, 4), np.float32), "action": np.zeros(3, np.int64)})
    memory.add({"obs": np.zeros((2, 3), np.float64)})  # a refused first batch does not fix the layout
    with pytest.raises(ReplayError, match=r"field 'obs': got float32\[2, 3\].*float64 rows of shape \[3\]"):
        memory.add({"obs": np.zeros((2, 3), np.float32)})
    with pytest.raises(ReplayError, match="no leading batch axis"):
        UniformReplay(4).add({"reward": np.float32(1.0)})
    with pytest.raises(ReplayError, match="dtype object"):
        UniformReplay(4).add({"info": np.array([{}], dtype=object)})
    for bad in (0, -5, 2.5, True, "10"):
        with pytest.raises(ReplayError, match="capacity"):
            PrioritizedReplay(bad)
    with pytest.raises(ReplayError, match="alpha"):
        PrioritizedReplay(4, alpha=-1)


def test_batch_longer_than_capacity_keeps_its_last_items():
    memory = PrioritizedReplay(4, seed=0)
    memory.add(cartpole(3))
    indices = memory.add(cartpole(6, start=100), priorities=np.arange(1.0, 7.0))
    assert indices.tolist() == [3, 0, 1, 2, 3, 0]
    assert len(memory) == 4
    assert sorted(memory._columns["action"].tolist()) == [102, 103, 104, 105]
    slots = {int(a): i for i, a in enumerate(memory._columns["action"])}
    expected = np.array([3.0, 4.0, 5.0, 6.0]) ** 0.6  # the last priority for each slot
    assert memory.priorities(np.array([slots[a] for a in (102, 103, 104, 105)])) == pytest.approx(expected)
    assert memory.stats()["overwritten"] == 5


def test_seeded_memories_sample_the_same_items():
    def run(seed):
        memory = PrioritizedReplay(1000, seed=seed)
        memory.add(cartpole(1000), priorities=np.linspace(0.1, 5, 1000))
        return [memory.sample(32).indices.tolist() for _ in range(3)]

    assert run(7) == run(7)
    assert run(7) != run(8)
    uniform = [UniformReplay(100, seed=5) for _ in range(2)]
    for memory in uniform:
        memory.add(cartpole(100))
    assert uniform[0].sample(16).indices.tolist() == uniform[1].sample(16).indices.tolist()


def test_stratified_sampling_takes_one_item_per_segment():
    memory = PrioritizedReplay(64, seed=0)
    memory.add(cartpole(50))  # all at the default priority: equal segments of the mass
    assert memory.sample(50, 1.0).indices.tolist() == list(range(50))


def test_zero_priorities_are_never_sampled_and_do_not_set_the_normalisation():
    memory = PrioritizedReplay(16, alpha=1.0, seed=0)
    memory.add(cartpole(8), priorities=np.array([0, 2, 0, 4, 0, 0, 8, 0], dtype=np.float64))
    sample = memory.sample(3000, 1.0)
    assert set(sample.indices.tolist()) == {1, 3, 6}
    expected = {1: 1.0, 3: 0.5, 6: 0.25}  # (p / p_min) ** -1, p_min = 2 (zeros excluded)
    for index, weight in zip(sample.indices[:50], sample.weights[:50]):
        assert weight == pytest.approx(expected[int(index)], rel=1e-6)
    memory.update_priorities(np.array([1, 3, 6]), np.zeros(3))
    with pytest.raises(ReplayError, match="every stored priority is zero"):
        memory.sample(4)


def test_update_priorities_input_forms_and_errors():
    memory = PrioritizedReplay(100, alpha=0.5, seed=0)
    memory.add(cartpole(10))
    memory.update_priorities([1, 2], [4.0, 9.0])  # lists
    memory.update_priorities(np.array([[3], [4]], dtype=np.int32), np.array([[16.0], [25.0]], np.float32))
    memory.update_priorities(np.array([5, 5, 5]), np.array([1.0, 4.0, 36.0]))  # last one wins
    memory.update_priorities(np.arange(12)[::2][3:5], np.array([49.0, 64.0]))  # a strided view
    assert memory.priorities(np.array([1, 2, 3, 4, 5, 6, 8])) == pytest.approx([2, 3, 4, 5, 6, 7, 8], rel=1e-6)
    before = memory.priorities(np.arange(10))
    for indices, priorities, message in [
        ([10], [1.0], "index 10 out of range for a memory holding 10 items"),
        ([-1], [1.0], "index -1 out of range"),
        ([0, 1], [1.0], "2 indices but 1 priorities"),
        ([0, 1], [1.0, -2.0], "priority -2 at position 1"),
        ([0], [np.inf], "finite"),
        ([0.5], [1.0], "indices must be integers"),
        ([0], ["x"], "priorities must be numbers"),
        ([0], None, "priorities are required"),
    ]:
        with pytest.raises(ReplayError, match=message):
            memory.update_priorities(indices, priorities)
    assert memory.priorities(np.arange(10)) == pytest.approx(before)  # a refused update changes nothing
    with pytest.raises(ReplayError, match="overflows"):
        PrioritizedReplay(4, alpha=4.0).add(cartpole(1), priorities=np.array([1e300]))


def test_sample_errors():
    memory = PrioritizedReplay(10)
    with pytest.raises(ReplayError, match="empty replay memory"):
        memory.sample(4)
    memory.add(cartpole(2))
    for batch_size, beta, message in [(0, 0.4, "batch_size must be at least 1"), (2.0, 0.4, "batch_size must be an integer"),
                                      (4, -0.1, "beta"), (4, 1.5, "beta"), (4, float("nan"), "beta")]:
        with pytest.raises(ReplayError, match=message):
            memory.sample(batch_size, beta)
    assert isinstance(ReplayError("x"), RlbenchError)


def test_sum_tree_matches_numpy_at_awkward_capacities():
    from rlbench._sumtree import SumTree

    rng = np.random.default_rng(0)
    for capacity in (1, 3, 4, 5, 17, 1000, 4097):
        tree = SumTree(capacity, 0.7)
        reference = np.zeros(capacity)
        for _ in range(20):
            indices = rng.integers(0, capacity, rng.integers(1, 300))
            priorities = rng.exponential(1.0, len(indices)) * (rng.random(len(indices)) > 0.1)
            tree.update(indices, priorities, capacity)
            for index, priority in zip(indices, priorities):  # sequential: the last one wins
                reference[index] = priority**0.7
            assert tree.total == pytest.approx(reference.sum(), rel=1e-6)  # p**alpha is taken in float32
            positive = reference[reference > 0]
            assert tree.min == pytest.approx(positive.min() if positive.size else math.inf, rel=1e-6)
        if reference.sum() > 0:
            out_indices, out_weights = np.empty(2000, np.int64), np.empty(2000, np.float32)
            tree.sample(rng.random(2000), 0.5, out_indices, out_weights)
            assert np.all(reference[out_indices] > 0)
            assert out_weights == pytest.approx((reference[out_indices] / positive.min()) ** -0.5, rel=1e-5)
    with pytest.raises(ValueError, match="capacity must be at least 1"):
        SumTree(0, 0.6)


def test_probe_reports_a_missing_or_placeholder_extension(monkeypatch):
    assert probe_native().available
    placeholder = types.ModuleType("rlbench._sumtree")
    monkeypatch.setitem(sys.modules, "rlbench._sumtree", placeholder)
    monkeypatch.setattr("rlbench._sumtree", placeholder, raising=False)
    probe = probe_native()
    assert not probe.available and "build_ext --inplace" in probe.reason
    with pytest.raises(ReplayError, match="placeholder"):
        PrioritizedReplay(10)


def test_stats_count_what_happened():
    memory = PrioritizedReplay(5, seed=0)
    memory.add(cartpole(3))
    memory.add(cartpole(4))
    memory.sample(6)
    memory.update_priorities(np.array([0, 1]), np.array([2.0, 3.0]))
    stats = memory.stats()
    assert {k: stats[k] for k in ("size", "capacity", "adds", "add_calls", "overwritten", "samples",
                                  "sampled_items", "updates", "updated_items")} == {
        "size": 5, "capacity": 5, "adds": 7, "add_calls": 2, "overwritten": 2, "samples": 1,
        "sampled_items": 6, "updates": 1, "updated_items": 2}
    assert stats["max_priority_seen"] == 3.0 and stats["alpha"] == 0.6
    assert stats["fields"]["obs"] == "float32[4]"


# -- the benchmark's textbook baseline ---------------------------------------------------------------------
def test_numpy_sumtree_scalar_and_vector_paths_keep_the_same_tree():
    """Small updates walk to the root one by one, large ones go level by level: both must leave every
    node equal to its children's sum and min, with the last priority of a repeated index."""
    capacity, alpha = 1000, 0.7
    memory = numpy_sumtree_replay_class()(capacity, alpha=alpha, seed=0)
    rng = np.random.default_rng(1)
    memory.add(cartpole_batch(rng, capacity))
    memory.add(cartpole_batch(rng, 1))  # a single add with the default (max) priority
    expected = np.ones(capacity)
    for size in (1, 3, SCALAR_UPDATE_MAX, SCALAR_UPDATE_MAX + 1, 300):
        indices = rng.integers(0, capacity, size)
        indices[-1] = indices[0]  # a repeat: the last priority given wins
        priorities = rng.exponential(1.0, size) * (rng.random(size) > 0.1)
        memory.update_priorities(indices, priorities)
        for index, priority in zip(indices, priorities):
            expected[index] = priority
    leaves = memory._sum[memory._leaf0:memory._leaf0 + capacity]
    np.testing.assert_allclose(leaves, expected**alpha, rtol=1e-12)
    for tree, combine in ((memory._sum, np.add), (memory._min, np.minimum)):
        nodes = np.arange(1, memory._leaf0)
        np.testing.assert_allclose(tree[nodes], combine(tree[2 * nodes], tree[2 * nodes + 1]), rtol=1e-9)
    positive = expected[expected > 0]
    assert memory._min[1] == pytest.approx(positive.min() ** alpha)
    assert memory._max_priority == pytest.approx(max(1.0, expected.max()))
