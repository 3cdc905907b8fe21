"""Hyperparameters every replay-loop algorithm has (the runtime loops read these; an algorithm file adds
its own fields in a subclass), and the schedules the local loop and the distributed roles share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class ReplayLoopConfig:
    total_steps: int = 50_000  # env steps (summed over actors and envs)
    buffer_size: int = 100_000
    batch_size: int = 64
    learning_starts: int = 1_000  # env steps before the first update (and the replay's minimum size)
    train_every: int = 1  # env steps per learner update: samples-per-insert = batch_size / train_every
    publish_every: int = 1  # learner updates between weight publications to actors (PEARL's k)
    per_alpha: float = 0.6  # prioritized replay: priority exponent
    per_beta_start: float = 0.4  # importance-sampling exponent, annealed linearly to per_beta_end
    per_beta_end: float = 1.0
    per_eps: float = 1e-6  # added to |TD error| so no priority is zero
    # How much work one launch hands an accelerator, in the one-device loop only (rlbench/runtime/
    # device_loop.py); the local and distributed loops ignore both. Neither changes the replay ratio.
    updates_per_launch: int = 8  # K: learner updates per captured launch (an H100 gained nothing past 8)
    env_steps_per_launch: int = 16  # S: vector env steps per captured launch (actions lag updates by <= S)


@dataclass
class TabularConfig:
    total_steps: int = 100_000  # online env steps
    alpha: float = 0.1
    gamma: float = 0.99
    epsilon_start: float = 1.0
    epsilon_end: float = 0.05
    exploration_fraction: float = 0.5
    epochs: int = 10  # offline: sweeps over the dataset


def beta_at(hp, step: int, total_steps: int) -> float:
    """Importance-sampling exponent, annealed linearly over the run (Schaul et al.)."""
    fraction = min(1.0, step / max(1, total_steps))
    return hp.per_beta_start + fraction * (hp.per_beta_end - hp.per_beta_start)


def network_shapes(network: Any) -> list[tuple[int, ...]]:
    """Shapes of a network's published weights: an MLP's layer sizes (mlp_shapes) or a
    rlbench.kit.networks.ConvNetSpec (its weight_shapes())."""
    return mlp_shapes(network) if isinstance(network, (list, tuple)) else network.weight_shapes()


def mlp_shapes(layer_sizes: list[int]) -> list[tuple[int, ...]]:
    """Shapes of an MLP's published weights [W0, b0, W1, b1, ...], W of shape (in, out)."""
    shapes: list[tuple[int, ...]] = []
    for fan_in, fan_out in zip(layer_sizes, layer_sizes[1:]):
        shapes += [(fan_in, fan_out), (fan_out,)]
    return shapes
