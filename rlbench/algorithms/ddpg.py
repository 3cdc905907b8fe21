"""DDPG (Lillicrap et al. 2016), as CleanRL's ddpg_continuous_action.py: a deterministic tanh actor
scaled to the action bounds, Gaussian exploration noise, a critic Q(s, a), soft target updates and a
delayed policy update.

The actor runs the published actor network through the compute backend's inference engine (output
activation tanh) and scales it to the bounds itself; the learner runs torch on
`compute.torch_device()`. New priorities are the critic's |TD error|.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from rlbench.algorithms.common import ReplayLoopConfig, mlp_shapes
from rlbench.arrays import same_kind, to_host
from rlbench.builtin import capabilities as caps
from rlbench.errors import RlbenchError
from rlbench.protocols import EnvSpec, Sample


@dataclass
class DDPGConfig(ReplayLoopConfig):
    # Tuned for Pendulum-v1: greedy mean -173 / -173 / -183 (seeds 0 / 1 / 2) after 15k env steps.
    total_steps: int = 15_000
    buffer_size: int = 100_000
    batch_size: int = 128
    learning_starts: int = 2_000  # uniform random actions before this, as CleanRL
    train_every: int = 1
    # Weights reach actors every 50 updates: Ape-X and R2D2 copy them every 400 frames (100 env steps,
    # here as many updates), Acme's DQN every 1000 actor steps; every update sent the whole policy on
    # each one (2 GB in a 30k-step run across hosts). Staleness is in every result.
    publish_every: int = 50
    hidden_sizes: tuple[int, ...] = (128, 128)
    actor_learning_rate: float = 1e-3
    critic_learning_rate: float = 1e-3
    gamma: float = 0.99
    tau: float = 0.005  # soft target update rate
    policy_delay: int = 2  # critic updates per actor (and target) update
    exploration_noise: float = 0.1  # Gaussian std, as a fraction of the half action range


# Settings per environment family (rlbench.config.run_hyperparameters applies them under --hp): CleanRL's
# ddpg_continuous_action.py Args (vwxyzjn/cleanrl), in DDPGConfig's terms (its one learning_rate is both
# networks'; policy_frequency is policy_delay; it trains on every env step after learning_starts).
MUJOCO = {
    "total_steps": 1_000_000, "buffer_size": 1_000_000, "actor_learning_rate": 3e-4, "critic_learning_rate": 3e-4,
    "gamma": 0.99, "tau": 0.005, "batch_size": 256, "exploration_noise": 0.1, "learning_starts": 25_000,
    "policy_delay": 2, "hidden_sizes": (256, 256), "train_every": 1,
}


@dataclass(frozen=True)
class ActionBounds:
    low: np.ndarray
    high: np.ndarray

    @property
    def scale(self) -> np.ndarray:
        return (self.high - self.low) / 2.0

    @property
    def center(self) -> np.ndarray:
        return (self.high + self.low) / 2.0


def action_bounds(spec: EnvSpec) -> ActionBounds:
    if spec.action_kind != "continuous" or spec.action_low is None or spec.action_high is None:
        raise RlbenchError(f"ddpg needs a bounded continuous action space; {spec.id} has {spec.action_kind} actions")
    low, high = np.asarray(spec.action_low, np.float32), np.asarray(spec.action_high, np.float32)
    if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high)) and np.all(high > low)):
        raise RlbenchError(f"ddpg needs finite action bounds with high > low; {spec.id} has {low} .. {high}")
    return ActionBounds(low, high)


def actor_layer_sizes(spec: EnvSpec, config: DDPGConfig) -> list[int]:
    if len(spec.observation_shape) != 1:
        raise RlbenchError(f"ddpg needs flat observations; {spec.id} has shape {spec.observation_shape}")
    return [spec.observation_shape[0], *config.hidden_sizes, int(np.prod(spec.action_shape))]


class DDPGActor:
    """center + scale * tanh-policy(obs), plus clipped Gaussian exploration noise while training.

    Device tensors stay on the device when the engine accepts tensors (as DQNActor)."""

    def __init__(self, spec: EnvSpec, compute: Any, config: DDPGConfig, seed: int) -> None:
        self.config = config
        self.bounds = action_bounds(spec)
        self.action_shape = tuple(spec.action_shape)
        self.policy = compute.mlp_inference(actor_layer_sizes(spec, config), hidden_activation="relu",
                                            output_activation="tanh")
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.device_generator = None
        self.device_bounds: tuple[Any, ...] = ()

    def act(self, observations: Any, step: int) -> Any:
        if not isinstance(observations, np.ndarray):
            if getattr(self.policy, "accepts_tensors", False):
                return self.act_on_device(observations, step)
            observations = to_host(observations)
        n, bounds = len(observations), self.bounds
        if step < self.config.learning_starts:
            return self.rng.uniform(bounds.low, bounds.high, size=(n, *self.action_shape)).astype(np.float32)
        noise = self.rng.normal(0.0, 1.0, size=(n, *self.action_shape)) * (bounds.scale * self.config.exploration_noise)
        return np.clip(self.greedy(observations) + noise, bounds.low, bounds.high).astype(np.float32)

    def greedy(self, observations: np.ndarray) -> np.ndarray:
        squashed = self.policy(observations).reshape(len(observations), *self.action_shape)
        return (self.bounds.center + self.bounds.scale * squashed).astype(np.float32)

    def act_on_device(self, observations: Any, step: int) -> Any:
        import torch

        device = observations.device
        if self.device_generator is None:  # once: a host-to-device copy per step would wait every step
            self.device_generator = torch.Generator(device=device).manual_seed(self.seed)
            self.device_bounds = tuple(torch.as_tensor(v, device=device) for v in
                                       (self.bounds.low, self.bounds.high, self.bounds.center, self.bounds.scale))
        n, generator = observations.shape[0], self.device_generator
        low, high, center, scale = self.device_bounds
        shape = (n, *self.action_shape)
        if step < self.config.learning_starts:
            return low + (high - low) * torch.rand(shape, generator=generator, device=device)
        noise = torch.randn(shape, generator=generator, device=device) * (scale * self.config.exploration_noise)
        greedy = center + scale * self.policy(observations).reshape(shape)
        return torch.clamp(greedy + noise, low, high)

    def load_weights(self, weights: Sequence[np.ndarray], version: int) -> None:
        self.policy.load(weights, version)


class DDPGLearner:
    """Critic by TD, actor by the critic's gradient every policy_delay updates, soft targets.

    `update(sample)` serves the local and distributed loops; the one-device loop
    (rlbench/runtime/device_loop.py) calls `prepare_capture`, `explore` and `device_updates` and
    captures them in CUDA graphs (as DQNLearner)."""

    def __init__(self, spec: EnvSpec, compute: Any, config: DDPGConfig, seed: int) -> None:
        import torch

        from rlbench.algorithms.networks import adam, mlp

        self.config = config
        self.device = device = compute.torch_device()
        torch.manual_seed(seed)
        bounds = action_bounds(spec)
        self.action_scale = torch.as_tensor(bounds.scale.ravel(), device=device)
        self.action_center = torch.as_tensor(bounds.center.ravel(), device=device)
        self.action_low = torch.as_tensor(bounds.low.ravel(), device=device)
        self.action_high = torch.as_tensor(bounds.high.ravel(), device=device)
        self.action_shape = tuple(spec.action_shape)
        self.generator: Any = None  # exploration draws on the device (prepare_capture)
        actor_sizes = actor_layer_sizes(spec, config)
        critic_sizes = [actor_sizes[0] + actor_sizes[-1], *config.hidden_sizes, 1]
        self.actor = mlp(actor_sizes, output_activation="tanh", device=device)
        self.critic = mlp(critic_sizes, device=device)
        self.target_actor = mlp(actor_sizes, output_activation="tanh", device=device)
        self.target_critic = mlp(critic_sizes, device=device)
        self.target_actor.load_state_dict(self.actor.state_dict())
        self.target_critic.load_state_dict(self.critic.state_dict())
        self.actor_optimizer = adam(self.actor.parameters(), lr=config.actor_learning_rate)
        self.critic_optimizer = adam(self.critic.parameters(), lr=config.critic_learning_rate)
        self.updates = 0

    def _policy(self, network, obs):
        return self.action_center + self.action_scale * network(obs)

    def _q(self, network, obs, action):
        import torch

        return network(torch.cat([obs, action], dim=1)).squeeze(1)

    def learn_critic(self, obs, actions, reward, next_obs, done, weights):
        """One critic step on a batch of device tensors: returns |TD error| before it, the critic's loss
        and Q(s, a), detached."""
        import torch

        config = self.config
        with torch.no_grad():
            next_q = self._q(self.target_critic, next_obs, self._policy(self.target_actor, next_obs))
            target = reward + config.gamma * (1.0 - done) * next_q
        q = self._q(self.critic, obs, actions)
        td_error = target - q
        critic_loss = (weights * td_error.pow(2)).mean()
        self.critic_optimizer.zero_grad(set_to_none=True)
        critic_loss.backward()
        self.critic_optimizer.step()
        return td_error.detach().abs(), critic_loss.detach(), q.detach()

    def learn_actor(self, obs):
        """One actor step up the critic's gradient, then both targets follow softly; returns the actor's loss."""
        from rlbench.algorithms.networks import soft_update

        # The actor's loss needs gradients through the critic, not of its weights (the critic's
        # optimizer clears those before its next step anyway): freezing it skips their matmuls.
        self.critic.requires_grad_(False)
        try:
            actor_loss = -self._q(self.critic, obs, self._policy(self.actor, obs)).mean()
            self.actor_optimizer.zero_grad(set_to_none=True)
            actor_loss.backward()
        finally:
            self.critic.requires_grad_(True)
        self.actor_optimizer.step()
        soft_update(self.target_actor, self.actor, self.config.tau)
        soft_update(self.target_critic, self.critic, self.config.tau)
        return actor_loss.detach()

    def update(self, sample: Sample) -> tuple[np.ndarray, dict[str, float]]:
        from rlbench.algorithms.networks import as_tensor

        t, device, config = sample.transitions, self.device, self.config
        obs = as_tensor(t["obs"], device)
        td_abs, critic_loss, q = self.learn_critic(obs, as_tensor(t["action"], device).view(len(obs), -1),
                                                   as_tensor(t["reward"], device), as_tensor(t["next_obs"], device),
                                                   as_tensor(t["done"], device), as_tensor(sample.weights, device))
        info = {"critic_loss": critic_loss, "q_mean": q.mean()}  # tensors: float() would sync
        self.updates += 1
        if self.updates % config.policy_delay == 0:
            info["actor_loss"] = self.learn_actor(obs)
        priorities = same_kind(td_abs + config.per_eps, sample.indices)
        return priorities, info

    # -- the one-device loop: captured, no host round trip --------------------------------------------
    def prepare_capture(self, seed: int) -> None:
        """Make updates graph-safe before the first one: fused, capturable Adams and a device
        generator for exploration."""
        import torch

        from rlbench.algorithms.networks import capturable_adam

        if self.updates:
            raise RlbenchError("prepare_capture must come before the learner's first update")
        self.actor_optimizer = capturable_adam(self.actor.parameters(), self.config.actor_learning_rate)
        self.critic_optimizer = capturable_adam(self.critic.parameters(), self.config.critic_learning_rate)
        self.generator = torch.Generator(device=self.device).manual_seed(seed)

    def launch_refusal(self, count: int) -> str | None:
        """Why `count` updates per launch cannot repeat one captured pattern, or None. The actor steps
        on every policy_delay-th update, decided on the host; a graph replays the pattern it captured,
        which every launch repeats only when it spans whole periods."""
        if count % self.config.policy_delay:
            return (f"ddpg on one device needs updates_per_launch ({count}) to be a multiple of policy_delay "
                    f"({self.config.policy_delay}): each captured launch repeats one critic/actor pattern")
        return None

    def explore(self, observations, env_step):
        """The local actor's actions on the device: uniform over the box before learning_starts env
        steps (`env_step`, a 0-dim device tensor), then the online policy plus clipped Gaussian noise."""
        import torch

        n, device = observations.shape[0], observations.device
        shape = (n, *self.action_shape)
        low, high = self.action_low, self.action_high
        uniform = low + (high - low) * torch.rand(shape, generator=self.generator, device=device)
        noise = torch.randn(shape, generator=self.generator, device=device) * (self.action_scale
                                                                                * self.config.exploration_noise)
        with torch.no_grad():
            greedy = self._policy(self.actor, observations).reshape(shape)
        return torch.where(env_step < self.config.learning_starts, uniform, torch.clamp(greedy + noise, low, high))

    def device_updates(self, replay, count: int, beta) -> None:
        """`count` updates straight from a device memory, each as update() does it; the actor steps on
        every policy_delay-th update of the launch (launch_refusal holds launches to whole periods, so
        this is update()'s schedule). Host counters (self.updates) are the caller's."""
        config = self.config
        for i in range(count):
            sample = replay.draw(config.batch_size, beta)
            t = sample.transitions
            obs = t["obs"]
            td_abs, _, _ = self.learn_critic(obs, t["action"].view(len(obs), -1), t["reward"], t["next_obs"], t["done"],
                                             sample.weights)
            if (i + 1) % config.policy_delay == 0:
                self.learn_actor(obs)
            replay.set_priorities(sample.indices, td_abs + config.per_eps)

    def weights(self) -> list[np.ndarray]:
        from rlbench.algorithms.networks import export_weights

        return export_weights(self.actor)

    CHECKPOINTED = ("actor", "critic", "target_actor", "target_critic", "actor_optimizer", "critic_optimizer")

    def state_dict(self) -> dict[str, Any]:
        from rlbench.algorithms.networks import state_of

        return state_of(self, self.CHECKPOINTED)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from rlbench.algorithms.networks import load_state

        load_state(self, self.CHECKPOINTED, state)


class DDPG:
    name = "ddpg"
    Config = DDPGConfig
    # Its learner offers prepare_capture / explore / device_updates: the one-device loop can run it.
    captures_on_one_device = True

    capabilities = caps.DDPG
    presets = {"mujoco": MUJOCO}

    def policy_shapes(self, spec: EnvSpec, config: DDPGConfig) -> list[tuple[int, ...]]:
        return mlp_shapes(actor_layer_sizes(spec, config))

    def make_actor(self, spec: EnvSpec, compute: Any, config: DDPGConfig, seed: int) -> DDPGActor:
        return DDPGActor(spec, compute, config, seed)

    def make_learner(self, spec: EnvSpec, compute: Any, config: DDPGConfig, seed: int) -> DDPGLearner:
        return DDPGLearner(spec, compute, config, seed)
