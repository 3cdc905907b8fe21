"""The reference rlbench's DDPG throughput is compared with: a single-file DDPG loop as CleanRL's
ddpg_continuous_action.py writes it (its structure and settings), in the same process.

Settings: CleanRL's `Args` defaults in cleanrl/ddpg_continuous_action.py (github.com/vwxyzjn/cleanrl,
read at commit fe8d8a0): actor and critic 256-256 ReLU, Adam lr 3e-4 for both, gamma 0.99, tau
0.005, batch 256, buffer 1e6, Gaussian exploration noise of std 0.1 x the action scale, a policy
(and target) update every 2nd env step. Two departures, both set by the comparison (issue #16) and
stated in the output: Pendulum-v1 instead of Hopper-v4, and learning from step 1,000 instead of
25,000, so a short run spends most of its steps learning.

What CleanRL does and this keeps: a SyncVectorEnv of one env in RecordEpisodeStatistics, uniform
random actions before `learning_starts`, then the actor's torch forward plus torch.normal noise,
clipped to the bounds; an SB3-style numpy buffer copied into torch tensors per sample; an MSE critic
loss on the target networks' value; a delayed actor update, and soft target updates written as
CleanRL writes them (a Python loop over parameters). Its clock starts after the networks are built
(CleanRL's `start_time`). Left out: tensorboard logging and model saving (I/O, not compute).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from rlbench.bench.cleanrl_dqn import (SimpleReplayBuffer, evaluate_greedy, loop_result, record_finished,
                                       seeded_vector_env)


@dataclass
class CleanRLDDPGArgs:
    env_id: str = "Pendulum-v1"  # CleanRL: Hopper-v4
    seed: int = 1
    total_timesteps: int = 1_000_000
    learning_rate: float = 3e-4
    buffer_size: int = 1_000_000
    gamma: float = 0.99
    tau: float = 0.005
    batch_size: int = 256
    exploration_noise: float = 0.1
    learning_starts: int = 1_000  # CleanRL: 25e3
    policy_frequency: int = 2


def run(args: CleanRLDDPGArgs, eval_episodes: int) -> dict:
    """Train; returns the steady env steps/s, start-up and returns (rlbench.bench.cleanrl_dqn.loop_result)."""
    entered = time.perf_counter()
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    device = torch.device("cpu")
    envs = seeded_vector_env(args.env_id, args.seed)
    obs_dim = int(np.prod(envs.single_observation_space.shape))
    action_shape = envs.single_action_space.shape
    action_dim = int(np.prod(action_shape))

    class QNetwork(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(obs_dim + action_dim, 256)
            self.fc2 = nn.Linear(256, 256)
            self.fc3 = nn.Linear(256, 1)

        def forward(self, x, a):
            x = torch.cat([x, a], 1)
            x = F.relu(self.fc1(x))
            x = F.relu(self.fc2(x))
            return self.fc3(x)

    class Actor(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(obs_dim, 256)
            self.fc2 = nn.Linear(256, 256)
            self.fc_mu = nn.Linear(256, action_dim)
            space = envs.single_action_space
            self.register_buffer("action_scale", torch.tensor((space.high - space.low) / 2.0, dtype=torch.float32))
            self.register_buffer("action_bias", torch.tensor((space.high + space.low) / 2.0, dtype=torch.float32))

        def forward(self, x):
            x = F.relu(self.fc1(x))
            x = F.relu(self.fc2(x))
            x = torch.tanh(self.fc_mu(x))
            return x * self.action_scale + self.action_bias

    actor = Actor().to(device)
    qf1 = QNetwork().to(device)
    qf1_target = QNetwork().to(device)
    target_actor = Actor().to(device)
    target_actor.load_state_dict(actor.state_dict())
    qf1_target.load_state_dict(qf1.state_dict())
    q_optimizer = torch.optim.Adam(list(qf1.parameters()), lr=args.learning_rate)
    actor_optimizer = torch.optim.Adam(list(actor.parameters()), lr=args.learning_rate)
    rb = SimpleReplayBuffer(args.buffer_size, envs.single_observation_space.shape, np.float32, action_shape,
                            envs.single_action_space.dtype)
    low, high = envs.single_action_space.low, envs.single_action_space.high

    curve: list[dict[str, float]] = []
    start_time = time.perf_counter()
    obs, _ = envs.reset(seed=args.seed)
    for global_step in range(args.total_timesteps):
        if global_step < args.learning_starts:
            actions = np.array([envs.single_action_space.sample() for _ in range(envs.num_envs)])
        else:
            with torch.no_grad():
                actions = actor(torch.Tensor(obs).to(device))
                actions += torch.normal(0, actor.action_scale * args.exploration_noise)
                actions = actions.cpu().numpy().clip(low, high)

        next_obs, rewards, terminations, truncations, infos = envs.step(actions)
        record_finished(curve, infos, global_step, start_time)

        real_next_obs = next_obs.copy()
        for idx, trunc in enumerate(truncations):
            if trunc:
                real_next_obs[idx] = infos["final_obs"][idx]
        rb.add(obs[0], real_next_obs[0], actions[0], rewards[0], terminations[0])
        obs = next_obs

        if global_step > args.learning_starts:
            observations, b_actions, next_observations, dones, b_rewards = rb.sample(args.batch_size)
            with torch.no_grad():
                next_state_actions = target_actor(next_observations)
                qf1_next_target = qf1_target(next_observations, next_state_actions)
                next_q_value = b_rewards.flatten() + (1 - dones.flatten()) * args.gamma * qf1_next_target.view(-1)

            qf1_a_values = qf1(observations, b_actions).view(-1)
            qf1_loss = F.mse_loss(qf1_a_values, next_q_value)
            q_optimizer.zero_grad()
            qf1_loss.backward()
            q_optimizer.step()

            if global_step % args.policy_frequency == 0:
                actor_loss = -qf1(observations, actor(observations)).mean()
                actor_optimizer.zero_grad()
                actor_loss.backward()
                actor_optimizer.step()
                for param, target_param in zip(actor.parameters(), target_actor.parameters()):
                    target_param.data.copy_(args.tau * param.data + (1 - args.tau) * target_param.data)
                for param, target_param in zip(qf1.parameters(), qf1_target.parameters()):
                    target_param.data.copy_(args.tau * param.data + (1 - args.tau) * target_param.data)

    wall = time.perf_counter() - start_time
    envs.close()
    evaluation = None
    if eval_episodes:
        evaluation = evaluate_greedy(args.env_id, lambda o: actor(torch.Tensor(o)).numpy(), eval_episodes, args.seed)
    return loop_result(args, start_time, entered, wall, curve, evaluation)
