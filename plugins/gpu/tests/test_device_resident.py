"""Data stays on the device between components that take tensors, and goes to the host where a
component does not. Run on the CPU device: the same code paths as on CUDA, tensors and all."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlbench import get_registry
from rlbench.protocols import Sample
from rlbench_gpu.compute import GpuCompute
from rlbench_gpu.envs import BatchedCartPole, BatchedPendulum
from rlbench_gpu.replay import GpuPrioritizedReplay


class Recording:
    """A replay memory wrapper that notes the kind of every array it is handed."""

    def __init__(self, memory):
        self.memory, self.capabilities, self.kinds = memory, memory.capabilities, set()

    def add(self, transitions, priorities=None):
        self.kinds.update(type(v).__name__ for v in transitions.values())
        return self.memory.add(transitions, priorities)

    def sample(self, batch_size, beta=0.4):
        return self.memory.sample(batch_size, beta)

    def update_priorities(self, indices, priorities):
        self.kinds.add(f"priorities:{type(priorities).__name__}")
        return self.memory.update_priorities(indices, priorities)

    def __len__(self):
        return len(self.memory)


def algorithm(name):
    return get_registry().get("algorithm", name).create()


def run_dqn(core_replay_loop, env, replay, compute, steps=2048):
    dqn = algorithm("dqn")
    hp = dqn.Config(learning_starts=256, batch_size=32, train_every=32, buffer_size=4096, exploration_steps=1024)
    return core_replay_loop(dqn, hp, env, replay, compute, steps)


def test_a_device_env_feeds_a_device_replay_tensors_and_the_loop_accounts_for_every_step(core_replay_loop):
    num_envs = 64
    replay = Recording(GpuPrioritizedReplay(4096, device="cpu", seed=0))
    ctx, stats = run_dqn(core_replay_loop, BatchedCartPole(num_envs, seed=0, device="cpu", output="torch"), replay,
                         GpuCompute("cpu"))
    assert replay.kinds == {"Tensor", "priorities:ndarray"}  # the CPU device's samples come back as numpy
    assert stats.env_steps == 2048 == ctx.accounting.produced == ctx.accounting.stored
    assert stats.updates == (2048 - 256) // 32 + 1
    assert ctx.curve.points and all(1 <= p["length"] <= 500 and p["return"] == p["length"] for p in ctx.curve.points)


def test_a_device_env_with_host_components_is_copied_to_the_host(core_replay_loop):
    num_envs = 16
    registry = get_registry()
    replay = Recording(registry.get("replay", "prioritized").create(capacity=4096, alpha=0.6, seed=0))
    ctx, stats = run_dqn(core_replay_loop, BatchedCartPole(num_envs, seed=0, device="cpu", output="torch"), replay,
                         registry.get("compute", "cpu").create())
    assert replay.kinds == {"ndarray", "priorities:ndarray"}
    assert stats.env_steps == ctx.accounting.stored == 2048


def test_dqn_actor_explores_on_the_device_with_a_tensor_engine_and_on_the_host_without():
    env = BatchedCartPole(4096, seed=0, device="cpu", output="torch")
    dqn = algorithm("dqn")
    config = dqn.Config(exploration_steps=100, epsilon_end=0.25)
    device_actor = dqn.make_actor(env.spec, GpuCompute("cpu"), config, seed=0)
    host_actor = dqn.make_actor(env.spec, get_registry().get("compute", "cpu").create(), config, seed=0)
    learner = dqn.make_learner(env.spec, GpuCompute("cpu"), config, seed=0)
    for actor in (device_actor, host_actor):
        actor.load_weights(learner.weights(), 0)
    obs = env.reset(seed=0)
    actions = device_actor.act(obs, step=10_000)
    assert isinstance(actions, torch.Tensor) and actions.shape == (4096,) and actions.dtype == torch.int64
    greedy = device_actor.q_values(obs).argmax(dim=1)
    explored = (actions != greedy).float().mean().item()
    assert 0.08 < explored < 0.17  # epsilon 0.25, half of the random draws hit the greedy action anyway
    host_actions = host_actor.act(obs, step=10_000)
    assert isinstance(host_actions, np.ndarray) and host_actions.shape == (4096,)
    assert isinstance(env.step(actions).rewards, torch.Tensor)


def test_ddpg_actor_on_the_device_stays_within_the_bounds():
    env = BatchedPendulum(512, seed=0, device="cpu", output="torch")
    ddpg = algorithm("ddpg")
    config = ddpg.Config(learning_starts=100, exploration_noise=0.5)
    actor = ddpg.make_actor(env.spec, GpuCompute("cpu"), config, seed=0)
    actor.load_weights(ddpg.make_learner(env.spec, GpuCompute("cpu"), config, seed=0).weights(), 0)
    obs = env.reset(seed=0)
    for step in (0, 1000):  # uniform warm-up, then policy plus noise
        actions = actor.act(obs, step)
        assert isinstance(actions, torch.Tensor) and actions.shape == (512, 1)
        assert float(actions.min()) >= -2.0 and float(actions.max()) <= 2.0 and float(actions.std()) > 0.1


@pytest.mark.parametrize("kind", ["numpy", "tensor"])
def test_learner_priorities_come_back_as_the_sample_came(kind):
    env = BatchedCartPole(1, seed=0, device="cpu")
    dqn = algorithm("dqn")
    learner = dqn.make_learner(env.spec, GpuCompute("cpu"), dqn.Config(), seed=0)
    rng = np.random.default_rng(0)
    transitions = {"obs": rng.standard_normal((32, 4)).astype(np.float32), "action": rng.integers(0, 2, 32),
                   "reward": np.ones(32, np.float32), "next_obs": rng.standard_normal((32, 4)).astype(np.float32),
                   "done": np.zeros(32, np.float32)}
    indices, weights = np.arange(32), np.ones(32, np.float32)
    if kind == "tensor":
        transitions = {k: torch.as_tensor(v) for k, v in transitions.items()}
        indices, weights = torch.as_tensor(indices), torch.as_tensor(weights)
    priorities, info = learner.update(Sample(indices=indices, weights=weights, transitions=transitions))
    assert isinstance(priorities, np.ndarray if kind == "numpy" else torch.Tensor)
    assert priorities.shape == (32,) and float(priorities.min()) > 0
    assert isinstance(info["loss"], torch.Tensor)  # no float(): that would wait for the device every update
