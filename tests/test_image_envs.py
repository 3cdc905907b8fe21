"""Atari (ale-py) under the DQN preprocessing, MinAtar's boards and MuJoCo's bodies: the conformance
kit, the preprocessing against gymnasium's own Atari wrappers, episodic life and clipped rewards in
training against whole games scored raw in evaluation, dtypes from the spaces, probes that say what
to install, and the published scores studies normalise by. Budgets are a few hundred steps: a
preprocessed Atari step costs ~0.5 ms, a seeded Atari reset ~0.1 s (ale-py reloads the ROM)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from types import SimpleNamespace

import gymnasium
import numpy as np
import pytest

import rlbench
from rlbench.builtin import reference_scores
from rlbench.kit.environment import ActionCheck
from rlbench.protocols import EnvironmentCapabilities, EnvSpec, StepResult
from rlbench.runner import evaluate
from rlbench.testing import check_environment
from support import REPO


def _registry():
    return rlbench.get_registry()


def _make(env_id, num_envs=1, seed=0, **options):
    return _registry().get("environment", env_id).create(num_envs=num_envs, seed=seed, **options)


def _random_actions(spec, steps, seed=0, rows=1):
    rng = np.random.default_rng(seed)
    return [rng.integers(spec.n_actions, size=rows) for _ in range(steps)]


# -- the conformance kit ---------------------------------------------------------------------------------
@pytest.mark.parametrize("env_id, steps", [("ALE/Breakout-v5", 100), ("MinAtar/Breakout-v1", 300),
                                           ("HalfCheetah-v5", 200)])
def test_the_conformance_kit_passes(env_id, steps):
    report = check_environment(env_id, num_envs=2, steps=steps)
    assert "spec against the capabilities" in report.checked and report.stochastic
    if env_id.startswith("ALE/"):
        assert "frame stacks of 4 shift by one frame a step" in report.checked


class Frames:
    """A toy image environment: a frame is a 3x3 board filled with the copy's step count, stacked 3 deep;
    `newest_first` stacks them the wrong way round."""

    def __init__(self, num_envs=1, *, seed=None, newest_first=False):
        self.spec = EnvSpec(id="frames", num_envs=num_envs, observation_shape=(3, 3, 3), observation_dtype="uint8",
                            action_kind="discrete", n_actions=2, max_episode_steps=5, frame_stack=3)
        self.newest_first = newest_first
        self.check = ActionCheck(self.spec)
        self.t = np.zeros(num_envs, np.int64)
        self.stack = np.zeros((num_envs, 3, 3, 3), np.uint8)

    def reset(self, seed=None):
        self.t[:] = 0
        self.stack[:] = 0
        return self.stack.copy()

    def step(self, actions):
        self.t += 1 + self.check(actions)
        if self.newest_first:
            self.stack[:, 1:] = self.stack[:, :-1].copy()
            self.stack[:, 0] = self.t[:, None, None]
        else:
            self.stack[:, :-1] = self.stack[:, 1:].copy()
            self.stack[:, -1] = self.t[:, None, None]
        final = self.stack.copy()
        ended = self.t >= 5
        self.t[ended] = 0
        self.stack[ended] = 0
        return StepResult(self.stack.copy(), np.zeros(len(self.t), np.float32), ended,
                          np.zeros(len(self.t), bool), final)

    def close(self):
        pass


def test_the_kit_refuses_a_frame_stack_that_does_not_shift_newest_last():
    capabilities = EnvironmentCapabilities(action_space="discrete", observation_space="image", max_episode_steps=5)
    report = check_environment(Frames, capabilities=capabilities, steps=40)
    assert "frame stacks of 3 shift by one frame a step" in report.checked
    with pytest.raises(AssertionError, match="frame stack is not the previous observation's shifted by one frame"):
        check_environment(lambda num_envs, seed: Frames(num_envs, seed=seed, newest_first=True),
                          capabilities=capabilities, steps=40)


# -- Atari ---------------------------------------------------------------------------------------------------
def test_atari_spec_capabilities_and_first_observation():
    component = _registry().get("environment", "ALE/Breakout-v5")
    assert (component.capabilities.family, component.capabilities.evaluation_mode) == ("atari", True)
    assert component.capabilities.observation_space == "image"
    training, evaluation = _make("ALE/Breakout-v5", 2), _make("ALE/Breakout-v5", 1, evaluation=True)
    try:
        spec = training.spec
        assert (spec.observation_shape, spec.observation_dtype) == ((4, 84, 84), "uint8")
        assert spec.observation_kind == "image"
        assert spec.frame_stack == 4 and spec.n_actions == 4 and spec.max_episode_steps == 27_000
        assert "clipped" in spec.returns and "life" in spec.returns and evaluation.spec.returns == "raw"
        assert "no sticky actions" in spec.note
        obs = training.reset(seed=1)
        assert obs.dtype == np.uint8 and obs.shape == (2, 4, 84, 84)
        assert (obs == obs[:, :1]).all() and obs.max() > obs.min()  # a new episode: its first frame four times
        result = training.step(np.array([0, 1]))
        assert result.observations.dtype == np.uint8 and result.final_observations.dtype == np.uint8
    finally:
        training.close()
        evaluation.close()


@pytest.mark.parametrize("evaluation", [True, False])
def test_atari_frames_are_gymnasiums_atari_preprocessing_and_frame_stack(evaluation):
    """Noop starts, 4 frames a step max-pooled over the last two, 84x84 grayscale by INTER_AREA, 4 stacked
    oldest first: step for step what gymnasium's AtariPreprocessing + FrameStackObservation give on a game
    without FIRE (MsPacman), the same seed drawing the same no-ops. Training differs by its clipped
    rewards and by ending at the first life lost, where the comparison stops."""
    ours = _make("ALE/MsPacman-v5", 1, evaluation=evaluation)
    ale_env = gymnasium.make("ALE/MsPacman-v5", frameskip=1, repeat_action_probability=0.0, obs_type="grayscale")
    reference = gymnasium.wrappers.FrameStackObservation(
        gymnasium.wrappers.AtariPreprocessing(ale_env, noop_max=30, frame_skip=4, screen_size=84), 4)
    try:
        expected, _ = reference.reset(seed=11)
        assert np.array_equal(ours.reset(seed=11)[0], expected)
        steps = 0
        for action in _random_actions(ours.spec, 300):
            result = ours.step(action)
            expected, reward, terminated, truncated, _ = reference.step(int(action[0]))
            steps += 1
            if result.terminated[0] or terminated:
                break
            assert np.array_equal(result.final_observations[0], expected), f"step {steps}"
            assert result.rewards[0] == (reward if evaluation else np.sign(reward)), f"step {steps}"
        assert steps > 20
    finally:
        ours.close()
        reference.close()


def test_a_life_lost_ends_a_training_episode_while_evaluation_plays_the_whole_game():
    training, evaluation = _make("ALE/Breakout-v5", 1), _make("ALE/Breakout-v5", 1, evaluation=True)
    try:
        assert np.array_equal(training.reset(seed=5), evaluation.reset(seed=5))
        lives = training.envs[0].unwrapped.ale.lives()
        # training: an episode per life; the game goes on after each (the lives left go down, not back up)
        # until its last life, when a new game starts
        left = []
        for action in _random_actions(training.spec, 2000):
            result = training.step(action)
            if result.terminated[0]:
                left.append(training.envs[0].unwrapped.ale.lives())  # after the auto-reset
                assert (result.observations[0] == result.observations[0][:1]).all()  # a new episode's first frame
                if left[-1] == lives:
                    break
        assert left == [lives - 1 - k for k in range(lives - 1)] + [lives]
        # evaluation: the same lives go by within one episode, which ends with the game
        seen = []
        for action in _random_actions(evaluation.spec, 2000):
            result = evaluation.step(action)
            seen.append(evaluation.envs[0].unwrapped.ale.lives())
            if result.terminated[0] or result.truncated[0]:
                break
            assert np.array_equal(result.observations[0][:3], result.final_observations[0][:3])
        assert result.terminated[0] and sorted(set(seen[:-1]), reverse=True) == list(range(lives, 0, -1))
    finally:
        training.close()
        evaluation.close()


def test_training_clips_rewards_to_their_sign_and_evaluation_keeps_the_game_score():
    training, evaluation = _make("ALE/SpaceInvaders-v5", 1), _make("ALE/SpaceInvaders-v5", 1, evaluation=True)
    try:
        training.reset(seed=5), evaluation.reset(seed=5)
        clipped, raw = [], []
        for action in _random_actions(training.spec, 600):
            trained, evaluated = training.step(action), evaluation.step(action)
            clipped.append(float(trained.rewards[0]))
            raw.append(float(evaluated.rewards[0]))
            if trained.terminated[0] or trained.truncated[0]:  # the first life lost: the runs part here
                break
        assert set(clipped) <= {-1.0, 0.0, 1.0} and clipped == [float(np.sign(r)) for r in raw]
        assert max(raw) > 1  # Space Invaders scores 5 to 30 points an alien
    finally:
        training.close()
        evaluation.close()


def test_sticky_actions_are_an_option_and_bad_values_are_refused():
    env = _make("ALE/Pong-v5", 1, repeat_action_probability=0.25)
    try:
        assert env.envs[0].unwrapped.ale.getFloat("repeat_action_probability") == pytest.approx(0.25)
        assert "sticky actions with probability 0.25" in env.spec.note
    finally:
        env.close()
    with pytest.raises(ValueError, match="repeat_action_probability must be within"):
        _make("ALE/Pong-v5", 1, repeat_action_probability=1.5)


# -- MinAtar and MuJoCo -------------------------------------------------------------------------------------
def test_minatar_boards_are_uint8_channels_first():
    component = _registry().get("environment", "MinAtar/Seaquest-v1")
    assert (component.capabilities.family, component.capabilities.observation_space) == ("minatar", "image")
    env = _make("MinAtar/Seaquest-v1", 2)
    try:
        spec = env.spec
        assert (spec.observation_shape, spec.observation_dtype, spec.frame_stack) == ((10, 10, 10), "uint8", 0)
        assert spec.observation_kind == "image" and spec.n_actions == 6
        env.reset(seed=3)
        for action in _random_actions(spec, 30, rows=2):
            result = env.step(action)
        board = env.envs[0].game.state()  # MinAtar's own (10, 10, C) bools, after the last step
        assert board.dtype == np.bool_ and np.array_equal(result.observations[0], np.moveaxis(board, -1, 0))
        assert set(np.unique(result.observations)) <= {0, 1}
    finally:
        env.close()
    assert _make("MinAtar/Breakout-v0").spec.n_actions == 6 and _make("MinAtar/Breakout-v1").spec.n_actions == 3


def test_mujoco_observations_are_gymnasiums_float64_as_float32():
    component = _registry().get("environment", "HalfCheetah-v5")
    assert (component.capabilities.family, component.capabilities.action_space) == ("mujoco", "continuous")
    env = _make("HalfCheetah-v5", 1)
    reference = gymnasium.make("HalfCheetah-v5")
    try:
        spec = env.spec
        assert spec.observation_dtype == "float32" and spec.observation_shape == (17,) and spec.action_shape == (6,)
        expected, _ = reference.reset(seed=4)
        assert expected.dtype == np.float64
        obs = env.reset(seed=4)
        assert obs.dtype == np.float32 and np.array_equal(obs[0], expected.astype(np.float32))
        action = np.full((1, 6), 0.5, np.float32)
        result = env.step(action)
        expected, reward, *_ = reference.step(action[0])
        assert np.array_equal(result.observations[0], expected.astype(np.float32))
        assert result.rewards[0] == np.float32(reward)
    finally:
        env.close()
        reference.close()


# -- probes and cheap listing -------------------------------------------------------------------------------
@pytest.mark.parametrize("env_id, missing, install", [
    ("ALE/Pong-v5", "ale_py", "pip install ale-py"),
    ("ALE/Pong-v5", "cv2", "pip install opencv-python-headless"),
    ("MinAtar/Breakout-v1", "minatar", "pip install minatar"),
    ("HalfCheetah-v5", "mujoco", "pip install mujoco"),
    ("CartPole-v1", "gymnasium", "pip install gymnasium"),
])
def test_a_probe_without_its_module_says_what_to_install(env_id, missing, install, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == missing else find_spec(name, *a))
    probe = _registry().get("environment", env_id).probe_fn()
    assert not probe.available and f"{missing!r} not installed" in probe.reason and install in probe.reason


def test_every_atari_game_has_its_rom_and_a_missing_one_is_named(monkeypatch, tmp_path):
    games = [name for name in _registry().names("environment") if name.startswith("ALE/")]
    assert len(games) == 57
    assert all(_registry().get("environment", name).probe_fn().available for name in games)
    monkeypatch.setenv("ALE_ROMS_DIR", str(tmp_path))
    probe = _registry().get("environment", "ALE/SpaceInvaders-v5").probe_fn()
    assert not probe.available and "space_invaders.bin" in probe.reason


def test_listing_and_probing_import_no_environment_package():
    code = ("import sys, rlbench; r = rlbench.get_registry(); [c.probe() for c in r.components()]; "
            "print([m for m in ('gymnasium', 'ale_py', 'cv2', 'minatar', 'mujoco', 'torch') if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# -- reference scores and evaluation --------------------------------------------------------------------
def test_every_atari_game_has_published_scores_that_normalise_a_study():
    from rlbench.report.collect import reference_scores as study_scores
    from rlbench.report.measures import normalised_score

    scores = study_scores([])
    for name in _registry().names("environment"):
        if name.startswith("ALE/"):
            assert scores[name].reference > scores[name].random and "Agent57" in scores[name].source
    assert (scores["ALE/Pong-v5"].random, scores["ALE/Pong-v5"].reference) == (-20.7, 14.6)
    assert (scores["ALE/Breakout-v5"].random, scores["ALE/Breakout-v5"].reference) == (1.7, 30.5)
    group = SimpleNamespace(reference_scores=scores)
    for score, normalised in ((1.7, 0.0), (30.5, 1.0), (59.3, 2.0)):
        run = SimpleNamespace(env="ALE/Breakout-v5", data={"evaluation": {"mean_return": score}})
        assert normalised_score(run, group) == pytest.approx(normalised)
    assert len(reference_scores.ATARI_SCORES) == 57


class _RandomActor:
    def __init__(self, n_actions):
        self.rng, self.n_actions, self.calls = np.random.default_rng(0), n_actions, 0

    def greedy(self, observations):
        self.calls += 1
        return self.rng.integers(self.n_actions, size=len(observations))


def test_the_final_evaluation_scores_whole_atari_games_raw():
    component = _registry().get("environment", "ALE/Breakout-v5")
    actor = _RandomActor(4)
    result = evaluate(actor, SimpleNamespace(environment=component, options={}), SimpleNamespace(seed=0), 1)
    assert result["returns"] == "raw" and result["episodes"] == 1
    assert actor.calls > 100  # five lives: a training episode (one life) lasts a fifth of that
    plain = evaluate(_RandomActor(2), SimpleNamespace(environment=_registry().get("environment", "CartPole-v1"),
                                                      options={}), SimpleNamespace(seed=0), 2)
    assert plain["returns"] == "raw" and plain["episodes"] == 2


def test_a_result_says_what_its_returns_count():
    from rlbench.config import RunConfig
    from rlbench.runner import run

    result = run(RunConfig(steps=300, eval_episodes=1, hyperparameters={"learning_starts": 100, "batch_size": 16,
                                                                          "hidden_sizes": (8,)}))
    assert result["returns"] == {"learning_curve": "raw", "evaluation": "raw"}
