"""For tabular-engine authors: one validation of a TD batch, shared by every engine.

`prepare_batch(batch, rule)` checks a batch once (keys, rule, dtypes, shapes, finite rewards) and
converts it to the canonical layout (int64 ids, float64 rewards, uint8 done), raising
`TabularInputError` with one line. Index ranges depend on the table: an engine checks them itself
(the CPU engine does it in C, in a first pass before it updates anything).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from rlbench.errors import RlbenchError

RULES = ("qlearning", "sarsa")


class TabularInputError(RlbenchError, ValueError):
    """A batch, rule or hyperparameter a tabular engine cannot apply."""


@dataclass
class TdBatch:
    """A validated batch in the canonical layout (C-contiguous, 1-D, equal lengths)."""

    obs: np.ndarray  # int64
    action: np.ndarray  # int64
    reward: np.ndarray  # float64
    next_obs: np.ndarray  # int64
    next_action: np.ndarray | None  # int64, present for sarsa
    done: np.ndarray  # uint8

    def __len__(self) -> int:
        return int(self.obs.shape[0])


def check_rule(rule: str) -> bool:
    """True for sarsa (reads next_action), False for qlearning; anything else is refused."""
    if rule not in RULES:
        close = difflib.get_close_matches(str(rule), RULES, n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]!r}?" if close else f"; choose one of {', '.join(RULES)}"
        raise TabularInputError(f"unknown tabular rule {rule!r}{hint}")
    return rule == "sarsa"


def check_step_sizes(alpha: float, gamma: float) -> None:
    """Refuse (TabularInputError) an alpha outside (0, 1] or a gamma outside [0, 1]."""
    if not 0.0 < alpha <= 1.0:
        raise TabularInputError(f"alpha must be in (0, 1], got {alpha!r}")
    if not 0.0 <= gamma <= 1.0:
        raise TabularInputError(f"gamma must be in [0, 1], got {gamma!r}")


def _indices(batch: Mapping[str, Any], key: str, n: int) -> np.ndarray:
    array = np.asarray(batch[key])
    if array.dtype.kind not in "iu":
        raise TabularInputError(f"batch[{key!r}] must hold integers, got dtype {array.dtype}")
    if array.ndim != 1 or array.shape[0] != n:
        raise TabularInputError(f"batch[{key!r}] must be 1-D with {n} rows (like obs), got shape {array.shape}")
    # int64 widens every id exactly (a uint64 beyond 2**63 turns negative, which is still out of range).
    return np.ascontiguousarray(array, dtype=np.int64)


def prepare_batch(batch: Mapping[str, Any], rule: str) -> TdBatch:
    """Check a batch of transitions for `rule` (qlearning or sarsa: sarsa also needs next_action) and
    return it as a TdBatch; TabularInputError naming the first bad field."""
    sarsa = check_rule(rule)
    needed = ("obs", "action", "reward", "next_obs", "done") + (("next_action",) if sarsa else ())
    missing = [key for key in needed if key not in batch]
    if missing:
        raise TabularInputError(f"the {rule} batch lacks {', '.join(missing)} (it needs {', '.join(needed)})")
    obs = np.asarray(batch["obs"])
    if obs.ndim != 1:
        raise TabularInputError(f"batch['obs'] must be 1-D (one state id per transition), got shape {obs.shape}")
    n = obs.shape[0]
    reward = np.asarray(batch["reward"])
    if reward.dtype.kind not in "fiu" or reward.ndim != 1 or reward.shape[0] != n:
        raise TabularInputError(f"batch['reward'] must be 1-D real numbers with {n} rows, "
                                f"got dtype {reward.dtype} shape {reward.shape}")
    reward = np.ascontiguousarray(reward, dtype=np.float64)
    if not np.isfinite(reward).all():
        raise TabularInputError("batch['reward'] holds NaN or infinity")
    done = np.asarray(batch["done"])
    if done.dtype.kind not in "biu" or done.ndim != 1 or done.shape[0] != n:
        raise TabularInputError(f"batch['done'] must be 1-D bool or integer with {n} rows, "
                                f"got dtype {done.dtype} shape {done.shape}")
    return TdBatch(
        obs=_indices(batch, "obs", n),
        action=_indices(batch, "action", n),
        reward=reward,
        next_obs=_indices(batch, "next_obs", n),
        next_action=_indices(batch, "next_action", n) if sarsa else None,
        done=np.ascontiguousarray(done != 0, dtype=np.uint8),
    )
