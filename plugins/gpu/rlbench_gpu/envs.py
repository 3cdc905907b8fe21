"""`gpu/CartPole-v1` and `gpu/Pendulum-v1`: thousands of environments stepped as batched tensor ops.

The dynamics, rewards, termination and truncation are gymnasium 1.x's CartPoleEnv and PendulumEnv
(with their TimeLimit of 500 and 200 steps), written over a batch: every environment is one row of a
state tensor on the device. Same-step auto-reset as rlbench's Environment protocol asks: an ended
row is re-drawn from the reset distribution in the same step, and `final_observations` holds what
the episode ended on. Randomness comes from a seeded torch.Generator on the device, so resets are
reproducible per seed but are not gymnasium's numpy draws (tests set both to the same states).

State is float64 by default, as gymnasium computes, so trajectories match it to rounding; pass
dtype="float32" for speed. `output` says what the arrays handed out are: "numpy" (host copies, what
the core's loops use today) or "torch" (device tensors, no host round trip). Actions may be numpy
or torch tensors. `graph=True` (CUDA only) captures one step in a CUDA graph and replays it, which
removes the launch cost of its ~30 small kernels (`rlbench bench env` measures both).

`rollout(steps, act, record)` runs many steps with actions from a device policy and hands each
transition on as device tensors: the chunk rlbench's one-device loop captures whole (one CUDA
graph for S steps, policy and replay writes included). A step never reads a device value on the
host and never makes a tensor from host data (the reset ranges are buffers made at construction),
so it can be captured: a host constant built inside a capture fails on CUDA.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from rlbench.protocols import EnvSpec, StepResult
from rlbench_gpu.capabilities import ENVIRONMENT_CAPABILITIES
from rlbench_gpu.device import GpuError, resolve_device

OUTPUTS = ("numpy", "torch")
STATE_DTYPES = {"float64": torch.float64, "float32": torch.float32}


class BatchedTensorEnv:
    """Shared machinery: state rows, step counters, auto-reset, output conversion, CUDA graphs."""

    env_id: str  # as registered; its limits come from the registered capabilities
    state_size: int
    max_episode_steps: int

    def __init__(self, spec: EnvSpec, *, seed: int | None, device: Any, dtype: str, output: str, graph: bool) -> None:
        if spec.num_envs < 1:
            raise GpuError(f"num_envs must be >= 1, got {spec.num_envs}")
        if output not in OUTPUTS:
            raise GpuError(f"output must be one of {', '.join(OUTPUTS)}, got {output!r}")
        if dtype not in STATE_DTYPES:
            raise GpuError(f"dtype must be one of {', '.join(STATE_DTYPES)}, got {dtype!r}")
        self.spec = spec
        self.device = resolve_device(device)
        if graph and self.device.type != "cuda":
            raise GpuError(f"graph=True needs a CUDA device (CUDA graphs), not {self.device}")
        self.dtype = STATE_DTYPES[dtype]
        self.output = output
        self._seed = seed
        self._generator = torch.Generator(device=self.device)
        n = spec.num_envs
        self.state = torch.zeros((n, self.state_size), dtype=self.dtype, device=self.device)
        self.elapsed = torch.zeros(n, dtype=torch.int64, device=self.device)
        self._graph_wanted = graph
        self._graph: Any = None
        self._static_actions: torch.Tensor | None = None
        self._static_result: tuple[torch.Tensor, ...] = ()

    # -- the environment-specific parts ----------------------------------------------------------
    def _initial_states(self, n: int) -> torch.Tensor:
        raise NotImplementedError

    def _dynamics(self, state: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(next state, reward, terminated) for every row."""
        raise NotImplementedError

    def _observe(self, state: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _actions(self, actions: Any) -> torch.Tensor:
        raise NotImplementedError

    # -- protocol ---------------------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> Any:
        seed = self._seed if seed is None else seed
        if seed is None:
            self._generator.seed()
        else:
            self._generator.manual_seed(int(seed))
        self.state.copy_(self._initial_states(self.spec.num_envs))
        self.elapsed.zero_()
        return self._out(self._observe(self.state))

    def step(self, actions: Any) -> StepResult:
        actions = self._actions(actions)
        if self._graph_wanted:
            observations, rewards, terminated, truncated, final = self._graph_step(actions)
        else:
            observations, rewards, terminated, truncated, final = self._step_tensors(actions)
        return StepResult(self._out(observations), self._out(rewards), self._out(terminated), self._out(truncated),
                          self._out(final))

    @property
    def generator(self) -> torch.Generator:
        """The device generator of resets; a CUDA graph that captures steps must register it."""
        return self._generator

    def rollout(self, steps: int, act: Any, record: Any) -> None:
        """`steps` steps of every row: actions = act(observations), then record(observations, actions,
        rewards, final_observations, terminated, truncated), all device tensors. The same transitions
        as `steps` calls of step() with those actions; nothing waits for the host and nothing comes
        from it, so a whole call can be captured in one CUDA graph."""
        observations = self._observe(self.state)
        for _ in range(steps):
            actions = act(observations)
            next_observations, rewards, terminated, truncated, final = self._step_tensors(self._actions(actions))
            record(observations, actions, rewards, final, terminated, truncated)
            observations = next_observations

    def _step_tensors(self, actions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Advance every row, then re-draw the rows whose episode ended (same-step auto-reset)."""
        next_state, rewards, terminated = self._dynamics(self.state, actions)
        self.elapsed += 1
        truncated = (self.elapsed >= self.max_episode_steps) & ~terminated
        final = self._observe(next_state)
        ended = (terminated | truncated).unsqueeze(1)
        # Drawing fresh states for every row and keeping only the ended ones keeps shapes static (no
        # host sync, graph-capturable); the draws are cheap next to a kernel launch.
        self.state.copy_(torch.where(ended, self._initial_states(self.spec.num_envs), next_state))
        self.elapsed.masked_fill_(ended.squeeze(1), 0)
        return self._observe(self.state), rewards.to(torch.float32), terminated, truncated, final

    def _graph_step(self, actions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self._graph is None:
            self._capture(actions)
        assert self._static_actions is not None
        self._static_actions.copy_(actions)
        self._graph.replay()
        return tuple(t.clone() for t in self._static_result)  # the next replay overwrites the static outputs

    def _capture(self, actions: torch.Tensor) -> None:
        self._static_actions = actions.clone()
        saved_state, saved_elapsed = self.state.clone(), self.elapsed.clone()
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):  # warm-up on a side stream, as torch's CUDA-graph notes ask
            for _ in range(3):
                self._step_tensors(self._static_actions)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        self._graph = torch.cuda.CUDAGraph()
        self._graph.register_generator_state(self._generator)
        with torch.cuda.graph(self._graph):
            self._static_result = self._step_tensors(self._static_actions)
        self.state.copy_(saved_state)  # warm-up and capture must not have advanced the episodes
        self.elapsed.copy_(saved_elapsed)

    def set_state(self, state: Any, elapsed: Any = None) -> None:
        """Put every row in a given state (and step count); for tests and reproductions."""
        state = torch.as_tensor(np.asarray(state) if not isinstance(state, torch.Tensor) else state,
                                dtype=self.dtype, device=self.device)
        if state.shape != self.state.shape:
            raise GpuError(f"state must have shape {tuple(self.state.shape)}, got {tuple(state.shape)}")
        self.state.copy_(state)
        if elapsed is not None:
            self.elapsed.copy_(torch.as_tensor(elapsed, dtype=torch.int64, device=self.device).expand_as(self.elapsed))

    def close(self) -> None:
        self._graph = None

    def _out(self, tensor: torch.Tensor) -> Any:
        if self.output == "torch":
            return tensor
        return tensor.cpu().numpy()

    def _check_batch(self, actions: Any, trailing: tuple[int, ...]) -> tuple[Any, bool]:
        """(actions, is_tensor) after checking their shape."""
        is_tensor = isinstance(actions, torch.Tensor)
        if not is_tensor:
            actions = np.asarray(actions)
        expected = (self.spec.num_envs, *trailing)
        if tuple(actions.shape) != expected and not (trailing == (1,) and tuple(actions.shape) == expected[:1]):
            raise GpuError(f"{self.spec.id}: actions must have shape {expected}, got {tuple(actions.shape)}")
        return actions, is_tensor


class BatchedCartPole(BatchedTensorEnv):
    """gymnasium's CartPole-v1 (euler integrator, reward 1 per step including the last, 500-step limit)."""

    env_id = "gpu/CartPole-v1"
    state_size = 4
    max_episode_steps = ENVIRONMENT_CAPABILITIES[env_id].max_episode_steps
    gravity, masscart, masspole, length, force_mag, tau = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
    total_mass = masspole + masscart
    polemass_length = masspole * length
    theta_threshold = 12 * 2 * math.pi / 360
    x_threshold = 2.4

    def __init__(self, num_envs: int = 1, *, seed: int | None = None, device: Any = "cuda", dtype: str = "float64",
                 output: str = "numpy", graph: bool = False) -> None:
        spec = EnvSpec(id=self.env_id, num_envs=int(num_envs), observation_shape=(4,), observation_dtype="float32",
                       action_kind="discrete", n_actions=2, max_episode_steps=self.max_episode_steps,
                       reward_threshold=ENVIRONMENT_CAPABILITIES[self.env_id].reward_threshold,
                       note="batched tensor CartPole-v1 (gymnasium dynamics)")
        super().__init__(spec, seed=seed, device=device, dtype=dtype, output=output, graph=graph)

    def _initial_states(self, n: int) -> torch.Tensor:
        uniform = torch.rand((n, 4), generator=self._generator, dtype=self.dtype, device=self.device)
        return uniform * 0.1 - 0.05

    def _actions(self, actions: Any) -> torch.Tensor:
        actions, is_tensor = self._check_batch(actions, ())
        if not is_tensor:  # host input: check values for free; device tensors are trusted (a check would sync)
            if not (np.issubdtype(actions.dtype, np.integer) or actions.dtype == bool) or \
                    (actions.size and (actions.min() < 0 or actions.max() > 1)):
                raise GpuError(f"{self.spec.id}: actions must be integers 0 or 1, got {actions.dtype} "
                               f"in [{actions.min()}, {actions.max()}]")
            return torch.from_numpy(np.ascontiguousarray(actions)).to(self.device, non_blocking=True)
        if actions.is_floating_point():
            raise GpuError(f"{self.spec.id}: actions must be integers 0 or 1, got {actions.dtype}")
        return actions.to(self.device)

    def _dynamics(self, state: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x, x_dot, theta, theta_dot = state.unbind(1)
        force = torch.where(actions == 1, self.force_mag, -self.force_mag).to(self.dtype)
        cos, sin = torch.cos(theta), torch.sin(theta)
        temp = (force + self.polemass_length * theta_dot.square() * sin) / self.total_mass
        theta_acc = (self.gravity * sin - cos * temp) / (
            self.length * (4.0 / 3.0 - self.masspole * cos.square() / self.total_mass))
        x_acc = temp - self.polemass_length * theta_acc * cos / self.total_mass
        x = x + self.tau * x_dot
        x_dot = x_dot + self.tau * x_acc
        theta = theta + self.tau * theta_dot
        theta_dot = theta_dot + self.tau * theta_acc
        next_state = torch.stack((x, x_dot, theta, theta_dot), dim=1)
        terminated = (x < -self.x_threshold) | (x > self.x_threshold) | \
            (theta < -self.theta_threshold) | (theta > self.theta_threshold)
        return next_state, torch.ones_like(x), terminated

    def _observe(self, state: torch.Tensor) -> torch.Tensor:
        return state.to(torch.float32)


class BatchedPendulum(BatchedTensorEnv):
    """gymnasium's Pendulum-v1 (g = 10, never terminates, 200-step limit)."""

    env_id = "gpu/Pendulum-v1"
    state_size = 2
    max_episode_steps = ENVIRONMENT_CAPABILITIES[env_id].max_episode_steps
    max_speed, max_torque, dt, g, m, l = 8.0, 2.0, 0.05, 10.0, 1.0, 1.0

    def __init__(self, num_envs: int = 1, *, seed: int | None = None, device: Any = "cuda", dtype: str = "float64",
                 output: str = "numpy", graph: bool = False) -> None:
        spec = EnvSpec(id=self.env_id, num_envs=int(num_envs), observation_shape=(3,), observation_dtype="float32",
                       action_kind="continuous", action_shape=(1,), action_low=(-2.0,), action_high=(2.0,),
                       max_episode_steps=self.max_episode_steps, note="batched tensor Pendulum-v1 (gymnasium dynamics)")
        super().__init__(spec, seed=seed, device=device, dtype=dtype, output=output, graph=graph)
        # Made here, not per reset: a tensor built from host values inside a captured step fails on CUDA.
        self._reset_high = torch.tensor([math.pi, 1.0], dtype=self.dtype, device=self.device)

    def _initial_states(self, n: int) -> torch.Tensor:
        uniform = torch.rand((n, 2), generator=self._generator, dtype=self.dtype, device=self.device)
        return (uniform * 2.0 - 1.0) * self._reset_high

    def _actions(self, actions: Any) -> torch.Tensor:
        actions, is_tensor = self._check_batch(actions, (1,))
        if not is_tensor:
            if not np.issubdtype(actions.dtype, np.number) or (actions.size and not np.all(np.isfinite(actions))):
                raise GpuError(f"{self.spec.id}: actions must be finite numbers, got {actions.dtype}")
            actions = torch.from_numpy(np.ascontiguousarray(actions)).to(self.device, non_blocking=True)
        return actions.to(self.device, torch.float32).reshape(self.spec.num_envs)

    def _dynamics(self, state: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        th, thdot = state.unbind(1)
        # gymnasium's actions are float32 and its torque terms stay float32 before meeting the float64
        # state (numpy's promotion rules): computing them the same way keeps trajectories identical.
        u = actions.clamp(-self.max_torque, self.max_torque)
        normalized = torch.remainder(th + math.pi, 2 * math.pi) - math.pi  # gymnasium's angle_normalize
        costs = normalized.square() + 0.1 * thdot.square() + (0.001 * u.square()).to(th.dtype)
        torque = (3.0 / (self.m * self.l ** 2) * u).to(th.dtype)
        new_thdot = thdot + (3 * self.g / (2 * self.l) * torch.sin(th) + torque) * self.dt
        new_thdot = new_thdot.clamp(-self.max_speed, self.max_speed)
        new_th = th + new_thdot * self.dt
        return torch.stack((new_th, new_thdot), dim=1), -costs, torch.zeros_like(th, dtype=torch.bool)

    def _observe(self, state: torch.Tensor) -> torch.Tensor:
        th, thdot = state.unbind(1)
        return torch.stack((torch.cos(th), torch.sin(th), thdot), dim=1).to(torch.float32)


ENVIRONMENTS = {env.env_id: env for env in (BatchedCartPole, BatchedPendulum)}


def make(env_id: str, num_envs: int = 1, *, seed: int | None = None, device: Any = "cuda", **options: Any) -> BatchedTensorEnv:
    """The registered factory: factory(num_envs, *, seed, **options)."""
    return ENVIRONMENTS[env_id](num_envs, seed=seed, device=device, **options)
