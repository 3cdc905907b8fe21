"""For environment authors: the check of a batch of actions every environment makes, with the error
users see. `ActionCheck(spec)` is built once per environment (it precomputes the bounds);
`check(actions)` returns the actions as a numpy array of shape (num_envs, *action_shape) or raises
`ActionError` (an RlbenchError and a ValueError, which the CLI prints on one line and
`rlbench.testing.check_environment` expects) before any copy is stepped. It sits on every env step,
so small batches are checked on Python numbers (a numpy reduction costs more than a CartPole step).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlbench.errors import RlbenchError
from rlbench.protocols import EnvSpec

SMALL = 16  # batches up to this many values are checked element by element


class ActionError(RlbenchError, ValueError):
    """Actions an environment cannot take: the wrong shape, an id out of range, a value out of bounds."""


class ActionCheck:
    """One action per copy: integer ids in 0..n_actions-1, or numbers within [action_low, action_high]
    (NaN is outside)."""

    def __init__(self, spec: EnvSpec) -> None:
        self.spec = spec
        self.shape = (spec.num_envs, *spec.action_shape)
        self.discrete = spec.action_kind == "discrete"
        if not self.discrete:
            self.low = np.asarray(spec.action_low, np.float64).reshape(spec.action_shape)
            self.high = np.asarray(spec.action_high, np.float64).reshape(spec.action_shape)
            self.low_values, self.high_values = self.low.ravel().tolist(), self.high.ravel().tolist()

    def __call__(self, actions: Any) -> np.ndarray:
        array = actions if type(actions) is np.ndarray else np.asarray(actions)
        if array.shape != self.shape:
            raise ActionError(f"{self.spec.id}: actions must have shape {self.shape} (one row per copy), "
                              f"got {array.shape}")
        kind = array.dtype.kind
        if self.discrete:
            if kind not in "iu":
                raise ActionError(f"{self.spec.id}: discrete actions must be integers, got {array.dtype}")
            n = self.spec.n_actions
            if array.size <= SMALL:
                if not all(0 <= value < n for value in array.ravel().tolist()):
                    self._refuse_discrete(array)
            elif array.min() < 0 or array.max() >= n:
                self._refuse_discrete(array)
            return array
        if kind not in "fiu":
            raise ActionError(f"{self.spec.id}: continuous actions must be numbers, got {array.dtype}")
        if array.size <= SMALL:
            width = len(self.low_values)
            values = array.ravel().tolist()
            inside = all(self.low_values[i % width] <= value <= self.high_values[i % width]
                         for i, value in enumerate(values))
        else:
            inside = bool(np.all((array >= self.low) & (array <= self.high)))
        if not inside:
            outside = ~((array >= self.low) & (array <= self.high))
            raise ActionError(f"{self.spec.id}: action {array[outside][0]} is outside the bounds "
                              f"[{self.spec.action_low}, {self.spec.action_high}]")
        return array

    def _refuse_discrete(self, array: np.ndarray) -> None:
        outside = (array < 0) | (array >= self.spec.n_actions)
        raise ActionError(f"{self.spec.id}: action {array[outside][0]} is outside 0..{self.spec.n_actions - 1}")


def check_actions(spec: EnvSpec, actions: Any) -> np.ndarray:
    """`ActionCheck(spec)(actions)`, for a one-off check (an environment keeps its ActionCheck)."""
    return ActionCheck(spec)(actions)
