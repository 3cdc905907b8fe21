"""rlbench.testing.check_environment: the built-in gymnasium environments pass, a correct toy passes,
and each toy broken in one way fails with a message naming that defect."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rlbench.errors import RlbenchError
from rlbench.protocols import EnvironmentCapabilities, EnvSpec, StepResult
from rlbench.testing import check_environment
from rlbench.testing.environment import MIN_ENDS


class Walk:
    """A correct toy: copies walk on states 0..size-1 from a random start in 0..2; action 0 steps right,
    1 left (clipped at 0), and a step slips the other way with probability 0.2. Reaching size-1
    terminates with reward 1; an episode is truncated after 12 steps."""

    LIMIT = 12

    def __init__(self, num_envs: int = 1, *, seed: int | None = None, size: int = 7) -> None:
        if size < 4:
            raise RlbenchError(f"walk: size must be at least 4, got {size}")
        self.size = size
        self.spec = EnvSpec(id="walk", num_envs=num_envs, observation_shape=(), observation_dtype="int64",
                            action_kind="discrete", n_actions=2, n_states=size, max_episode_steps=self.LIMIT)
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.state = np.zeros(num_envs, np.int64)
        self.t = np.zeros(num_envs, np.int64)

    def start(self, rows: np.ndarray) -> None:
        self.state[rows] = self.rng.integers(0, 3, size=int(np.count_nonzero(rows)))
        self.t[rows] = 0

    def reseed(self, seed: int | None) -> None:
        self.rng = np.random.default_rng(self.seed if seed is None else seed)

    def reset(self, seed: int | None = None) -> np.ndarray:
        self.reseed(seed)
        self.start(np.ones(self.spec.num_envs, bool))
        return self.state.copy()

    def checked(self, actions) -> np.ndarray:
        actions = np.asarray(actions)
        if actions.shape != (self.spec.num_envs,) or actions.dtype.kind not in "iu":
            raise RlbenchError(f"walk: actions must be {self.spec.num_envs} integers, got {actions.dtype}{list(actions.shape)}")
        if ((actions < 0) | (actions > 1)).any():
            raise RlbenchError(f"walk: actions are 0 (right) or 1 (left), got {actions}")
        return actions

    def move(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Advance every copy; (rewards, terminated, truncated)."""
        step = np.where(actions == 0, 1, -1)
        step[self.rng.random(len(step)) < 0.2] *= -1
        self.state = np.clip(self.state + step, 0, self.size - 1)
        self.t += 1
        terminated = self.state == self.size - 1
        return terminated.astype(np.float32), terminated, ~terminated & (self.t >= self.LIMIT)

    def step(self, actions) -> StepResult:
        rewards, terminated, truncated = self.move(self.checked(actions))
        final = self.state.copy()
        self.start(terminated | truncated)
        return StepResult(self.state.copy(), rewards, terminated, truncated, final)

    def close(self) -> None:
        pass


CAPABILITIES = EnvironmentCapabilities(action_space="discrete", observation_space="discrete", max_episode_steps=12)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1", "FrozenLake-v1", "Taxi-v3"])
def test_the_builtin_gymnasium_environments_pass(env_id):
    report = check_environment(env_id)  # the registered factory and capabilities
    assert report.stochastic and report.episode_ends >= MIN_ENDS
    assert any(line.startswith("gymnasium's check_env") for line in report.checked)
    assert "spec against the capabilities" in report.checked


def test_a_correct_toy_passes_and_its_option_is_seen_to_take_effect():
    report = check_environment(Walk, capabilities=CAPABILITIES, options={"size": 9},
                               expect=lambda env: env.spec.n_states == 9)
    assert "options ['size'] reach the environment" in report.checked
    assert "truncation at max_episode_steps=12" in report.checked
    assert any(line.startswith("gymnasium's check_env") for line in report.skipped)


