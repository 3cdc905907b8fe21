"""DQN (Mnih et al. 2015) with double-DQN (van Hasselt et al. 2016) and prioritized-replay options.

Written once against the protocols. The Q-network is chosen from the spec (`q_network`): an MLP of
`hidden_sizes` for vector observations, the CNN rlbench.kit.networks.image_network picks for image
ones (Nature's for Atari frames, MinAtar's for its boards), which takes uint8 frames as they come and
casts them on the learner's device. The actor runs epsilon-greedy over the compute backend's
inference engine for it (`mlp_inference` or `cnn_inference`: numpy on the CPU backend, so actors never
import torch); the learner runs torch on `compute.torch_device()` and publishes the Q-network's weights
as [W0, b0, W1, b1, ...] (dense W of shape (in, out), conv W as torch keeps it; ConvNetSpec.weight_shapes()).
`DQN.presets` holds the reference settings per environment family (CleanRL's dqn_atari.py for Atari,
MinAtar's own DQN for MinAtar).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from rlbench.algorithms.common import ReplayLoopConfig, network_shapes
from rlbench.arrays import same_kind, to_host
from rlbench.builtin import capabilities as caps
from rlbench.errors import RlbenchError
from rlbench.kit.networks import ConvNetSpec, image_network
from rlbench.protocols import EnvSpec, Sample


@dataclass
class DQNConfig(ReplayLoopConfig):
    # Tuned for CartPole-v1 on prioritized replay: greedy mean 500 / 226 / 292 (seeds 0 / 1 / 2, 10 episodes).
    total_steps: int = 30_000
    buffer_size: int = 50_000
    batch_size: int = 128
    learning_starts: int = 1_000
    train_every: int = 1
    # Weights reach actors every 50 updates: Ape-X and R2D2 copy them every 400 frames (100 env steps,
    # here as many updates), Acme's DQN every 1000 actor steps; every update sent the whole policy on
    # each one (2 GB in a 30k-step run across hosts). Staleness is in every result.
    publish_every: int = 50
    hidden_sizes: tuple[int, ...] = (128, 128)  # the MLP's (vector observations; an image's CNN is fixed)
    learning_rate: float = 1e-3
    gamma: float = 0.99
    target_update_every: int = 250  # learner updates between target-network updates
    tau: float = 1.0  # target <- tau * online + (1 - tau) * target at each target update
    double_dqn: bool = True
    loss: str = "huber"  # or "mse"
    max_grad_norm: float = 10.0  # 0 disables gradient clipping
    epsilon_start: float = 1.0
    epsilon_end: float = 0.05
    exploration_steps: int = 10_000  # env steps over which epsilon decays linearly


# Settings per environment family (EnvironmentCapabilities.family), applied over DQNConfig's defaults and
# under a run's --hp overrides (rlbench.config.run_hyperparameters): each source's own, in DQNConfig's terms.
# Periods counted in env steps by the source are converted to learner updates (/ train_every), as
# rlbench.bench.algo.dqn_hyperparameters does for CleanRL's dqn.py. Not set: publish_every (how often actors
# get weights is rlbench's, not the algorithm's) and hidden_sizes (an image's CNN is fixed by its spec).
ATARI = {  # CleanRL's dqn_atari.py Args (vwxyzjn/cleanrl): Adam, MSE loss, no double DQN, no gradient clipping
    "total_steps": 10_000_000, "buffer_size": 1_000_000, "learning_rate": 1e-4, "gamma": 0.99,
    "tau": 1.0, "target_update_every": 1_000 // 4,  # target_network_frequency 1000 env steps / train_frequency 4
    "batch_size": 32, "epsilon_start": 1.0, "epsilon_end": 0.01,
    "exploration_steps": 1_000_000,  # exploration_fraction 0.10 of total_timesteps 10M
    "learning_starts": 80_000, "train_every": 4, "loss": "mse", "double_dqn": False, "max_grad_norm": 0.0,
}
MINATAR = {  # MinAtar's own DQN (Young & Tian 2019; kenjyoung/MinAtar examples/dqn.py): Huber loss, no double
    # DQN, no gradient clipping, a target copy every 1000 updates (one per frame). It steps centered RMSProp
    # (alpha 0.95, momentum 0.95, eps 0.01) at 2.5e-4; rlbench's DQN steps Adam, here at the same rate.
    "total_steps": 5_000_000, "buffer_size": 100_000, "learning_rate": 2.5e-4, "gamma": 0.99,
    "tau": 1.0, "target_update_every": 1_000, "batch_size": 32, "train_every": 1, "learning_starts": 5_000,
    # epsilon 1 -> 0.1 over the 100,000 frames after the 5,000 random ones: ends where MinAtar's does
    "epsilon_start": 1.0, "epsilon_end": 0.1, "exploration_steps": 105_000,
    "loss": "huber", "double_dqn": False, "max_grad_norm": 0.0,
}


def epsilon_at(config: DQNConfig, step: int) -> float:
    fraction = min(1.0, step / max(1, config.exploration_steps))
    return config.epsilon_start + fraction * (config.epsilon_end - config.epsilon_start)


QNetwork = list[int] | ConvNetSpec  # an MLP's layer sizes, or a CNN


def q_network(spec: EnvSpec, config: DQNConfig) -> QNetwork:
    """The Q-network for this spec: a CNN for image observations, an MLP of config.hidden_sizes for flat ones."""
    if spec.action_kind != "discrete" or spec.n_actions is None:
        raise RlbenchError(f"dqn needs discrete actions; {spec.id} has {spec.action_kind} actions")
    if spec.observation_kind == "image":
        return image_network(spec.observation_shape, spec.observation_dtype, spec.n_actions)
    if len(spec.observation_shape) != 1:
        raise RlbenchError(f"dqn needs flat observations or uint8 images; {spec.id} has {spec.observation_dtype} "
                           f"observations of shape {spec.observation_shape}")
    return [spec.observation_shape[0], *config.hidden_sizes, spec.n_actions]


def inference_engine(compute: Any, network: QNetwork) -> Any:
    """The compute backend's engine for the Q-network (identity output: Q-values)."""
    if isinstance(network, ConvNetSpec):
        return compute.cnn_inference(network)
    return compute.mlp_inference(network, hidden_activation="relu", output_activation="identity")


