from __future__ import annotations

import numpy as np
import pytest
from rlbench_upmem.reference import chunks_of, reference

from rlbench.errors import RlbenchError
from rlbench_upmem.emulator import (PimSystem, WorkloadDoesNotFitError, partition, run_offline)
from rlbench_upmem.hardware import DpuHardware


def fit(data, *, dpus, numeric="fp32", strategy="contiguous", rule="qlearning", alpha=0.3, gamma=0.95, epochs=3,
        sync_every=None, tasklets=16, scale=1 << 16, seed=0):
    system = PimSystem(dpus, data.n_states, data.n_actions, tasklets=tasklets, numeric=numeric, scale=scale)
    q, measured = run_offline(system, data.arrays, np.zeros((data.n_states, data.n_actions)), rule=rule, alpha=alpha,
                              gamma=gamma, epochs=epochs, partition_strategy=strategy, seed=seed, sync_every=sync_every)
    return q, measured, system


@pytest.mark.parametrize("strategy", ["contiguous", "stride", "random"])
def test_partition_gives_each_dpu_the_rows_of_its_strategy(strategy):
    order, offsets = partition(103, 8, strategy, seed=5)
    rows = np.arange(103) if order is None else order
    expected = chunks_of(103, 8, strategy, seed=5)
    for d in range(8):
        np.testing.assert_array_equal(rows[offsets[d]:offsets[d + 1]], expected[d])


@pytest.mark.parametrize("strategy", ["contiguous", "stride", "random"])
@pytest.mark.parametrize("rule", ["qlearning", "sarsa"])
def test_fp32_emulation_equals_float64_per_chunk_reference(taxi_10k, strategy, rule):
    q, _, _ = fit(taxi_10k, dpus=7, strategy=strategy, rule=rule, seed=3)
    expected = reference(taxi_10k.arrays, taxi_10k.n_states, taxi_10k.n_actions, dpus=7, strategy=strategy,
                         rule=rule, alpha=0.3, gamma=0.95, epochs=3, seed=3)
    assert np.abs(expected).max() > 1.0  # the data moved the table
    np.testing.assert_allclose(q, expected, rtol=1e-4, atol=1e-4)


def test_periodic_synchronisation_matches_reference(frozenlake_10k):
    q, measured, _ = fit(frozenlake_10k, dpus=5, epochs=4, sync_every=2)
    expected = reference(frozenlake_10k.arrays, 16, 4, dpus=5, strategy="contiguous", rule="qlearning", alpha=0.3,
                         gamma=0.95, epochs=4, sync_every=2)
    assert measured["rounds"] == 2
    np.testing.assert_allclose(q, expected, rtol=1e-4, atol=1e-6)
    q_once, _, _ = fit(frozenlake_10k, dpus=5, epochs=4)
    assert not np.allclose(q, q_once)  # synchronising changes what the DPUs learn from


def test_unseen_pairs_keep_the_host_value(frozenlake_10k):
    arrays = {k: v[:50] for k, v in frozenlake_10k.arrays.items()}
    system = PimSystem(2, 16, 4)
    start = np.full((16, 4), 7.0)
    q, measured = run_offline(system, arrays, start, rule="qlearning", alpha=0.5, gamma=0.9, epochs=1)
    seen = np.zeros((16, 4), dtype=bool)
    seen[arrays["obs"], arrays["action"]] = True
    assert measured["unseen_pairs"] == int((~seen).sum()) > 0
    np.testing.assert_array_equal(q[~seen], 7.0)
    assert not np.allclose(q[seen], 7.0)


def test_int32_fixed_point_error_is_bounded_and_shrinks_with_the_scale(taxi_10k):
    exact = reference(taxi_10k.arrays, taxi_10k.n_states, taxi_10k.n_actions, dpus=4, strategy="contiguous",
                      rule="qlearning", alpha=0.3, gamma=0.95, epochs=3)
    errors = {}
    for scale in (1 << 8, 1 << 16):
        q, measured, system = fit(taxi_10k, dpus=4, numeric="int32", scale=scale)
        assert system.q_mram.dtype == np.int32 and measured["int32_saturations"] == 0
        errors[scale] = np.abs(q - exact).max()
    # each update truncates twice (1/scale each) and errors are damped by alpha*(1-gamma) per visit
    assert errors[1 << 16] < 200 / (1 << 16)
    assert errors[1 << 8] > 10 * errors[1 << 16]


def test_int32_saturates_and_counts_instead_of_wrapping(frozenlake_10k):
    arrays = dict(frozenlake_10k.arrays)
    arrays["reward"] = np.full(len(arrays["obs"]), 30_000.0, dtype=np.float32)
    system = PimSystem(2, 16, 4, numeric="int32", scale=1 << 16)
    q, measured = run_offline(system, arrays, np.zeros((16, 4)), rule="qlearning", alpha=0.9, gamma=0.99, epochs=30)
    assert measured["int32_saturations"] > 0
    assert q.min() >= 0  # no wrap-around to negative values
    assert np.isclose(q.max(), np.iinfo(np.int32).max / (1 << 16))


def test_tasklet_count_changes_nothing_in_the_result(taxi_10k):
    q1, _, _ = fit(taxi_10k, dpus=3, tasklets=1)
    q24, _, _ = fit(taxi_10k, dpus=3, tasklets=24)
    np.testing.assert_array_equal(q1, q24)


