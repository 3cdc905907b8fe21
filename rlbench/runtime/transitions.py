"""A transition: the one place that names its fields and fixes their layout for a run.

Every loop builds its transitions with `transition(...)` (the local loop, the one-device loop, an
actor of a distributed run), the wire (rlbench.runtime.distributed.messages) carries them under
these names, and a run's layout comes from its environment's spec (`transition_layout`): actors
send it (`as_layout`), and the replay node refuses any other (`layout_mismatch`), so the first
writer cannot impose its own.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

FIELDS = ("obs", "action", "reward", "next_obs", "done")

Layout = dict[str, tuple[str, tuple[int, ...]]]  # field -> (dtype name, shape of one row)


def transition(obs: Any, action: Any, reward: Any, next_obs: Any, done: Any) -> dict[str, Any]:
    """A batch of transitions (rows) as the memories and the wire take them."""
    return {"obs": obs, "action": action, "reward": reward, "next_obs": next_obs, "done": done}


def fields_of(arrays: Mapping[str, Any]) -> dict[str, Any]:
    """The transition fields of a message's or a batch's arrays (other arrays left out). FIELDS spelled
    out: this runs on every INSERT and every batch, and a loop over the names costs twice as much."""
    return {"obs": arrays["obs"], "action": arrays["action"], "reward": arrays["reward"],
            "next_obs": arrays["next_obs"], "done": arrays["done"]}


def transition_layout(spec: Any) -> Layout:
    """The transitions a run carries, from its environment's spec (an EnvSpec): observations as the
    environment gives them, integer actions (discrete) or float32 ones of the action's shape,
    float32 rewards and done flags."""
    observation = (str(np.dtype(spec.observation_dtype)), tuple(spec.observation_shape))
    action = ("int64", ()) if spec.action_kind == "discrete" else ("float32", tuple(spec.action_shape))
    return {"obs": observation, "action": action, "reward": ("float32", ()), "next_obs": observation,
            "done": ("float32", ())}


def frames_of(spec: Any) -> int:
    """What a frame-storing replay memory is told (its factory's `frames=`): the frames stacked on axis
    0 of an image observation (EnvSpec.frame_stack), 1 for an image that is not a stack (the whole
    observation is one frame, shared by a transition's next_obs and the following obs), 0 for
    observations that are not images (stored as they are)."""
    if spec.observation_kind != "image":
        return 0
    return int(spec.frame_stack) or 1


def make_memory(component: Any, spec: Any, *, capacity: int, alpha: float, seed: int,
                options: Mapping[str, Any]) -> Any:
    """A run's replay memory (the local loop's, a replay node's): built by its registry component with
    the run's options, and told how image observations' frames are stored when it can store each
    frame once (ReplayCapabilities.frames); any other memory stores obs and next_obs as given."""
    frames = frames_of(spec) if component.capabilities.frames else 0
    return component.create(capacity=capacity, alpha=alpha, seed=seed, **({"frames": frames} if frames else {}),
                            **options)


def as_layout(layout: Layout, transitions: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """An actor's transitions in the run's layout (no copy of a field already in it)."""
    return {name: np.asarray(transitions[name], dtype=dtype) for name, (dtype, _) in layout.items()}


def layout_mismatch(layout: Layout, arrays: Mapping[str, np.ndarray]) -> str:
    """Why a batch of transitions breaks the run's layout ("" when it keeps it)."""
    for name, (dtype, row) in layout.items():
        array = arrays[name]
        if array.dtype != dtype or array.shape[1:] != tuple(row):
            return (f"{name} is {array.dtype}{list(array.shape[1:])} per row, but this run's transitions carry "
                    f"{dtype}{list(row)} (its environment's spec)")
    return ""