class DQNActor:
    """Epsilon-greedy over the Q-values the compute backend's inference engine returns.

    Observations that are device tensors stay on the device when the engine accepts tensors (the
    draws then come from a torch generator there); otherwise they are copied to the host.
    """

    def __init__(self, spec: EnvSpec, compute: Any, config: DQNConfig, seed: int) -> None:
        self.config = config
        self.n_actions = int(spec.n_actions or 0)
        self.q_values = inference_engine(compute, q_network(spec, config))
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.device_generator = None

    def act(self, observations: Any, step: int) -> Any:
        if not isinstance(observations, np.ndarray):
            if getattr(self.q_values, "accepts_tensors", False):
                return self.act_on_device(observations, step)
            observations = to_host(observations)
        n = len(observations)
        explore = self.rng.random(n) < epsilon_at(self.config, step)
        if not explore.any():
            return self.greedy(observations)
        random_actions = self.rng.integers(self.n_actions, size=n)
        if explore.all():  # no need for the network's opinion
            return random_actions
        return np.where(explore, random_actions, self.greedy(observations))

    def act_on_device(self, observations: Any, step: int) -> Any:
        import torch

        device = observations.device
        if self.device_generator is None:
            self.device_generator = torch.Generator(device=device).manual_seed(self.seed)
        n, generator = observations.shape[0], self.device_generator
        explore = torch.rand(n, generator=generator, device=device) < epsilon_at(self.config, step)
        random_actions = torch.randint(self.n_actions, (n,), generator=generator, device=device)
        return torch.where(explore, random_actions, self.q_values(observations).argmax(dim=1))

    def greedy(self, observations: np.ndarray) -> np.ndarray:
        return np.argmax(self.q_values(observations), axis=1)

    def load_weights(self, weights: Sequence[np.ndarray], version: int) -> None:
        self.q_values.load(weights, version)

    def initial_priorities(self, transitions: dict[str, np.ndarray]) -> np.ndarray:
        """Ape-X: |TD error| under the actor's own (possibly stale) weights, so new experience enters
        a prioritized replay with a priority that means something rather than the maximum seen."""
        q = self.q_values(transitions["obs"])
        next_q = self.q_values(transitions["next_obs"]).max(axis=1)
        target = transitions["reward"] + self.config.gamma * (1.0 - transitions["done"]) * next_q
        taken = q[np.arange(len(q)), transitions["action"]]
        return np.abs(target - taken) + self.config.per_eps


