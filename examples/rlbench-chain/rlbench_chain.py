"""A complete, minimal environment plugin: the N-state chain MDP (Strens 2000, "NChain"), written from
scratch in numpy, batched, with same-step auto-reset.

The agent starts at state 0 of `length` states and has two actions. Forward (0) moves to the next
state for no reward; at the last state it stays there and pays 10. Back (1) pays 2 and moves one
state toward the start (back="step", the default), or all the way to it (back="start", as in Strens'
chain). With probability `slip` the other action happens instead. No state is terminal; an episode
is truncated after 100 steps. Going back pays at once and is a trap: walking to the far end pays five
times more per step once there.

Why back="step" by default: with a jump to the start, an epsilon-greedy agent reaches the far end of
an 8-state chain about once in 2**7 tries and settles for the small reward (that is what Strens'
chain was built to show); stepping back one state keeps it a trap that tabular Q-learning gets out
of in 20,000 steps.
"""

from __future__ import annotations

import numpy as np

from rlbench.errors import RlbenchError
from rlbench.hookspecs import hookimpl
from rlbench.kit.checks import non_negative, positive_int
from rlbench.kit.environment import ActionCheck
from rlbench.protocols import EnvironmentCapabilities, EnvSpec, StepResult

RLBENCH_API = "1.1"  # the plugin API this plugin targets (docs/plugin-api-changelog.md)

CAPABILITIES = EnvironmentCapabilities(action_space="discrete", observation_space="discrete", max_episode_steps=100)
DEFAULT_LENGTH = 5  # Strens' chain
DEFAULT_SLIP = 0.2  # Strens' chain
BACK_MOVES = ("step", "start")
FORWARD, BACK = 0, 1
END_REWARD, BACK_REWARD = 10.0, 2.0


class ChainError(RlbenchError, ValueError):
    """Bad options or actions: one clear line for the user (the conformance kit expects an RlbenchError)."""


class ChainEnv:
    """`num_envs` chains stepped together; observations are state ids (int64, n_states = length)."""

    def __init__(self, num_envs: int = 1, *, seed: int | None = None, length: int = DEFAULT_LENGTH,
                 slip: float = DEFAULT_SLIP, back: str = BACK_MOVES[0]) -> None:
        num_envs = positive_int(num_envs, "chain: num_envs", ChainError)
        self.length = positive_int(length, "chain: length (--chain-length)", ChainError)
        if self.length < 2:
            raise ChainError(f"chain: length (--chain-length) must be at least 2, got {self.length}")
        self.slip = non_negative(slip, "chain: slip (--chain-slip)", ChainError)
        if self.slip > 1.0:
            raise ChainError(f"chain: slip (--chain-slip) is a probability, at most 1, got {self.slip}")
        if back not in BACK_MOVES:
            raise ChainError(f"chain: back (--chain-back) is {' or '.join(BACK_MOVES)}, got {back!r}")
        self.back = back
        self.spec = EnvSpec(id="chain", num_envs=num_envs, observation_shape=(), observation_dtype="int64",
                            action_kind="discrete", n_actions=2, n_states=self.length,
                            max_episode_steps=CAPABILITIES.max_episode_steps)
        self._check_actions = ActionCheck(self.spec)
        self._seed = seed
        self._rng = np.random.default_rng(seed)
        self._state = np.zeros(num_envs, np.int64)
        self._steps = np.zeros(num_envs, np.int64)  # into the current episode

    def reset(self, seed: int | None = None) -> np.ndarray:
        """Every copy back to state 0; the seed (or the one it was built with) decides the slips."""
        self._rng = np.random.default_rng(self._seed if seed is None else seed)
        self._state[:] = 0
        self._steps[:] = 0
        return self._state.copy()

    def step(self, actions) -> StepResult:
        actions = self._check_actions(actions)  # refused before any copy moves
        forward = (actions == FORWARD) != (self._rng.random(len(actions)) < self.slip)
        last = self.length - 1
        rewards = np.where(forward, np.where(self._state == last, END_REWARD, 0.0), BACK_REWARD).astype(np.float32)
        back_to = 0 if self.back == "start" else np.maximum(self._state - 1, 0)
        self._state = np.where(forward, np.minimum(self._state + 1, last), back_to)
        self._steps += 1
        truncated = self._steps >= CAPABILITIES.max_episode_steps
        final = self._state.copy()
        self._state[truncated] = 0  # same-step auto-reset: the next episode starts now
        self._steps[truncated] = 0
        return StepResult(self._state.copy(), rewards, np.zeros(len(actions), bool), truncated, final)

    def close(self) -> None:
        pass  # it holds nothing


@hookimpl
def rlbench_register_environments(register):
    register("chain", ChainEnv, capabilities=CAPABILITIES,
             description="the N-state chain MDP (Strens 2000): walk to the far end, or take the small reward back")


@hookimpl
def rlbench_register_run_options(option):
    option("environment", "chain", "--chain-length", "length", type=int, default=DEFAULT_LENGTH,
           help="states in the chain")
    option("environment", "chain", "--chain-slip", "slip", type=float, default=DEFAULT_SLIP,
           help="probability that a step does the other action")
    option("environment", "chain", "--chain-back", "back", choices=BACK_MOVES, default=BACK_MOVES[0],
           help="where back goes: one state toward the start, or all the way (Strens' chain)")
