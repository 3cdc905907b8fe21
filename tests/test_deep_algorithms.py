"""DQN and DDPG actors and learners on the CPU backend; end-to-end learning through the runner (slow)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from rlbench.algorithms.ddpg import DDPG, DDPGConfig
from rlbench.algorithms.dqn import DQN, DQNConfig
from rlbench.builtin.compute_cpu import CpuCompute
from rlbench.errors import RlbenchError
from rlbench.protocols import EnvSpec, Sample

CARTPOLE = EnvSpec("CartPole-v1", 1, (4,), "float32", "discrete", n_actions=2)
# Asymmetric bounds, so a scale/offset mistake cannot hide behind symmetry.
SKEWED = EnvSpec("Skewed", 1, (3,), "float32", "continuous", action_shape=(2,),
                 action_low=(-1.0, 0.0), action_high=(3.0, 0.5))


@pytest.fixture(scope="module")
def compute():
    return CpuCompute(threads=1)


def fixed_batch(spec: EnvSpec, size: int = 64, seed: int = 0) -> Sample:
    rng = np.random.default_rng(seed)
    obs_dim = spec.observation_shape[0]
    if spec.action_kind == "discrete":
        actions = rng.integers(spec.n_actions, size=size)
    else:
        actions = rng.uniform(spec.action_low, spec.action_high, (size, *spec.action_shape)).astype(np.float32)
    transitions = {"obs": rng.standard_normal((size, obs_dim)).astype(np.float32), "action": actions,
                   "reward": rng.standard_normal(size).astype(np.float32),
                   "next_obs": rng.standard_normal((size, obs_dim)).astype(np.float32),
                   "done": (rng.random(size) < 0.2).astype(np.float32)}
    return Sample(np.arange(size, dtype=np.int64), transitions, np.ones(size, np.float32))


# ------------------------------------------------------------------------------------------ DQN
def test_dqn_learner_reduces_td_loss_on_a_fixed_batch(compute):
    config = DQNConfig(target_update_every=10**9, learning_rate=1e-3)
    learner = DQN().make_learner(CARTPOLE, compute, config, seed=0)
    sample = fixed_batch(CARTPOLE)
    losses = [learner.update(sample)[1]["loss"] for _ in range(150)]
    assert learner.updates == 150
    assert losses[-1] < 0.2 * losses[0]


def test_dqn_priorities_are_abs_td_error_before_the_step_plus_eps(compute):
    config = DQNConfig(per_eps=0.01)
    learner = DQN().make_learner(CARTPOLE, compute, config, seed=1)
    sample = fixed_batch(CARTPOLE, seed=1)
    t = {k: torch.as_tensor(v) for k, v in sample.transitions.items()}
    with torch.no_grad():
        q = learner.q_network(t["obs"]).gather(1, t["action"].view(-1, 1)).squeeze(1)
        expected = (learner.td_target(t["reward"], t["next_obs"], t["done"]) - q).abs().numpy() + 0.01
    priorities, _ = learner.update(sample)
    assert priorities.shape == (64,)
    np.testing.assert_allclose(priorities, expected, rtol=1e-5, atol=1e-6)


def test_dqn_actor_initial_priorities_are_its_own_abs_td_error(compute):
    # Ape-X: the actor's priority for new experience is |TD error| under its own weights (vanilla
    # target: the actor has no target network), plus eps.
    config = DQNConfig(per_eps=0.01, double_dqn=False)
    learner = DQN().make_learner(CARTPOLE, compute, config, seed=2)
    actor = DQN().make_actor(CARTPOLE, compute, config, seed=2)
    actor.load_weights(learner.weights(), 0)
    t = fixed_batch(CARTPOLE, seed=2).transitions
    with torch.no_grad():
        q = learner.q_network(torch.as_tensor(t["obs"])).numpy()
        next_q = learner.q_network(torch.as_tensor(t["next_obs"])).numpy().max(axis=1)
    expected = np.abs(t["reward"] + 0.99 * (1 - t["done"]) * next_q - q[np.arange(64), t["action"]]) + 0.01
    np.testing.assert_allclose(actor.initial_priorities(t), expected, rtol=1e-4, atol=1e-5)


def test_dqn_zero_importance_weights_leave_the_network_unchanged(compute):
    learner = DQN().make_learner(CARTPOLE, compute, DQNConfig(max_grad_norm=0.0), seed=2)
    before = learner.weights()
    sample = fixed_batch(CARTPOLE)
    sample.weights = np.zeros_like(sample.weights)
    learner.update(sample)
    for old, new in zip(before, learner.weights()):
        np.testing.assert_array_equal(old, new)
    sample.weights = np.ones_like(sample.weights)
    learner.update(sample)
    assert any(not np.array_equal(old, new) for old, new in zip(before, learner.weights()))


def test_double_dqn_target_uses_the_online_argmax(compute):
    double = DQN().make_learner(CARTPOLE, compute, DQNConfig(double_dqn=True), seed=3)
    vanilla = DQN().make_learner(CARTPOLE, compute, DQNConfig(double_dqn=False), seed=3)
    with torch.no_grad():  # make online and target disagree
        for p in double.q_network.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    vanilla.q_network.load_state_dict(double.q_network.state_dict())
    vanilla.target_network.load_state_dict(double.target_network.state_dict())
    t = {k: torch.as_tensor(v) for k, v in fixed_batch(CARTPOLE, size=256, seed=3).transitions.items()}
    args = (t["reward"], t["next_obs"], t["done"] * 0)
    double_target, vanilla_target = double.td_target(*args), vanilla.td_target(*args)
    with torch.no_grad():
        agree = double.q_network(t["next_obs"]).argmax(1) == double.target_network(t["next_obs"]).argmax(1)
    assert 0 < int(agree.sum()) < len(agree)
    assert torch.equal(double_target[agree], vanilla_target[agree])
    assert torch.all(double_target[~agree] < vanilla_target[~agree])  # max over target >= any other choice


def test_dqn_weights_round_trip_to_the_numpy_actor(compute):
    config = DQNConfig(epsilon_start=0.0, epsilon_end=0.0)
    learner = DQN().make_learner(CARTPOLE, compute, config, seed=4)
    actor = DQN().make_actor(CARTPOLE, compute, config, seed=4)
    sample = fixed_batch(CARTPOLE)
    for _ in range(20):
        learner.update(sample)
    actor.load_weights(learner.weights(), learner.updates)
    obs = np.random.default_rng(4).standard_normal((500, 4)).astype(np.float32)
    with torch.no_grad():
        expected = learner.q_network(torch.as_tensor(obs)).argmax(1).numpy()
    np.testing.assert_array_equal(actor.greedy(obs), expected)
    np.testing.assert_array_equal(actor.act(obs, step=10**6), expected)  # epsilon 0: greedy


def test_dqn_actor_explores_on_schedule_and_is_reproducible(compute):
    config = DQNConfig(epsilon_start=1.0, epsilon_end=0.0, exploration_steps=1000)
    actor = DQN().make_actor(CARTPOLE, compute, config, seed=5)
    obs = np.zeros((4000, 4), np.float32)
    random_actions = actor.act(obs, step=0)  # epsilon 1: no weights needed
    assert set(np.unique(random_actions)) == {0, 1}
    assert abs(random_actions.mean() - 0.5) < 0.05
    again = DQN().make_actor(CARTPOLE, compute, config, seed=5).act(obs, step=0)
    np.testing.assert_array_equal(random_actions, again)
    learner = DQN().make_learner(CARTPOLE, compute, config, seed=5)
    actor.load_weights(learner.weights(), 0)
    greedy = actor.greedy(obs)  # all identical observations: one action
    half = actor.act(obs, step=500)  # epsilon 0.5: half explore, half of those pick the greedy one anyway
    assert 0.15 < np.mean(half != greedy) < 0.35


def test_dqn_refuses_continuous_actions_and_unknown_loss(compute):
    with pytest.raises(RlbenchError, match="discrete actions"):
        DQN().make_actor(SKEWED, compute, DQNConfig(), seed=0)
    with pytest.raises(RlbenchError, match="huber"):
        DQN().make_learner(CARTPOLE, compute, DQNConfig(loss="l1"), seed=0)


def test_algorithm_capabilities_come_from_the_registry():
    assert DQN().capabilities.action_space == "discrete" and DQN().capabilities.prioritized_replay
    assert DDPG().capabilities.action_space == "continuous"


# ------------------------------------------------------------------------------------------ DDPG
def test_ddpg_actions_respect_asymmetric_bounds(compute):
    config = DDPGConfig(learning_starts=100, exploration_noise=5.0)  # noise far beyond the bounds
    actor = DDPG().make_actor(SKEWED, compute, config, seed=0)
    learner = DDPG().make_learner(SKEWED, compute, config, seed=0)
    obs = np.random.default_rng(0).standard_normal((2000, 3)).astype(np.float32) * 10
    low, high = np.array(SKEWED.action_low), np.array(SKEWED.action_high)
    warmup = actor.act(obs, step=0)  # uniform over the box before learning_starts
    assert warmup.shape == (2000, 2) and warmup.dtype == np.float32
    assert np.all(warmup >= low) and np.all(warmup <= high)
    np.testing.assert_allclose(warmup.mean(axis=0), (low + high) / 2, atol=0.1)
    actor.load_weights(learner.weights(), 0)
    noisy = actor.act(obs, step=10**6)
    assert np.all(noisy >= low) and np.all(noisy <= high)
    assert np.any(noisy == low) and np.any(noisy == high)  # the noise was clipped, not wrapped
    greedy = actor.greedy(obs)
    assert np.all(greedy >= low) and np.all(greedy <= high)


def test_ddpg_weights_round_trip_gives_the_learners_scaled_policy(compute):
    config = DDPGConfig()
    learner = DDPG().make_learner(SKEWED, compute, config, seed=1)
    actor = DDPG().make_actor(SKEWED, compute, config, seed=1)
    sample = fixed_batch(SKEWED)
    for _ in range(10):
        learner.update(sample)
    actor.load_weights(learner.weights(), learner.updates)
    obs = np.random.default_rng(1).standard_normal((300, 3)).astype(np.float32)
    with torch.no_grad():
        expected = learner._policy(learner.actor, torch.as_tensor(obs)).numpy()
    np.testing.assert_allclose(actor.greedy(obs), expected, rtol=1e-5, atol=1e-5)


def test_ddpg_critic_loss_falls_and_the_actor_climbs_the_critic(compute):
    config = DDPGConfig(tau=0.0, policy_delay=2)  # frozen targets: a fixed regression problem
    learner = DDPG().make_learner(SKEWED, compute, config, seed=2)
    sample = fixed_batch(SKEWED, size=128, seed=2)
    obs = torch.as_tensor(sample.transitions["obs"])
    infos = [learner.update(sample)[1] for _ in range(200)]
    assert infos[-1]["critic_loss"] < 0.2 * infos[0]["critic_loss"]
    assert "actor_loss" in infos[1] and "actor_loss" not in infos[0]  # the policy update is delayed
    with torch.no_grad():
        q_policy = learner._q(learner.critic, obs, learner._policy(learner.actor, obs)).mean()
        q_data = learner._q(learner.critic, obs, torch.as_tensor(sample.transitions["action"])).mean()
    assert q_policy > q_data  # the actor found actions the critic rates above the batch's own


def test_ddpg_weights_are_copies_targets_follow_softly_and_the_critic_trains_again(compute):
    # One action: the last layer's weight is (1, hidden), whose transpose is contiguous, the case in
    # which a careless export would hand out the live parameter instead of a copy.
    line = EnvSpec("Line", 1, (3,), "float32", "continuous", action_shape=(1,), action_low=(-1.0,), action_high=(1.0,))
    config = DDPGConfig(tau=0.25, policy_delay=1)
    learner = DDPG().make_learner(line, compute, config, seed=4)
    exported = learner.weights()
    kept = [array.copy() for array in exported]
    target_before = [p.detach().clone() for p in learner.target_actor.parameters()]
    critic_before = [p.detach().clone() for p in learner.critic.parameters()]
    learner.update(fixed_batch(line))
    for array, copy in zip(exported, kept):
        np.testing.assert_array_equal(array, copy)  # training in place did not reach the exported arrays
    assert any(not np.array_equal(a, b) for a, b in zip(learner.weights(), kept))
    for target, before, online in zip(learner.target_actor.parameters(), target_before, learner.actor.parameters()):
        torch.testing.assert_close(target.detach(), before + 0.25 * (online.detach() - before))
    assert all(p.requires_grad for p in learner.critic.parameters())  # frozen only for the actor's step
    learner.update(fixed_batch(line, seed=1))
    assert all(not torch.equal(p.detach(), b) for p, b in zip(learner.critic.parameters(), critic_before))


def test_ddpg_priorities_and_refusals(compute):
    learner = DDPG().make_learner(SKEWED, compute, DDPGConfig(per_eps=0.5), seed=3)
    priorities, _ = learner.update(fixed_batch(SKEWED))
    assert priorities.shape == (64,) and np.all(priorities >= 0.5)
    with pytest.raises(RlbenchError, match="continuous action"):
        DDPG().make_learner(CARTPOLE, compute, DDPGConfig(), seed=0)


def test_configs_are_replay_loop_configs_with_defaults():
    for config in (DQNConfig(), DDPGConfig()):
        assert all(f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
                   for f in dataclasses.fields(config))
        assert config.learning_starts >= config.batch_size


# ---------------------------------------------------------------------------- learning, end to end
def run_default(algo: str, env: str, seed: int) -> dict:
    from rlbench.config import RunConfig
    from rlbench.runner import run

    return run(RunConfig(algo=algo, env=env, compute="cpu", seed=seed, eval_episodes=10))


@pytest.mark.slow
def test_dqn_learns_cartpole_with_its_defaults_on_prioritized_replay():
    result = run_default("dqn", "CartPole-v1", seed=0)
    assert result["config"]["replay"] == "prioritized"
    assert result["evaluation"]["mean_return"] >= 195, result["evaluation"]


@pytest.mark.slow
def test_ddpg_learns_pendulum_with_its_defaults():
    result = run_default("ddpg", "Pendulum-v1", seed=0)
    assert result["evaluation"]["mean_return"] > -400, result["evaluation"]


def test_actors_run_without_importing_torch():
    import subprocess
    import sys

    script = """