class DQNLearner:
    """TD learning of Q(s, a) with a target network; the loss is weighted by importance weights.

    `update(sample)` serves the local and distributed loops. The one-device loop
    (rlbench/runtime/device_loop.py) calls `prepare_capture` once, then `explore` and
    `device_updates`, which it captures in CUDA graphs: the same math, with the schedules
    (epsilon, the target network's period) computed on the device instead of from host counters.
    """

    def __init__(self, spec: EnvSpec, compute: Any, config: DQNConfig, seed: int) -> None:
        import torch

        from rlbench.algorithms.networks import adam, build_network

        if config.loss not in ("huber", "mse"):
            raise RlbenchError(f"dqn loss must be 'huber' or 'mse', got {config.loss!r}")
        self.config = config
        self.device = compute.torch_device()
        torch.manual_seed(seed)
        network = q_network(spec, config)
        self.q_network = build_network(network, device=self.device)
        self.target_network = build_network(network, device=self.device)
        self.target_network.load_state_dict(self.q_network.state_dict())
        self.optimizer = adam(self.q_network.parameters(), config.learning_rate)
        self.updates = 0
        self.n_actions = int(spec.n_actions)
        # Sampled observations reach the device as they were stored: uint8 frames are cast by the network
        self.observation_dtype = torch.uint8 if isinstance(network, ConvNetSpec) else torch.float32
        self.generator: Any = None  # exploration draws on the device (prepare_capture)
        self.updates_on_device: Any = None  # the update count the target network's schedule reads on the device

    def td_target(self, reward, next_obs, done):
        """r + gamma * (1 - done) * Q_target(s', a*), a* from the online net when double-DQN."""
        import torch

        with torch.no_grad():
            next_q_target = self.target_network(next_obs)
            if self.config.double_dqn:
                best = self.q_network(next_obs).argmax(dim=1, keepdim=True)
            else:
                best = next_q_target.argmax(dim=1, keepdim=True)
            next_q = next_q_target.gather(1, best).squeeze(1)
            return reward + self.config.gamma * (1.0 - done) * next_q

    def learn(self, obs, actions, reward, next_obs, done, weights):
        """One gradient step on a batch of device tensors (actions int64 of shape (batch, 1)):
        returns the TD target, Q(s, a) before the step and the loss, detached."""
        import torch
        from torch.nn import functional as F

        config = self.config
        target = self.td_target(reward, next_obs, done)
        q = self.q_network(obs).gather(1, actions).squeeze(1)
        if config.loss == "huber":
            elementwise = F.smooth_l1_loss(q, target, reduction="none")
        else:
            elementwise = F.mse_loss(q, target, reduction="none")
        loss = (weights * elementwise).mean()

        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if config.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.q_network.parameters(), config.max_grad_norm)
        self.optimizer.step()
        return target, q.detach(), loss.detach()

    def update(self, sample: Sample) -> tuple[np.ndarray, dict[str, float]]:
        import torch

        from rlbench.algorithms.networks import as_tensor, soft_update

        t, device, config, observations = sample.transitions, self.device, self.config, self.observation_dtype
        target, q, loss = self.learn(as_tensor(t["obs"], device, observations),
                                     as_tensor(t["action"], device, torch.int64).view(-1, 1),
                                     as_tensor(t["reward"], device), as_tensor(t["next_obs"], device, observations),
                                     as_tensor(t["done"], device), as_tensor(sample.weights, device))
        self.updates += 1
        if self.updates % config.target_update_every == 0:
            soft_update(self.target_network, self.q_network, config.tau)

        # Priorities go back as the sample came (a device memory's tensors stay there), and the info
        # stays in tensors: a float() here would wait for the device on every update.
        priorities = same_kind((target - q).abs() + config.per_eps, sample.indices)
        return priorities, {"loss": loss, "q_mean": q.mean()}

    # -- the one-device loop: captured, no host round trip --------------------------------------------
    def prepare_capture(self, seed: int) -> None:
        """Make updates graph-safe before the first one: a fused, capturable Adam (its step count on
        the device), the update count on the device, and a device generator for exploration."""
        import torch

        from rlbench.algorithms.networks import capturable_adam

        if self.updates:
            raise RlbenchError("prepare_capture must come before the learner's first update")
        self.optimizer = capturable_adam(self.q_network.parameters(), self.config.learning_rate)
        self.updates_on_device = torch.zeros((), dtype=torch.int64, device=self.device)
        self.generator = torch.Generator(device=self.device).manual_seed(seed)

    def explore(self, observations, env_step):
        """Epsilon-greedy actions (int64) from the online network, epsilon from `env_step`, a 0-dim
        device tensor of env steps so far (epsilon_at on the device)."""
        import torch

        config, n, device = self.config, observations.shape[0], observations.device
        fraction = (env_step / max(1, config.exploration_steps)).clamp(max=1.0)
        epsilon = config.epsilon_start + fraction * (config.epsilon_end - config.epsilon_start)
        explore = torch.rand(n, generator=self.generator, device=device) < epsilon
        random_actions = torch.randint(self.n_actions, (n,), generator=self.generator, device=device)
        with torch.no_grad():
            greedy = self.q_network(observations).argmax(dim=1)
        return torch.where(explore, random_actions, greedy)

    def device_updates(self, replay, count: int, beta) -> None:
        """`count` updates straight from a device memory (replay.draw / set_priorities, beta a 0-dim
        device tensor), each as update() does it. The target network follows its period by a device
        count: lerp by tau on the update that completes a period, by 0 (exactly no change) otherwise.
        Host counters (self.updates) are the caller's: a captured call's Python runs once, at capture."""
        from rlbench.algorithms.networks import soft_update

        config = self.config
        for _ in range(count):
            sample = replay.draw(config.batch_size, beta)
            t = sample.transitions
            target, q, _ = self.learn(t["obs"], t["action"].view(-1, 1), t["reward"], t["next_obs"], t["done"],
                                      sample.weights)
            self.updates_on_device += 1
            period_ends = (self.updates_on_device % config.target_update_every == 0).to(q.dtype)
            soft_update(self.target_network, self.q_network, period_ends * config.tau)
            replay.set_priorities(sample.indices, (target - q).abs() + config.per_eps)

    def weights(self) -> list[np.ndarray]:
        from rlbench.algorithms.networks import export_weights

        return export_weights(self.q_network)

    CHECKPOINTED = ("q_network", "target_network", "optimizer")  # with `updates`: what the next update reads

    def state_dict(self) -> dict[str, Any]:
        from rlbench.algorithms.networks import state_of

        return state_of(self, self.CHECKPOINTED)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from rlbench.algorithms.networks import load_state

        load_state(self, self.CHECKPOINTED, state)


class DQN:
    name = "dqn"
    Config = DQNConfig
    # Its learner offers prepare_capture / explore / device_updates: the one-device loop can run it.
    captures_on_one_device = True

    capabilities = caps.DQN
    presets = {"atari": ATARI, "minatar": MINATAR}

    def policy_shapes(self, spec: EnvSpec, config: DQNConfig) -> list[tuple[int, ...]]:
        return network_shapes(q_network(spec, config))

    def make_actor(self, spec: EnvSpec, compute: Any, config: DQNConfig, seed: int) -> DQNActor:
        return DQNActor(spec, compute, config, seed)

    def make_learner(self, spec: EnvSpec, compute: Any, config: DQNConfig, seed: int) -> DQNLearner:
        return DQNLearner(spec, compute, config, seed)
