"""Atari 2600 games through ale-py (its wheel ships the ROMs), with the DQN preprocessing of Mnih et
al. 2015 as CleanRL's dqn_atari.py and Stable-Baselines3's atari_wrappers apply it, in one gymnasium
wrapper (`DqnAtari`) that drives the emulator directly: it grabs the screen only on the two frames it
pools, in ALE's grayscale (OpenCV's RGB-to-gray of the colour screen, exactly; CleanRL pools and
resizes the colour frames and grays them last: on a Breakout frame resized both ways, 1 pixel in ~1,800
differs, by one grey level). A step is four emulated frames (~90 us each here) and ~0.1 ms of
preprocessing, the resize the largest part: ~0.48 ms against ~0.85 ms for CleanRL's wrapper chain on
Breakout, measured side by side on this 2-core VM.

- The ALE environment is made with frameskip=1 (the wrapper repeats actions) and grayscale screens.
- Reset: a new game, then 1 to 30 no-op frames (drawn from the environment's seeded generator), then
  FIRE and action 2 for the games that wait for FIRE (SB3's FireResetEnv). The first observation is
  that frame four times over.
- Step: the action repeated on 4 frames, their rewards summed; the frame is the pixel-wise max of the
  last two screens (sprites that flicker), resized to 84x84 (INTER_AREA) and pushed as the newest of
  4 frames stacked on axis 0: uint8 (4, 84, 84), channels first as torch convolves, oldest first.
- Training (the default): a life lost ends the episode (terminated) and the game goes on at the next
  reset after a no-op step (SB3's EpisodicLifeEnv); rewards are clipped to their sign. The spec's
  `returns` says so.
- evaluation=True: an episode is a whole game and rewards are raw, so a return is the game score
  the published random and human scores are in (rlbench.builtin.reference_scores). Games that wait
  for FIRE get it after each life lost too, as training's resets give it, its rewards counted.
- Sticky actions are off by default (repeat_action_probability=0.0): CleanRL's v4 NoFrameskip
  setting and the protocol of the published scores. Machado et al. 2018 recommend 0.25 (gymnasium's
  v5 default): pass repeat_action_probability=0.25 to the factory. ALE applies it per frame.
- A game is cut at 108,000 frames (ALE v5's limit, 30 minutes of play), so no episode passes
  MAX_EPISODE_STEPS agent steps; the cut is a truncation.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import cv2
import gymnasium
import numpy as np

from rlbench.builtin.envs import GymnasiumEnv, resolve

FRAME_SKIP = 4
NOOP_MAX = 30
SCREEN_SIZE = 84
FRAME_STACK = 4
MAX_EPISODE_FRAMES = 108_000  # ALE v5's max_num_frames_per_episode
MAX_EPISODE_STEPS = MAX_EPISODE_FRAMES // FRAME_SKIP
TRAINING_RETURNS = "rewards clipped to their sign, an episode per life"
NOOP, FIRE = 0, 1  # indices in every game's minimal action set that has them (SB3 asserts the same)


def make_atari(env_id: str, num_envs: int = 1, *, seed: int | None = None, evaluation: bool = False,
               repeat_action_probability: float = 0.0) -> GymnasiumEnv:
    """`num_envs` copies of an ALE game under DqnAtari; evaluation=True scores whole games, raw."""
    if not 0.0 <= repeat_action_probability <= 1.0:
        raise ValueError(f"repeat_action_probability must be within [0, 1], got {repeat_action_probability}")
    sticky = (f"sticky actions with probability {repeat_action_probability:g}" if repeat_action_probability else
              "no sticky actions (CleanRL's and the published scores' setting; gymnasium's v5 default is 0.25)")
    resolved, _ = resolve(env_id)
    make = functools.partial(_preprocessed, resolved, evaluation, repeat_action_probability)
    env = GymnasiumEnv(resolved, num_envs=num_envs, seed=seed, make=make, frame_stack=FRAME_STACK,
                       returns="raw" if evaluation else TRAINING_RETURNS,
                       note=f"{env_id}: DQN preprocessing, {sticky}" + ("; evaluation: whole games, raw score"
                                                                         if evaluation else ""))
    env.spec = dataclasses.replace(env.spec, max_episode_steps=MAX_EPISODE_STEPS)
    return env


def _preprocessed(env_id: str, evaluation: bool, repeat_action_probability: float) -> DqnAtari:
    return DqnAtari(gymnasium.make(env_id, disable_env_checker=True, frameskip=1, obs_type="grayscale",
                                   repeat_action_probability=repeat_action_probability, full_action_space=False),
                    evaluation=evaluation)


class DqnAtari(gymnasium.Wrapper):
    """One ALE game (made with frameskip=1, obs_type="grayscale") under the DQN preprocessing the
    module docstring describes. Observations are fresh uint8 (4, 84, 84) arrays."""

    def __init__(self, env: Any, *, evaluation: bool = False, noop_max: int = NOOP_MAX) -> None:
        super().__init__(env)
        self.evaluation = evaluation
        self.noop_max = noop_max
        self.ale = env.unwrapped.ale
        self._actions = self.ale.getMinimalActionSet()
        meanings = env.unwrapped.get_action_meanings()
        assert len(self._actions) == env.action_space.n and meanings[NOOP] == "NOOP", \
            f"{env.spec.id if env.spec else env}: made with full_action_space=True? its actions are {meanings}"
        self._fires = len(meanings) >= 3 and meanings[FIRE] == "FIRE"
        height, width = self.ale.getScreenDims()
        self._screens = np.zeros((2, height, width), np.uint8)  # [0]: the frame (pooled), [1]: the one before
        self._stack = np.zeros((FRAME_STACK, SCREEN_SIZE, SCREEN_SIZE), np.uint8)
        self.observation_space = gymnasium.spaces.Box(0, 255, self._stack.shape, np.uint8)
        self._lives = 0
        self._between_lives = False  # the last step ended a training episode on a life lost, the game going on

    # -- gymnasium -----------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict[str, Any]]:
        if seed is None and self._between_lives:  # the game goes on
            self._play(NOOP)
            if self.ale.game_over():
                self._new_game(None)
        else:
            self._new_game(seed)
        self._press_fire(new_game_on_over=True)
        self._lives = self.ale.lives()
        self._between_lives = False
        self._resize_into(self._stack[-1])
        self._stack[:-1] = self._stack[-1]
        return self._stack.copy(), {"lives": self._lives}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        reward = self._play(action)
        lives = self.ale.lives()
        life_lost = 0 < lives < self._lives  # 0: some games (Qbert) stay at zero lives for a few frames before the end
        self._lives = lives
        if life_lost and self.evaluation and not self.ale.game_over():
            reward += self._press_fire(new_game_on_over=False)
            self._lives = self.ale.lives()
        terminated = self.ale.game_over(with_truncation=False)
        truncated = self.ale.game_truncated() and not terminated
        if not self.evaluation:
            self._between_lives = life_lost and not (terminated or truncated)
            terminated = terminated or life_lost
            reward = float((reward > 0) - (reward < 0))
        self._stack[:-1] = self._stack[1:]
        self._resize_into(self._stack[-1])
        return self._stack.copy(), reward, terminated, truncated, {"lives": self._lives}

    # -- the emulator ----------------------------------------------------------------------------------
    def _new_game(self, seed: int | None) -> None:
        """Reset the game (reseeded and reloaded when `seed` is given), then 1..noop_max no-op frames."""
        self.env.reset(seed=seed)
        noop = self._actions[NOOP]
        for _ in range(int(self.env.unwrapped.np_random.integers(1, self.noop_max + 1))):
            self.ale.act(noop)
            if self.ale.game_over():
                self.env.reset()
        self.ale.getScreenGrayscale(self._screens[0])

    def _press_fire(self, new_game_on_over: bool) -> float:
        """FIRE, then action 2 (SB3's FireResetEnv), for the games that wait for FIRE; their reward."""
        reward = 0.0
        if not self._fires:
            return reward
        for action in (FIRE, 2):
            reward += self._play(action)
            if self.ale.game_over():
                if not new_game_on_over:
                    break
                self._new_game(None)
        return reward

    def _play(self, action: int) -> float:
        """`action` on FRAME_SKIP frames (fewer when the game ends), rewards summed; the screen left in
        self._screens[0] is the max of the last two frames."""
        ale, chosen, screens = self.ale, self._actions[action], self._screens
        reward = 0.0
        for frame in range(FRAME_SKIP):
            reward += ale.act(chosen)
            if frame == FRAME_SKIP - 2:
                ale.getScreenGrayscale(screens[1])
            if ale.game_over():
                break
        ale.getScreenGrayscale(screens[0])
        if frame == FRAME_SKIP - 1:
            np.maximum(screens[0], screens[1], out=screens[0])
        return reward

    def _resize_into(self, frame: np.ndarray) -> None:
        cv2.resize(self._screens[0], (SCREEN_SIZE, SCREEN_SIZE), dst=frame, interpolation=cv2.INTER_AREA)
