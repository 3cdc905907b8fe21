"""The reference rlbench's DQN throughput is compared with: a single-file DQN loop as CleanRL's dqn.py
writes it (its hyperparameters, its structure), on the same machine and in the same process.

What CleanRL does and this keeps: a gymnasium SyncVectorEnv of one env wrapped in
RecordEpisodeStatistics, a torch forward per step to pick the greedy action, an SB3-style numpy replay
buffer whose samples are copied into torch tensors, an MSE TD loss on a vanilla (not double) target,
and a hard target copy every `target_network_frequency` env steps. What it leaves out: tensorboard
logging and model saving (I/O, not compute). One change for gymnasium >= 1.0: the vector env resets
in the same step (SAME_STEP autoreset), so the final observation comes from `infos`, as it did with
the gymnasium 0.29 CleanRL was written for.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import numpy as np


@dataclass
class CleanRLDQNArgs:
    env_id: str = "CartPole-v1"
    seed: int = 1
    total_timesteps: int = 500_000
    learning_rate: float = 2.5e-4
    buffer_size: int = 10_000
    gamma: float = 0.99
    tau: float = 1.0
    target_network_frequency: int = 500
    batch_size: int = 128
    start_e: float = 1.0
    end_e: float = 0.05
    exploration_fraction: float = 0.5
    learning_starts: int = 10_000
    train_frequency: int = 10


class SimpleReplayBuffer:
    """SB3's ReplayBuffer layout for one env: preallocated numpy arrays, a ring position, uniform
    sampling with np.random.randint, samples copied into torch tensors."""

    def __init__(self, size: int, obs_shape: tuple[int, ...], obs_dtype) -> None:
        self.size, self.pos, self.full = size, 0, False
        self.observations = np.zeros((size, *obs_shape), dtype=obs_dtype)
        self.next_observations = np.zeros((size, *obs_shape), dtype=obs_dtype)
        self.actions = np.zeros((size, 1), dtype=np.int64)
        self.rewards = np.zeros((size, 1), dtype=np.float32)
        self.dones = np.zeros((size, 1), dtype=np.float32)

    def add(self, obs, next_obs, action, reward, done) -> None:
        self.observations[self.pos] = obs
        self.next_observations[self.pos] = next_obs
        self.actions[self.pos] = action
        self.rewards[self.pos] = reward
        self.dones[self.pos] = done
        self.pos += 1
        if self.pos == self.size:
            self.full, self.pos = True, 0

    def sample(self, batch_size: int):
        import torch

        upper = self.size if self.full else self.pos
        idx = np.random.randint(0, upper, size=batch_size)
        return (torch.tensor(self.observations[idx]), torch.tensor(self.actions[idx]),
                torch.tensor(self.next_observations[idx]), torch.tensor(self.dones[idx]),
                torch.tensor(self.rewards[idx]))


def linear_schedule(start_e: float, end_e: float, duration: float, t: int) -> float:
    slope = (end_e - start_e) / duration
    return max(slope * t + start_e, end_e)


def run(args: CleanRLDQNArgs) -> dict:
    """Train; returns env steps/s and the episode returns seen."""
    import gymnasium as gym
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    device = torch.device("cpu")

    def make_env():
        env = gym.make(args.env_id)
        env = gym.wrappers.RecordEpisodeStatistics(env)
        env.action_space.seed(args.seed)
        return env

    envs = gym.vector.SyncVectorEnv([make_env], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    n_obs = int(np.prod(envs.single_observation_space.shape))
    n_actions = int(envs.single_action_space.n)

    class QNetwork(nn.Module):
        def __init__(self):
            super().__init__()
            self.network = nn.Sequential(nn.Linear(n_obs, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
                                         nn.Linear(84, n_actions))

        def forward(self, x):
            return self.network(x)

    q_network = QNetwork().to(device)
    optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate)
    target_network = QNetwork().to(device)
    target_network.load_state_dict(q_network.state_dict())
    rb = SimpleReplayBuffer(args.buffer_size, envs.single_observation_space.shape,
                            envs.single_observation_space.dtype)

    episode_returns: list[float] = []
    start_time = time.perf_counter()
    obs, _ = envs.reset(seed=args.seed)
    for global_step in range(args.total_timesteps):
        epsilon = linear_schedule(args.start_e, args.end_e, args.exploration_fraction * args.total_timesteps,
                                  global_step)
        if random.random() < epsilon:
            actions = np.array([envs.single_action_space.sample() for _ in range(envs.num_envs)])
        else:
            q_values = q_network(torch.Tensor(obs).to(device))
            actions = torch.argmax(q_values, dim=1).cpu().numpy()

        next_obs, rewards, terminations, truncations, infos = envs.step(actions)
        if "final_info" in infos and "episode" in infos["final_info"]:
            finished = infos["final_info"]
            episode_returns.extend(float(r) for r, done in zip(finished["episode"]["r"], finished["_episode"]) if done)

        real_next_obs = next_obs.copy()
        for idx, ended in enumerate(np.logical_or(terminations, truncations)):
            if ended:
                real_next_obs[idx] = infos["final_obs"][idx]
        rb.add(obs[0], real_next_obs[0], actions[0], rewards[0], terminations[0])
        obs = next_obs

        if global_step > args.learning_starts:
            if global_step % args.train_frequency == 0:
                observations, b_actions, next_observations, dones, b_rewards = rb.sample(args.batch_size)
                with torch.no_grad():
                    target_max, _ = target_network(next_observations).max(dim=1)
                    td_target = b_rewards.flatten() + args.gamma * target_max * (1 - dones.flatten())
                old_val = q_network(observations).gather(1, b_actions).squeeze()
                loss = F.mse_loss(td_target, old_val)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()

            if global_step % args.target_network_frequency == 0:
                for target_param, q_param in zip(target_network.parameters(), q_network.parameters()):
                    target_param.data.copy_(args.tau * q_param.data + (1.0 - args.tau) * target_param.data)

    wall = time.perf_counter() - start_time
    envs.close()
    return {"env_steps": args.total_timesteps, "wall_s": wall, "env_steps_per_s": args.total_timesteps / wall,
            "episode_returns": episode_returns}