def test_mram_overflow_is_refused_with_the_numbers(frozenlake_10k):
    small = DpuHardware(mram_bytes=64 * 1024)
    system = PimSystem(2, 16, 4, hardware=small)
    with pytest.raises(WorkloadDoesNotFitError, match=r"MRAM: 5,000 transitions x 16 B .* > 0 MiB"):
        system.scatter(frozenlake_10k.arrays)


def test_wram_overflow_is_refused_with_the_numbers():
    with pytest.raises(WorkloadDoesNotFitError, match=r"WRAM: Q-table 40,000 entries x 5 B .* > 64 KiB"):
        PimSystem(1, 10_000, 4)


@pytest.mark.parametrize("kwargs, message", [
    ({"tasklets": 25}, "between 1 and 24"),
    ({"numeric": "fp16"}, "unknown numeric 'fp16'"),
    ({"numeric": "int32", "scale": 0}, "fixed-point-scale"),
])
def test_bad_settings_are_refused(kwargs, message):
    with pytest.raises(RlbenchError, match=message):
        PimSystem(4, 16, 4, **kwargs)


def test_out_of_range_dataset_is_refused(frozenlake_10k):
    with pytest.raises(RlbenchError, match="obs spans 0..14, outside the table's 0..7"):
        PimSystem(2, 8, 4).scatter(frozenlake_10k.arrays)
    with pytest.raises(RlbenchError, match="did you mean 'stride'"):
        PimSystem(2, 16, 4).scatter(frozenlake_10k.arrays, "strid")


def test_emulator_memory_is_accounted(taxi_10k):
    _, measured, system = fit(taxi_10k, dpus=64)
    held = taxi_10k.nbytes + 64 * 500 * 6 * 4
    assert measured["emulator_bytes"] == system.nbytes
    assert system.nbytes < 2 * held


def one_round(system, arrays, rule, epochs=2, strategy="contiguous", seed=0, alpha=0.3, gamma=0.95):
    system.scatter(arrays, strategy, seed)
    system.run_round(np.zeros((system.n_states, system.n_actions)), rule, alpha, gamma, epochs)
    return system


@pytest.mark.parametrize("numeric", ["fp32", "int32"])
@pytest.mark.parametrize("rule", ["qlearning", "sarsa"])
def test_every_dpu_ends_bit_for_bit_as_if_it_ran_alone(taxi_10k, numeric, rule):
    # The C side runs DPUs interleaved in groups and rank by rank; each DPU's table and seen flags
    # must be exactly those of the same chunk swept alone on a one-DPU system.
    many = one_round(PimSystem(7, 500, 6, numeric=numeric), taxi_10k.arrays, rule, strategy="random", seed=2)
    order, offsets = partition(len(taxi_10k), 7, "random", seed=2)
    for d in range(7):
        rows = order[offsets[d]:offsets[d + 1]]
        alone = one_round(PimSystem(1, 500, 6, numeric=numeric), {k: v[rows] for k, v in taxi_10k.arrays.items()}, rule)
        np.testing.assert_array_equal(many.q_mram[d], alone.q_mram[0])
        np.testing.assert_array_equal(many.seen_mram[d], alone.seen_mram[0])
    assert np.abs(many.q_mram).max() > 0


@pytest.mark.parametrize("n_actions", [1, 3, 9, 12])  # 9 and 12 take the generic (not unrolled) update
def test_any_action_count_equals_the_reference(n_actions):
    rng = np.random.default_rng(n_actions)
    n, n_states = 3_000, 20
    ids = {"obs": n_states, "action": n_actions, "next_obs": n_states, "next_action": n_actions}
    arrays = {name: rng.integers(0, high, n, dtype=np.int32) for name, high in ids.items()}
    arrays |= {"reward": rng.normal(size=n).astype(np.float32), "done": (rng.random(n) < 0.1).astype(np.uint8)}
    for rule in ("qlearning", "sarsa"):
        system = PimSystem(6, n_states, n_actions)
        q, _ = run_offline(system, arrays, np.zeros((n_states, n_actions)), rule=rule, alpha=0.3, gamma=0.9, epochs=2)
        expected = reference(arrays, n_states, n_actions, dpus=6, strategy="contiguous", rule=rule, alpha=0.3,
                             gamma=0.9, epochs=2)
        assert np.abs(expected).max() > 0.1
        np.testing.assert_allclose(q, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("field, values, message", [
    ("reward", np.nan, r"reward'\] holds NaN or infinity"),
    ("reward", 1e39, "beyond float32's range"),  # finite in float64, infinite once packed
    ("action", -1, r"action spans -1\.\.3, outside the table's 0\.\.3"),
    ("next_obs", 16, r"next_obs spans 0\.\.16, outside the table's 0\.\.15"),
    ("obs", 2**32 + 1, r"obs spans 0\.\.4294967297"),  # an int64 id is not narrowed to int32 unchecked
])
def test_values_the_dpu_program_cannot_use_are_refused(frozenlake_10k, field, values, message):
    arrays = dict(frozenlake_10k.arrays)
    column = arrays[field].astype(np.float64 if field == "reward" else np.int64)
    column[len(column) // 2] = values
    arrays[field] = column
    system = PimSystem(4, 16, 4)
    with pytest.raises(RlbenchError, match=message):
        system.scatter(arrays, "stride")
    with pytest.raises(RlbenchError, match=message):
        system.scatter(arrays)
