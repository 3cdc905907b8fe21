"""The gymnasium adapter: same-step auto-reset, old ids mapped and said, tuple states indexed."""

from __future__ import annotations

import gymnasium
import numpy as np

from rlbench.builtin.envs import GymnasiumEnv


def test_old_taxi_id_runs_the_installed_one_and_says_so():
    env = GymnasiumEnv("Taxi-v3")
    if "Taxi-v3" not in gymnasium.registry:
        assert env.spec.id in gymnasium.registry and env.spec.id != "Taxi-v3"
        assert "Taxi-v3" in env.spec.note and env.spec.id in env.spec.note
    assert env.spec.n_states == 500 and env.spec.n_actions == 6


def test_tuple_of_discrete_observations_become_one_state_index():
    env = GymnasiumEnv("Blackjack-v1", num_envs=3, seed=0)
    assert env.spec.observation_dtype == "int64" and env.spec.n_states == 32 * 11 * 2
    raw = gymnasium.make("Blackjack-v1")
    obs, _ = raw.reset(seed=5)
    index = env.encode_observation(obs)
    assert np.unravel_index(index, (32, 11, 2)) == tuple(int(x) for x in obs)
    states = env.reset(seed=0)
    for _ in range(50):
        result = env.step(np.ones(3, dtype=np.int64))
        for batch in (states, result.observations, result.final_observations):
            assert ((0 <= batch) & (batch < env.spec.n_states)).all()
        states = result.observations


def test_same_step_auto_reset_returns_the_true_final_observation():
    env = GymnasiumEnv("CartPole-v1", num_envs=2, seed=1)
    env.reset(seed=1)
    ended = 0
    for _ in range(300):
        result = env.step(np.zeros(2, dtype=np.int64))  # always push left: episodes end fast
        for i in np.flatnonzero(result.terminated):
            ended += 1
            assert abs(result.final_observations[i][2]) > 0.2  # the pole fell past the limit...
            assert abs(result.observations[i][2]) < 0.06  # ...and the next episode starts upright
    assert ended > 2


def test_gymnasium_ids_keep_their_dtypes_and_name_their_family():
    import rlbench

    registry = rlbench.get_registry()
    assert registry.get("environment", "CartPole-v1").capabilities.family == "classic-control"
    assert registry.get("environment", "Taxi-v3").capabilities.family == "toy-text"
    assert not registry.get("environment", "CartPole-v1").capabilities.evaluation_mode
    cartpole, taxi = GymnasiumEnv("CartPole-v1"), GymnasiumEnv("Taxi-v3")
    assert (cartpole.spec.observation_dtype, cartpole.spec.observation_kind, cartpole.spec.returns) == \
        ("float32", "continuous", "raw")
    assert (taxi.spec.observation_dtype, taxi.spec.observation_kind) == ("int64", "discrete")
    assert cartpole.reset(seed=0).dtype == np.float32 and cartpole.spec.frame_stack == 0