def test_an_expectation_that_holds_without_the_options_proves_nothing():
    with pytest.raises(AssertionError, match="true without options"):
        check_environment(Walk, options={"size": 9}, expect=lambda env: env.spec.n_states > 0)
    with pytest.raises(AssertionError, match="did not take effect"):
        check_environment(Walk, options={"size": 9}, expect=lambda env: env.spec.n_states == 12)


def test_capabilities_that_do_not_match_the_spec_fail():
    wrong = EnvironmentCapabilities(action_space="discrete", observation_space="discrete", max_episode_steps=13)
    with pytest.raises(AssertionError, match="declare max_episode_steps=13, the environment has 12"):
        check_environment(Walk, capabilities=wrong)
    continuous = EnvironmentCapabilities(action_space="discrete", observation_space="continuous")
    with pytest.raises(AssertionError, match="observation_space='continuous'"):
        check_environment(Walk, capabilities=continuous)


class WrongObservationShape(Walk):
    def reset(self, seed=None):
        return super().reset(seed)[:, None]


class NoAutoReset(Walk):
    def step(self, actions):
        rewards, terminated, truncated = self.move(self.checked(actions))  # ended copies go on as they are
        return StepResult(self.state.copy(), rewards, terminated, truncated, self.state.copy())


class IgnoresTheSeed(Walk):
    def reseed(self, seed):
        super().reseed(None)  # always the seed it was built with


class FinalObservationsLost(Walk):
    def step(self, actions):
        result = super().step(actions)
        result.final_observations = result.observations.copy()
        return result


class AcceptsOutOfRangeActions(Walk):
    def checked(self, actions):
        actions = np.asarray(actions)
        if actions.shape != (self.spec.num_envs,):
            raise ValueError(f"walk: expected {self.spec.num_envs} actions")
        return np.clip(actions, 0, 1)  # silently "fixes" what it should refuse


class NeverTruncates(Walk):
    LIMIT = 10**9

    def __init__(self, num_envs=1, *, seed=None, size=7):
        super().__init__(num_envs, seed=seed, size=size)
        self.spec = dataclasses.replace(self.spec, max_episode_steps=12)  # claims a limit it never applies


class ReusesItsBuffers(Walk):
    def step(self, actions):
        result = super().step(actions)
        self.out = getattr(self, "out", np.zeros_like(self.state))
        self.out[...] = result.observations
        result.observations = self.out
        return result


class SwallowsUnknownOptions(Walk):
    def __init__(self, num_envs=1, *, seed=None, size=7, **_ignored):
        super().__init__(num_envs, seed=seed, size=size)


class StepsCopiesBeforeCheckingThem(Walk):
    def checked(self, actions):
        actions = np.asarray(actions)
        if actions.shape != (self.spec.num_envs,):
            raise ValueError(f"walk: expected {self.spec.num_envs} actions")
        return actions

    def move(self, actions):
        slips = self.rng.random(len(actions)) < 0.2
        for row, action in enumerate(actions):  # the copies before a bad action have moved already
            if action not in (0, 1):
                raise ValueError(f"walk: action {action} of copy {row} is not 0 or 1")
            step = (1 if action == 0 else -1) * (-1 if slips[row] else 1)
            self.state[row] = min(max(self.state[row] + step, 0), self.size - 1)
        self.t += 1
        terminated = self.state == self.size - 1
        return terminated.astype(np.float32), terminated, ~terminated & (self.t >= self.LIMIT)


class StepsCopiesFromTheLastBeforeCheckingThem(StepsCopiesBeforeCheckingThem):
    """Moves its copies from the last to the first, checking each one's action as it reaches it: a bad
    action in the last row is refused before anything moved, one in an earlier row after the copies
    behind it moved (issue #42 item 5: the kit put bad values in the last row only)."""

    def move(self, actions):
        for row in reversed(range(len(actions))):
            if actions[row] not in (0, 1):
                raise ValueError(f"walk: action {actions[row]} of copy {row} is not 0 or 1")
            step = (1 if actions[row] == 0 else -1) * (-1 if self.rng.random() < 0.2 else 1)
            self.state[row] = min(max(self.state[row] + step, 0), self.size - 1)
        self.t += 1
        terminated = self.state == self.size - 1
        return terminated.astype(np.float32), terminated, ~terminated & (self.t >= self.LIMIT)


