"""gpu/CartPole-v1 and gpu/Pendulum-v1 on the CPU device against gymnasium, from the same states."""

import gymnasium
import numpy as np
import pytest
import torch

from rlbench.errors import RlbenchError
from rlbench_gpu.envs import BatchedCartPole, BatchedPendulum

N = 6


def gym_envs(env_id, states, elapsed=0):
    envs = []
    for i, state in enumerate(states):
        env = gymnasium.make(env_id)
        env.reset(seed=i)
        env.unwrapped.state = np.array(state, dtype=np.float64)
        time_limit = env
        while not isinstance(time_limit, gymnasium.wrappers.TimeLimit):
            time_limit = time_limit.env
        time_limit._elapsed_steps = elapsed
        envs.append(env)
    return envs


def balancing_actions(obs, rng):
    """Mostly push toward the pole's fall, sometimes at random: long episodes that still end."""
    push = (obs[:, 2] + 0.3 * obs[:, 3] > 0).astype(np.int64)
    return np.where(rng.random(len(obs)) < 0.15, rng.integers(0, 2, len(obs)), push)


@pytest.mark.parametrize("elapsed", [0, 470])
def test_cartpole_matches_gymnasium_step_by_step_until_each_episode_ends(elapsed):
    rng = np.random.default_rng(elapsed)
    states = rng.uniform(-0.05, 0.05, (N, 4))
    states[0] = [2.3, 0.5, 0.0, 0.0]  # about to leave the track: terminates within a few steps
    env = BatchedCartPole(N, seed=0, device="cpu")
    env.reset()
    env.set_state(states, elapsed)
    reference = gym_envs("CartPole-v1", states, elapsed)
    running = np.ones(N, dtype=bool)
    obs = states.astype(np.float32)
    ends = {"terminated": 0, "truncated": 0}
    for _ in range(500 - elapsed):
        actions = balancing_actions(obs, rng)
        result = env.step(actions)
        for i in np.flatnonzero(running):
            gym_obs, reward, terminated, truncated, _ = reference[i].step(int(actions[i]))
            assert np.array_equal(result.final_observations[i], gym_obs), f"env {i}"
            assert result.rewards[i] == reward and result.terminated[i] == terminated and result.truncated[i] == truncated
            if terminated or truncated:
                running[i] = False
                ends["terminated" if terminated else "truncated"] += 1
                assert not np.array_equal(result.observations[i], result.final_observations[i])
                assert np.all(np.abs(result.observations[i]) <= 0.05)  # auto-reset: a fresh initial state
        obs = result.observations
        if not running.any():
            break
    assert not running.any() and ends["terminated"] >= 1
    if elapsed:
        assert ends["truncated"] >= 1, "no episode reached the 500-step limit"


def test_pendulum_matches_gymnasium_for_a_whole_episode_and_truncates_at_200():
    rng = np.random.default_rng(1)
    states = rng.uniform([-np.pi, -1.0], [np.pi, 1.0], (N, 2))
    env = BatchedPendulum(N, seed=0, device="cpu")
    env.reset()
    env.set_state(states)
    reference = gym_envs("Pendulum-v1", states)
    for step in range(1, 201):
        actions = rng.uniform(-2.5, 2.5, (N, 1)).astype(np.float32)  # beyond the bounds: clipped by both
        result = env.step(actions)
        for i in range(N):
            gym_obs, reward, terminated, truncated, _ = reference[i].step(actions[i])
            assert np.array_equal(result.final_observations[i], gym_obs), f"env {i} step {step}"
            assert result.rewards[i] == np.float32(reward)
            assert result.terminated[i] == terminated and result.truncated[i] == truncated
    assert result.truncated.all() and not result.terminated.any()


def test_float32_state_follows_gymnasium_closely_over_short_horizons():
    rng = np.random.default_rng(2)
    states = rng.uniform(-0.05, 0.05, (N, 4))
    env = BatchedCartPole(N, seed=0, device="cpu", dtype="float32")
    env.reset()
    env.set_state(states)
    reference = gym_envs("CartPole-v1", states)
    for _ in range(8):
        actions = rng.integers(0, 2, N)
        result = env.step(actions)
        expected = np.stack([reference[i].step(int(actions[i]))[0] for i in range(N)])
        assert np.allclose(result.final_observations, expected, rtol=1e-4, atol=1e-6)


def test_resets_are_reproducible_per_seed_and_in_gymnasiums_ranges():
    first = BatchedPendulum(256, seed=7, device="cpu").reset()
    again = BatchedPendulum(256, seed=7, device="cpu").reset()
    other = BatchedPendulum(256, seed=8, device="cpu").reset()
    assert np.array_equal(first, again) and not np.array_equal(first, other)
    assert np.all(np.abs(first[:, 2]) <= 1.0)
    cartpole = BatchedCartPole(256, seed=7, device="cpu").reset()
    assert cartpole.dtype == np.float32 and cartpole.shape == (256, 4) and np.all(np.abs(cartpole) <= 0.05)


def test_torch_output_stays_in_tensors_and_takes_tensor_actions():
    env = BatchedCartPole(32, seed=0, device="cpu", output="torch")
    obs = env.reset()
    result = env.step(torch.ones(32, dtype=torch.int64))
    assert isinstance(obs, torch.Tensor) and obs.dtype == torch.float32
    assert result.terminated.dtype == torch.bool and result.rewards.dtype == torch.float32
    assert torch.all(result.final_observations[:, 1] > obs[:, 1])  # pushed right: the cart speeds up


@pytest.mark.parametrize("make, actions, message", [
    (lambda: BatchedCartPole(4, device="cpu"), np.array([0, 1, 2, 0]), "integers 0 or 1"),
    (lambda: BatchedCartPole(4, device="cpu"), np.zeros(3, np.int64), r"shape \(4,\)"),
    (lambda: BatchedCartPole(4, device="cpu"), torch.zeros(4), "integers 0 or 1"),
    (lambda: BatchedPendulum(4, device="cpu"), np.full((4, 1), np.nan), "finite numbers"),
    (lambda: BatchedPendulum(4, device="cpu"), np.zeros((4, 2)), r"shape \(4, 1\)"),
])
def test_bad_actions_are_refused_in_one_line(make, actions, message):
    env = make()
    env.reset(seed=0)
    with pytest.raises(RlbenchError, match=message):
        env.step(actions)


def test_bad_options_are_refused():
    with pytest.raises(RlbenchError, match="output must be one of"):
        BatchedCartPole(4, device="cpu", output="jax")
    with pytest.raises(RlbenchError, match="CUDA graphs"):
        BatchedCartPole(4, device="cpu", graph=True)
    with pytest.raises(RlbenchError, match="num_envs must be >= 1"):
        BatchedPendulum(0, device="cpu")
