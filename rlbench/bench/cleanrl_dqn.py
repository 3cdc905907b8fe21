"""The reference rlbench's DQN throughput is compared with: a single-file DQN loop as CleanRL's dqn.py
writes it (its hyperparameters, its structure), on the same machine and in the same process.

Settings: CleanRL's `Args` defaults in cleanrl/dqn.py (github.com/vwxyzjn/cleanrl, read at commit
fe8d8a0): CartPole-v1, Adam lr 2.5e-4, buffer 10,000, gamma 0.99, hard target copy (tau 1.0) every
500 env steps, batch 128, epsilon 1 -> 0.05 linearly over half the run, learning from step 10,000,
one update every 10 env steps, a 120-84 ReLU Q-network.

What CleanRL does and this keeps: a gymnasium SyncVectorEnv of one env wrapped in
RecordEpisodeStatistics, a torch forward per step to pick the greedy action, an SB3-style numpy replay
buffer whose samples are copied into torch tensors, an MSE TD loss on a vanilla (not double) target,
and a hard target copy every `target_network_frequency` env steps. Its clock starts after the
networks are built (CleanRL's `start_time`); what comes before is reported as start-up. What it
leaves out: tensorboard logging and model saving (I/O, not compute). One change for gymnasium >=
1.0: the vector env resets in the same step (SAME_STEP autoreset), so the final observation comes from
`infos`, as it did with the gymnasium 0.29 CleanRL was written for.

The SB3-style buffer, the episode-return bookkeeping and the greedy evaluation here are shared with
the DDPG loop (rlbench.bench.cleanrl_ddpg); the last two and the epsilon schedule with the Atari loop
(rlbench.bench.cleanrl_dqn_atari).
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

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
    sampling with np.random.randint, samples copied into torch tensors (torch.tensor, as SB3's to_torch)."""

    def __init__(self, size: int, obs_shape: tuple[int, ...], obs_dtype: Any, action_shape: tuple[int, ...] = (1,),
                 action_dtype: Any = np.int64) -> None:
        self.size, self.pos, self.full = size, 0, False
        self.observations = np.zeros((size, *obs_shape), dtype=obs_dtype)
        self.next_observations = np.zeros((size, *obs_shape), dtype=obs_dtype)
        self.actions = np.zeros((size, *action_shape), dtype=action_dtype)
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


def make_vector_env(env_id: str, seed: int):
    """CleanRL's make_env: one env in RecordEpisodeStatistics inside a SyncVectorEnv."""
    import gymnasium as gym

    def make_env():
        env = gym.wrappers.RecordEpisodeStatistics(gym.make(env_id))
        env.action_space.seed(seed)
        return env

    return gym.vector.SyncVectorEnv([make_env], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


def seeded_vector_env(env_id: str, seed: int):
    """CleanRL's prologue: seed Python's, numpy's and torch's generators, then make the vector env."""
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return make_vector_env(env_id, seed)


def finished_returns(infos: dict) -> list[float]:
    """Returns of the episodes that ended in this vector step (RecordEpisodeStatistics' records)."""
    if "final_info" not in infos or "episode" not in infos["final_info"]:
        return []
    finished = infos["final_info"]
    return [float(r) for r, done in zip(finished["episode"]["r"], finished["_episode"]) if done]


def evaluate_greedy(env_id: str, act: Callable[[np.ndarray], np.ndarray], episodes: int, seed: int,
                    make_envs: Callable[[str, int], Any] = make_vector_env) -> dict[str, float]:
    """Mean and spread of `episodes` returns of the greedy policy `act` (observation batch -> actions)
    on a fresh env from `make_envs` (the loop's own make_env), seeded as rlbench's own evaluation is
    (seed + rlbench.runner.EVAL_SEED_OFFSET)."""
    import torch

    from rlbench.runner import EVAL_SEED_OFFSET

    envs = make_envs(env_id, seed + EVAL_SEED_OFFSET)
    returns: list[float] = []
    obs, _ = envs.reset(seed=seed + EVAL_SEED_OFFSET)
    with torch.no_grad():
        while len(returns) < episodes:
            obs, _, _, _, infos = envs.step(act(obs))
            returns.extend(finished_returns(infos))
    envs.close()
    values = np.asarray(returns[:episodes])
    return {"episodes": episodes, "mean_return": float(values.mean()), "std_return": float(values.std())}


def record_finished(curve: list[dict[str, float]], infos: dict, global_step: int, start_time: float) -> None:
    """Add the episodes that ended in this vector step to `curve`, as points of rlbench's learning
    curve: the env steps taken, the seconds since the loop's clock started, the return."""
    returns = finished_returns(infos)
    if returns:
        seconds = round(time.perf_counter() - start_time, 4)
        curve.extend({"step": global_step + 1, "time_s": seconds, "return": r} for r in returns)


def loop_result(args: Any, built_t: float, entered_t: float, wall: float, curve: list[dict[str, float]],
                evaluation: dict[str, float] | None) -> dict:
    """What a CleanRL-style loop reports: its steady rate (CleanRL's clock: after the networks are
    built), start-up before that, and the returns seen in training (record_finished's curve) and in
    greedy evaluation."""
    return {"settings": asdict(args), "env_steps": args.total_timesteps, "wall_s": wall,
            "startup_s": built_t - entered_t, "env_steps_per_s": args.total_timesteps / wall,
            "learning_curve": curve, "evaluation": evaluation}


def linear_schedule(start_e: float, end_e: float, duration: float, t: int) -> float:
    slope = (end_e - start_e) / duration
    return max(slope * t + start_e, end_e)


def run(args: CleanRLDQNArgs, eval_episodes: int) -> dict:
    """Train; returns the steady env steps/s, start-up and returns (see loop_result)."""
    entered = time.perf_counter()
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    device = torch.device("cpu")
    envs = seeded_vector_env(args.env_id, args.seed)
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

    curve: list[dict[str, float]] = []
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
        record_finished(curve, infos, global_step, start_time)

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
    evaluation = None
    if eval_episodes:
        evaluation = evaluate_greedy(args.env_id, lambda o: torch.argmax(q_network(torch.Tensor(o)), dim=1).numpy(),
                                     eval_episodes, args.seed)
    return loop_result(args, start_time, entered, wall, curve, evaluation)
