"""The reference rlbench's DQN on Atari frames is compared with: a single-file loop as CleanRL's
dqn_atari.py writes it (its wrappers, network, replay buffer, hyperparameters and structure), on the
same machine and in the same process.

Settings: CleanRL's `Args` defaults in cleanrl/dqn_atari.py (github.com/vwxyzjn/cleanrl, read at
commit fe8d8a0): BreakoutNoFrameskip-v4, Adam lr 1e-4, buffer 1,000,000, gamma 0.99, hard target copy
(tau 1.0) every 1,000 env steps, batch 32, epsilon 1 -> 0.01 linearly over the first 10 % of the run,
learning from step 80,000, one update every 4 env steps, the Nature-DQN network (Mnih et al. 2015:
32x8/4, 64x4/2, 64x3/1 convolutions, 512 hidden) on uint8 frames divided by 255 in its forward.

The environment is CleanRL's own id: ale-py 0.12 still registers BreakoutNoFrameskip-v4 (frameskip 1,
repeat_action_probability 0.0, full_action_space False, 108,000 frames at most), which is
`ALE/Breakout-v5` made with frameskip=1 and repeat_action_probability=0.0. Around it, in CleanRL's
order: RecordEpisodeStatistics on the raw game, stable-baselines3's NoopResetEnv(30),
MaxAndSkipEnv(4), EpisodicLifeEnv, FireResetEnv (games with FIRE), ClipRewardEnv (CleanRL imported
them from `stable_baselines3.common.atari_wrappers` until it vendored the same code into
cleanrl_utils in 004f8a0), then gymnasium's ResizeObservation (84, 84), GrayscaleObservation and
FrameStackObservation(4) (gymnasium 1.x's names for CleanRL's ResizeObservation, GrayScaleObservation
and FrameStack). The memory is stable-baselines3's `ReplayBuffer(..., optimize_memory_usage=True,
handle_timeout_termination=False)` exactly as CleanRL builds it: stacked observations stored once
(next_obs is the next slot's obs), sampled into torch tensors.

What it returns: training returns are RecordEpisodeStatistics' under every wrapper, i.e. the raw
(unclipped) score of whole games (all lives), as CleanRL logs `episodic_return`; evaluation is
CleanRL's dqn_eval.py: the training wrappers, epsilon-greedy with epsilon = end_e (0.01), the raw
score of whole games. Its clock starts after the networks and the memory are built (CleanRL's
`start_time`). Left out: tensorboard logging and model saving (I/O, not compute). Two changes for
gymnasium >= 1.0, as in rlbench.bench.cleanrl_dqn: the vector env resets in the same step (SAME_STEP
autoreset) and a truncated episode's last observation comes from `infos["final_obs"]`.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import numpy as np

from rlbench.bench.cleanrl_dqn import evaluate_greedy, linear_schedule, loop_result, record_finished


@dataclass
class CleanRLDQNAtariArgs:
    env_id: str = "BreakoutNoFrameskip-v4"
    seed: int = 1
    total_timesteps: int = 10_000_000
    learning_rate: float = 1e-4
    buffer_size: int = 1_000_000
    gamma: float = 0.99
    tau: float = 1.0
    target_network_frequency: int = 1000
    batch_size: int = 32
    start_e: float = 1.0
    end_e: float = 0.01
    exploration_fraction: float = 0.10
    learning_starts: int = 80_000
    train_frequency: int = 4


def make_atari_env(env_id: str, seed: int):
    """CleanRL dqn_atari.py's make_env (one env, no video) in a SAME_STEP SyncVectorEnv."""
    import ale_py
    import gymnasium as gym
    from stable_baselines3.common.atari_wrappers import (ClipRewardEnv, EpisodicLifeEnv, FireResetEnv, MaxAndSkipEnv,
                                                         NoopResetEnv)

    gym.register_envs(ale_py)

    def thunk():
        env = gym.wrappers.RecordEpisodeStatistics(gym.make(env_id))
        env = NoopResetEnv(env, noop_max=30)
        env = MaxAndSkipEnv(env, skip=4)
        env = EpisodicLifeEnv(env)
        if "FIRE" in env.unwrapped.get_action_meanings():
            env = FireResetEnv(env)
        env = ClipRewardEnv(env)
        env = gym.wrappers.ResizeObservation(env, (84, 84))
        env = gym.wrappers.GrayscaleObservation(env)
        env = gym.wrappers.FrameStackObservation(env, 4)
        env.action_space.seed(seed)
        return env

    return gym.vector.SyncVectorEnv([thunk], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


def run(args: CleanRLDQNAtariArgs, eval_episodes: int) -> dict:
    """Train; returns the steady env steps/s, start-up and returns (rlbench.bench.cleanrl_dqn.loop_result)."""
    entered = time.perf_counter()
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from stable_baselines3.common.buffers import ReplayBuffer

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    device = torch.device("cpu")
    envs = make_atari_env(args.env_id, args.seed)
    n_actions = int(envs.single_action_space.n)

    class QNetwork(nn.Module):
        def __init__(self):
            super().__init__()
            self.network = nn.Sequential(nn.Conv2d(4, 32, 8, stride=4), nn.ReLU(), nn.Conv2d(32, 64, 4, stride=2),
                                         nn.ReLU(), nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten(),
                                         nn.Linear(3136, 512), nn.ReLU(), nn.Linear(512, n_actions))

        def forward(self, x):
            return self.network(x / 255.0)

    q_network = QNetwork().to(device)
    optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate)
    target_network = QNetwork().to(device)
    target_network.load_state_dict(q_network.state_dict())
    rb = ReplayBuffer(args.buffer_size, envs.single_observation_space, envs.single_action_space, device,
                      optimize_memory_usage=True, handle_timeout_termination=False)

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
        for idx, trunc in enumerate(truncations):
            if trunc:
                real_next_obs[idx] = infos["final_obs"][idx]
        rb.add(obs, real_next_obs, actions, rewards, terminations, infos)
        obs = next_obs

        if global_step > args.learning_starts:
            if global_step % args.train_frequency == 0:
                data = rb.sample(args.batch_size)
                with torch.no_grad():
                    target_max, _ = target_network(data.next_observations).max(dim=1)
                    td_target = data.rewards.flatten() + args.gamma * target_max * (1 - data.dones.flatten())
                old_val = q_network(data.observations).gather(1, data.actions).squeeze()
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
        def act(observations: np.ndarray) -> np.ndarray:  # cleanrl_utils/evals/dqn_eval.py, epsilon = end_e
            if random.random() < args.end_e:
                return np.array([envs.single_action_space.sample()])
            return torch.argmax(q_network(torch.Tensor(observations)), dim=1).numpy()

        evaluation = evaluate_greedy(args.env_id, act, eval_episodes, args.seed, make_envs=make_atari_env)
    return loop_result(args, start_time, entered, wall, curve, evaluation)
