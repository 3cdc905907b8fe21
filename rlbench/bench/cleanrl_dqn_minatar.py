"""The peer rlbench's DQN is compared with on MinAtar: a single-file DQN loop written as CleanRL writes
its loops, with the settings of MinAtar's own DQN (CleanRL has no MinAtar script), on the same machine
and in the same process.

Settings: MinAtar's examples/dqn.py (Young & Tian 2019; github.com/kenjyoung/MinAtar, read at 3f078e5):
its network (16 3x3 convolution filters at stride 1, 128 ReLU units, a linear output per action), batch
32, a memory of the last 100,000 transitions, uniformly random actions for the first 5,000 frames and
learning after them, one update per frame, a hard target copy every 1,000 updates, gamma 0.99, the
Huber loss (smooth L1) on a vanilla (not double) target, no gradient clipping, epsilon 1 -> 0.1 over
the 100,000 frames after the first 5,000. The game as MinAtar makes it (sticky actions with probability
0.1, difficulty ramping), raw rewards. One departure, so that this loop and rlbench's DQN with its
"minatar" preset differ only in the harness: Adam at MinAtar's step size 2.5e-4, the optimizer
rlbench's DQN steps, where MinAtar steps centered RMSProp (alpha 0.95, momentum 0.95, eps 0.01);
`optimizer="rmsprop"` runs MinAtar's.

What CleanRL's structure brings: MinAtar's own gymnasium environment (`MinAtar/<Game>-v1`, the game's
minimal action set; minatar.gym, not rlbench's wrapper) in RecordEpisodeStatistics inside a SAME_STEP
SyncVectorEnv, an SB3-style numpy memory (rlbench.bench.cleanrl_dqn.SimpleReplayBuffer) of the boards
as the environment gives them (bool, height x width x channels) where MinAtar keeps a list of float
tensors, and the cast and channels-first permute in the network's forward, as MinAtar's get_state does
per frame. Its clock starts after the networks and the memory are built (CleanRL's `start_time`).
Its evaluation is greedy (epsilon 0), as rlbench's, on the same environment.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import numpy as np

from rlbench.bench.cleanrl_dqn import SimpleReplayBuffer, evaluate_greedy, loop_result, record_finished
from rlbench.errors import RlbenchError


@dataclass
class CleanRLDQNMinAtarArgs:
    env_id: str = "MinAtar/Breakout-v1"
    seed: int = 1
    total_timesteps: int = 5_000_000
    learning_rate: float = 2.5e-4
    optimizer: str = "adam"  # MinAtar: "rmsprop" (centered)
    buffer_size: int = 100_000
    gamma: float = 0.99
    target_network_frequency: int = 1_000  # in updates, as MinAtar counts it
    batch_size: int = 32
    start_e: float = 1.0
    end_e: float = 0.1
    exploration_frames: int = 100_000  # after learning_starts
    learning_starts: int = 5_000
    train_frequency: int = 1


def make_minatar_env(env_id: str, seed: int):
    """MinAtar's gymnasium environment in RecordEpisodeStatistics, in a SAME_STEP SyncVectorEnv."""
    import gymnasium as gym

    if env_id not in gym.registry:
        from minatar.gym import register_envs

        register_envs()

    def thunk():
        env = gym.wrappers.RecordEpisodeStatistics(gym.make(env_id))
        env.action_space.seed(seed)
        return env

    return gym.vector.SyncVectorEnv([thunk], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


def epsilon_at(args: CleanRLDQNMinAtarArgs, frame: int) -> float:
    """MinAtar's behaviour: random before learning starts, then 1 -> end_e over exploration_frames."""
    if frame < args.learning_starts:
        return 1.0
    fraction = min(1.0, (frame - args.learning_starts) / args.exploration_frames)
    return args.start_e + fraction * (args.end_e - args.start_e)


def run(args: CleanRLDQNMinAtarArgs, eval_episodes: int) -> dict:
    """Train; returns the steady env steps/s, start-up and returns (rlbench.bench.cleanrl_dqn.loop_result)."""
    if args.optimizer not in ("adam", "rmsprop"):
        raise RlbenchError(f"optimizer must be 'adam' or 'rmsprop' (MinAtar's centered RMSProp), "
                           f"got {args.optimizer!r}")
    entered = time.perf_counter()
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    device = torch.device("cpu")
    envs = make_minatar_env(args.env_id, args.seed)
    height, width, channels = envs.single_observation_space.shape
    n_actions = int(envs.single_action_space.n)

    class QNetwork(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(channels, 16, kernel_size=3, stride=1)
            self.fc_hidden = nn.Linear((height - 2) * (width - 2) * 16, 128)
            self.output = nn.Linear(128, n_actions)

        def forward(self, x):
            x = F.relu(self.conv(x.permute(0, 3, 1, 2).float()))
            return self.output(F.relu(self.fc_hidden(x.flatten(1))))

    q_network = QNetwork().to(device)
    if args.optimizer == "adam":
        optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate)
    else:
        optimizer = torch.optim.RMSprop(q_network.parameters(), lr=args.learning_rate, alpha=0.95, centered=True,
                                        eps=0.01, momentum=0.95)
    target_network = QNetwork().to(device)
    target_network.load_state_dict(q_network.state_dict())
    rb = SimpleReplayBuffer(args.buffer_size, envs.single_observation_space.shape, envs.single_observation_space.dtype)

    curve: list[dict[str, float]] = []
    updates = 0
    start_time = time.perf_counter()
    obs, _ = envs.reset(seed=args.seed)
    for global_step in range(args.total_timesteps):
        if random.random() < epsilon_at(args, global_step):
            actions = np.array([envs.single_action_space.sample() for _ in range(envs.num_envs)])
        else:
            with torch.no_grad():
                actions = torch.argmax(q_network(torch.as_tensor(obs).to(device)), dim=1).cpu().numpy()

        next_obs, rewards, terminations, truncations, infos = envs.step(actions)
        record_finished(curve, infos, global_step, start_time)

        real_next_obs = next_obs.copy()
        for idx, ended in enumerate(np.logical_or(terminations, truncations)):
            if ended:
                real_next_obs[idx] = infos["final_obs"][idx]
        rb.add(obs[0], real_next_obs[0], actions[0], rewards[0], terminations[0])
        obs = next_obs

        if global_step > args.learning_starts and global_step % args.train_frequency == 0:
            observations, b_actions, next_observations, dones, b_rewards = rb.sample(args.batch_size)
            with torch.no_grad():
                target_max, _ = target_network(next_observations).max(dim=1)
                td_target = b_rewards.flatten() + args.gamma * target_max * (1 - dones.flatten())
            old_val = q_network(observations).gather(1, b_actions).squeeze(1)
            loss = F.smooth_l1_loss(old_val, td_target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            updates += 1
            if updates % args.target_network_frequency == 0:
                target_network.load_state_dict(q_network.state_dict())

    wall = time.perf_counter() - start_time
    envs.close()
    evaluation = None
    if eval_episodes:
        def act(observations: np.ndarray) -> np.ndarray:
            return torch.argmax(q_network(torch.as_tensor(observations)), dim=1).numpy()

        evaluation = evaluate_greedy(args.env_id, act, eval_episodes, args.seed, make_envs=make_minatar_env)
    return loop_result(args, start_time, entered, wall, curve, evaluation)
