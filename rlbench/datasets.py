"""Offline experience datasets for tabular learning (SwiftRL's workloads).

A dataset is collected once from a tabular environment by a behaviour policy, saved as .npz with
its metadata, and reloaded by key (environment, its options, size, behaviour, seed), so a run can
be repeated on exactly the same data. Any registered environment with discrete observations and
actions works: collection goes through the registry and the Environment protocol, not gymnasium.

Arrays (one row per transition, in collection order):
  obs, next_obs      int32   state ids
  action             int32
  next_action        int32   the behaviour's action at next_obs (SARSA's a'); at an episode end
                             it is what the behaviour would have taken there
  reward             float32
  done               uint8   1 where next_obs is terminal (no bootstrap); truncation is not done
Behaviours: "random" (uniform actions) and "epsilon-greedy" (epsilon-greedy over a Q-table the
collector learns online with Q-learning while it collects, i.e. a learning agent's replay).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

FIELDS = ("obs", "action", "reward", "next_obs", "next_action", "done")
BEHAVIOURS = ("random", "epsilon-greedy")


@dataclass
class Dataset:
    env_id: str
    behaviour: str
    seed: int
    arrays: dict[str, np.ndarray]
    n_states: int
    n_actions: int
    meta: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)  # the environment's options it was collected with

    def __len__(self) -> int:
        return int(self.arrays["obs"].shape[0])

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())

    def save(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        header = {"env_id": self.env_id, "behaviour": self.behaviour, "seed": self.seed, "options": self.options,
                  "n_states": self.n_states, "n_actions": self.n_actions, "meta": self.meta}
        tmp = path.with_name(path.name + ".tmp.npz")
        np.savez(tmp, header=np.frombuffer(json.dumps(header).encode(), dtype=np.uint8), **self.arrays)
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Dataset":
        with np.load(path) as data:
            header = json.loads(bytes(data["header"]).decode())
            arrays = {name: data[name] for name in FIELDS}
        return cls(header["env_id"], header["behaviour"], header["seed"], arrays, header["n_states"],
                   header["n_actions"], header.get("meta", {}), header.get("options", {}))


def cache_dir() -> Path:
    return Path(os.environ.get("RLBENCH_CACHE", Path.home() / ".cache" / "rlbench")) / "datasets"


def cache_path(env_id: str, size: int, behaviour: str, seed: int, options: dict[str, Any] | None = None) -> Path:
    """Where the dataset of this key is cached; the environment's options are part of the key."""
    suffix = ""
    if options:
        digest = hashlib.sha256(json.dumps(options, sort_keys=True, default=str).encode()).hexdigest()[:12]
        suffix = f"-opt{digest}"
    return cache_dir() / f"{env_id.replace('/', '_')}-{size}-{behaviour}-seed{seed}{suffix}.npz"


def get(env_id: str, size: int, *, behaviour: str = "random", seed: int = 0, options: dict[str, Any] | None = None,
        cache: bool = True) -> Dataset:
    """Load the dataset for this key from the cache, or collect and save it."""
    options = dict(options or {})
    path = cache_path(env_id, size, behaviour, seed, options)
    if cache and path.exists():
        dataset = Dataset.load(path)
        if dataset.options != options or len(dataset) != size:
            from rlbench.errors import RlbenchError

            raise RlbenchError(f"dataset {path} holds {len(dataset)} transitions collected with options "
                               f"{dataset.options}, not the {size} with {options} its name says; delete it to "
                               "collect it again")
        return dataset
    dataset = collect(env_id, size, behaviour=behaviour, seed=seed, options=options)
    if cache:
        dataset.save(path)
    return dataset


def collect(env_id: str, size: int, *, behaviour: str = "random", seed: int = 0, options: dict[str, Any] | None = None,
            epsilon: float = 0.2, alpha: float = 0.1, gamma: float = 0.99) -> Dataset:
    """Run the behaviour policy in the registered environment (one copy) for `size` transitions."""
    if behaviour not in BEHAVIOURS:
        raise ValueError(f"unknown behaviour {behaviour!r}; choose one of {', '.join(BEHAVIOURS)}")
    if size < 1:
        raise ValueError("dataset size must be >= 1")
    from rlbench.plugins import get_registry

    env = get_registry().get("environment", env_id).create(num_envs=1, seed=seed, **(options or {}))
    spec = env.spec
    if spec.n_states is None or spec.n_actions is None:
        env.close()
        raise ValueError(f"{env_id} is not a tabular (discrete observation and action) environment")
    rng = np.random.default_rng(seed)
    q = np.zeros((spec.n_states, spec.n_actions)) if behaviour == "epsilon-greedy" else None

    def choose(state: int) -> int:
        if q is None or rng.random() < epsilon:
            return int(rng.integers(spec.n_actions))
        row = q[state]
        return int(rng.choice(np.flatnonzero(row == row.max())))  # random tie-break

    arrays = {name: np.empty(size, dtype=np.float32 if name == "reward" else np.uint8 if name == "done" else np.int32)
              for name in FIELDS}
    state = int(env.reset(seed=seed)[0])
    action = choose(state)
    episodes = 0
    step_action = np.zeros(1, dtype=np.int64)
    try:
        for t in range(size):
            step_action[0] = action
            result = env.step(step_action)
            next_state, reward = int(result.final_observations[0]), float(result.rewards[0])
            terminated, truncated = bool(result.terminated[0]), bool(result.truncated[0])
            next_action = choose(next_state)
            arrays["obs"][t], arrays["action"][t], arrays["reward"][t] = state, action, reward
            arrays["next_obs"][t], arrays["next_action"][t], arrays["done"][t] = next_state, next_action, terminated
            if q is not None:
                target = reward + (0.0 if terminated else gamma * q[next_state].max())
                q[state, action] += alpha * (target - q[state, action])
            if terminated or truncated:  # the environment already reset itself (same-step auto-reset)
                episodes += 1
                state = int(result.observations[0])
                action = choose(state)
            else:
                state, action = next_state, next_action
    finally:
        env.close()
    meta = {"episodes": episodes, "note": spec.note, "epsilon": epsilon if q is not None else None}
    return Dataset(spec.id, behaviour, seed, arrays, spec.n_states, spec.n_actions, meta, dict(options or {}))