import sys
import numpy as np
from rlbench.algorithms.dqn import DQN
from rlbench.builtin.compute_cpu import CpuCompute
from rlbench.protocols import EnvSpec
spec = EnvSpec("CartPole-v1", 2, (4,), "float32", "discrete", n_actions=2)
actor = DQN().make_actor(spec, CpuCompute(), DQN.Config(hidden_sizes=(8,), epsilon_end=0.0), seed=0)
actor.load_weights([np.ones((4, 8), np.float32), np.zeros(8, np.float32),
                    np.array([[1, 0]] * 8, np.float32), np.zeros(2, np.float32)], 1)
assert actor.act(np.ones((2, 4), np.float32), 10**6).tolist() == [0, 0]
assert "torch" not in sys.modules, "the actor imported torch"
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_a_read_only_batch_is_copied_without_a_warning_and_a_writable_one_is_shared():
    import warnings

    from rlbench.algorithms.networks import as_tensor

    writable = np.arange(6, dtype=np.float32).reshape(3, 2)
    read_only = writable.copy()
    read_only.flags.writeable = False  # as a view of an OpenCL memory's mapped batch arrives
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's "not writable" warning would fail here
        tensor = as_tensor(read_only, torch.device("cpu"))
    assert tensor.numpy().tolist() == read_only.tolist()
    shared = as_tensor(writable, torch.device("cpu"))
    writable[0, 0] = 42.0
    assert shared[0, 0].item() == 42.0  # no copy where none is needed