class CountsARefusedStepOnItsEpisodeClock(Walk):
    """Counts the step on its episode clock before it checks the actions, as a time limit wrapped around a
    checking environment would. Its walks of 4 states end long before its 200-step limit, so the few steps
    the kit's refusals added never showed (issue #42 item 5)."""

    LIMIT = 200

    def __init__(self, num_envs=1, *, seed=None, size=4):
        super().__init__(num_envs, seed=seed, size=size)

    def step(self, actions):
        self.t += 1  # counted before the check: a refused step too
        actions = self.checked(actions)
        self.t -= 1  # (move counts an accepted step)
        return super().step(actions)


class UnsafeToCloseTwice(Walk):
    def close(self):
        if getattr(self, "closed", False):
            raise RuntimeError("already closed")
        self.closed = True


class IntegerFlags(Walk):
    def step(self, actions):
        result = super().step(actions)
        result.terminated = result.terminated.astype(np.int64)
        return result


@pytest.mark.parametrize("broken, message", [
    (WrongObservationShape, r"reset\(seed\) returned observations of shape \(4, 1\); the spec says \(4,\)"),
    (NoAutoReset, "observations repeat final_observations: the copies were not reset"),
    (IgnoresTheSeed, "reset ignores its seed"),
    (FinalObservationsLost, "final_observations equal the next episode's first observation"),
    (AcceptsOutOfRangeActions, r"accepted action id 2 \(out of range 0..1\)"),
    (NeverTruncates, "ran 12 steps and was not truncated"),
    (ReusesItsBuffers, "reuses its buffers"),
    (SwallowsUnknownOptions, "accepted an unknown keyword option"),
    (StepsCopiesBeforeCheckingThem, "a refused step changed the environment"),
    (StepsCopiesFromTheLastBeforeCheckingThem, "a refused step changed the environment"),
    (CountsARefusedStepOnItsEpisodeClock, "a refused step changed the environment: step 1's"),  # truncated, reset
    (UnsafeToCloseTwice, "close\\(\\) a second time raised RuntimeError"),
    (IntegerFlags, "terminated int64"),
])
def test_a_broken_toy_fails_naming_its_defect(broken, message):
    with pytest.raises(AssertionError, match=message):
        check_environment(broken)


def test_a_correct_short_walk_passes_the_episode_clock_check():
    # the broken toys above differ from a correct walk only in their defect
    report = check_environment(lambda num_envs, seed: Walk(num_envs, seed=seed, size=4))
    assert "12 refused steps leave the episode clock (max_episode_steps=12) as it was" in report.checked


def test_an_environment_drawing_from_unseeded_randomness_is_not_deterministic():
    class GlobalRandom(Walk):
        def reseed(self, seed):
            self.rng = np.random.default_rng()  # fresh entropy whatever the seed

    with pytest.raises(AssertionError, match="again with the same actions gave another run"):
        check_environment(GlobalRandom)


def test_a_deterministic_environment_is_not_asked_for_seed_dependence():
    class Slipless(Walk):
        def start(self, rows):
            self.state[rows] = 1
            self.t[rows] = 0

        def move(self, actions):
            self.state = np.clip(self.state + np.where(actions == 0, 1, -1), 0, self.size - 1)
            self.t += 1
            terminated = self.state == self.size - 1
            return terminated.astype(np.float32), terminated, ~terminated & (self.t >= self.LIMIT)

    report = check_environment(Slipless)
    assert not report.stochastic
    assert any("a deterministic environment" in line for line in report.skipped)
