from __future__ import annotations

import numpy as np
import pytest
from rlbench_upmem.reference import reference

from rlbench.errors import RlbenchError
from rlbench_upmem.backend import UpmemCompute


def engine(n_states, n_actions, **settings):
    return UpmemCompute(**settings).tabular(n_states, n_actions)


def test_conformance_kit_on_one_dpu_fp32():
    from rlbench.testing.tabular import check_tabular_engine

    # One DPU holds the whole dataset, so fit_offline is the exact in-order sweep the kit specifies;
    # the DPU computes in FP32, hence the tolerance.
    check_tabular_engine(lambda s, a: engine(s, a, dpus=1), rtol=1e-5, atol=1e-6)


def test_conformance_kit_on_one_dpu_int32():
    from rlbench.testing.tabular import check_tabular_engine

    check_tabular_engine(lambda s, a: engine(s, a, dpus=1, numeric="int32", fixed_point_scale=1 << 20),
                         rtol=1e-4, atol=1e-4)


def test_one_dpu_equals_the_core_cpu_engine(taxi_10k):
    from rlbench import get_registry

    cpu = get_registry().get("compute", "cpu").create().tabular(500, 6)
    pim = engine(500, 6, dpus=1)
    for e in (cpu, pim):
        e.fit_offline(taxi_10k.arrays, rule="sarsa", alpha=0.2, gamma=0.9, epochs=2)
    assert np.abs(cpu.q).max() > 1.0
    np.testing.assert_allclose(pim.q, cpu.q, rtol=1e-4, atol=1e-4)


def test_fit_offline_reports_measured_and_modelled_apart(frozenlake_10k):
    e = engine(16, 4, dpus=8, partition="stride")
    report = e.fit_offline(frozenlake_10k.arrays, rule="qlearning", alpha=0.3, gamma=0.95, epochs=2)
    assert report["updates"] == 20_000
    assert report["emulated"]["kind"] == "measured" and report["modelled"]["kind"] == "modelled"
    assert report["emulated"]["seconds"]["kernel"] > 0 and report["modelled"]["seconds"]["total"] > 0
    assert not any("modelled" in str(key) for key in report["emulated"])
    expected = reference(frozenlake_10k.arrays, 16, 4, dpus=8, strategy="stride", rule="qlearning", alpha=0.3,
                         gamma=0.95, epochs=2, sync_every=1)  # the backend synchronises every epoch by default
    np.testing.assert_allclose(e.q, expected, rtol=1e-4, atol=1e-6)


def test_int32_run_reports_its_error_against_fp32(taxi_10k):
    report = engine(500, 6, dpus=16, numeric="int32").fit_offline(taxi_10k.arrays, rule="qlearning", alpha=0.3,
                                                                  gamma=0.95, epochs=2)
    error = report["int32_error"]
    assert error["kind"] == "measured" and error["fixed_point_scale"] == 1 << 16
    assert 0 < error["max_abs"] < 100 * error["resolution"]


def test_deep_algorithms_are_refused_plainly():
    compute = UpmemCompute()
    assert compute.capabilities.supports("qlearning", "tabular") and compute.capabilities.supports("sarsa", "tabular")
    assert not compute.capabilities.supports("dqn", "learner")
    for call in (compute.torch_device, lambda: compute.mlp_inference([4, 2])):
        with pytest.raises(RlbenchError, match="upmem runs tabular algorithms only: cannot run deep algorithms"):
            call()


def test_bad_settings_are_refused_at_construction():
    with pytest.raises(RlbenchError, match="did you mean 'random'"):
        UpmemCompute(partition="randon")
    with pytest.raises(RlbenchError, match="the DPU count must be a positive integer"):
        UpmemCompute(dpus=0)
    with pytest.raises(RlbenchError, match="WRAM"):
        UpmemCompute().tabular(20_000, 4)


def test_more_dpus_than_the_modelled_server_has_are_refused_naming_the_limit():
    from rlbench_upmem.hardware import MAX_DPUS, UPMEM

    assert MAX_DPUS == 2560 == UPMEM.dimms_per_server * UPMEM.dpus_per_dimm
    assert UpmemCompute(dpus=MAX_DPUS).tabular(16, 4).dpus == MAX_DPUS
    for dpus in (MAX_DPUS + 1, 100_000):
        with pytest.raises(RlbenchError, match=r"2,560 DPUs in a 20-DIMM UPMEM server \(20 DIMMs x 128 DPUs\)"):
            UpmemCompute(dpus=dpus)


def test_rlbench_run_refuses_more_dpus_than_the_modelled_server_has():
    from rlbench import RunConfig, run

    with pytest.raises(RlbenchError, match="2,560 DPUs"):
        run(RunConfig(algo="qlearning", env="FrozenLake-v1", compute="upmem", dataset=10_000,
                      options={"compute": {"dpus": 100_000}}))


def evaluate(env_id, q, episodes=100, seed=1000):
    import gymnasium

    env = gymnasium.make(env_id)  # the dataset's env_id: the id the installed gymnasium ran
    wins = 0
    for episode in range(episodes):
        state, _ = env.reset(seed=seed + episode)
        while True:
            state, reward, terminated, truncated, _ = env.step(int(np.argmax(q[state])))
            if terminated or truncated:
                wins += reward > 0 if env_id.startswith("FrozenLake") else reward == 20
                break
    env.close()
    return wins / episodes


@pytest.mark.parametrize("env_id, dpus, numeric, rule, alpha, epochs, goal", [
    ("FrozenLake-v1", 64, "fp32", "qlearning", 0.1, 10, 0.6),
    ("FrozenLake-v1", 64, "int32", "sarsa", 0.1, 10, 0.6),
    ("Taxi-v3", 64, "fp32", "qlearning", 0.5, 20, 0.9),
    ("Taxi-v3", 32, "int32", "qlearning", 0.5, 20, 0.9),
])
def test_greedy_policy_of_the_aggregated_table_reaches_the_goal(env_id, dpus, numeric, rule, alpha, epochs, goal):
    from rlbench import datasets

    data = datasets.get(env_id, 100_000, seed=0)
    e = engine(data.n_states, data.n_actions, dpus=dpus, numeric=numeric, partition="random")
    e.fit_offline(data.arrays, rule=rule, alpha=alpha, gamma=0.99, epochs=epochs)
    assert evaluate(data.env_id, e.q) >= goal


def test_rlbench_run_offline_on_upmem_end_to_end(tmp_path):
    from rlbench import RunConfig, run

    result = run(RunConfig(algo="qlearning", env="FrozenLake-v1", compute="upmem", dataset=10_000, eval_episodes=5,
                           hyperparameters={"epochs": 2}, options={"compute": {"dpus": 8, "partition": "stride"}}))
    assert result["status"] == "complete"
    engine_report = result["loop"]["engine"]
    assert engine_report["settings"]["dpus"] == 8 and engine_report["updates"] == 20_000
    assert engine_report["emulated"]["kind"] == "measured" and engine_report["modelled"]["kind"] == "modelled"


def test_rlbench_run_refuses_deep_algorithms_on_upmem():
    from rlbench import RunConfig, run

    with pytest.raises(RlbenchError, match="cannot run deep algorithms"):
        run(RunConfig(algo="dqn", env="CartPole-v1", compute="upmem", steps=10))
