"""gymnasium environments behind rlbench's batched `Environment` protocol.

The N copies are stepped in a plain loop with same-step auto-reset (the final observation of an
ended episode is returned beside the first observation of the next), which is what off-policy
learners need and avoids gymnasium's vector-env bookkeeping on the one-env hot path.

An observation's dtype comes from its space (`observation_dtype`): uint8 and bool images (two or
more dimensions) are handed out as uint8, every other box as float32 (learners compute in float32;
MuJoCo's float64 is narrowed), discrete states as int64 ids. Beyond gymnasium's own ids: Atari
(ale-py registers its games with gymnasium on first use; the DQN preprocessing is
rlbench.builtin.atari's), MinAtar (built here from minatar's game classes, boards turned channels
first as torch convolves) and MuJoCo (gymnasium's v5 bodies, on `mujoco`).
"""

from __future__ import annotations

import functools
import re
import warnings
from typing import Any, Callable

import gymnasium
import numpy as np

from rlbench.builtin import snake_case
from rlbench.errors import UnavailableComponentError
from rlbench.kit.environment import ActionCheck
from rlbench.protocols import EnvSpec, StepResult

# Old ids users type, and the ids newer gymnasium releases register instead.
RENAMED = {"Taxi-v3": "Taxi-v4", "CliffWalking-v0": "CliffWalking-v1"}


def _register_family(env_id: str) -> None:
    """Make gymnasium know ale-py's games (registered by ale-py, not by gymnasium itself)."""
    if env_id.startswith("ALE/") and env_id not in gymnasium.registry:
        import ale_py

        gymnasium.register_envs(ale_py)


def resolve(env_id: str) -> tuple[str, str]:
    """(installed id, note). Maps an old id to what the installed gymnasium provides, saying so."""
    _register_family(env_id)
    if env_id in gymnasium.registry:
        return env_id, ""
    new = RENAMED.get(env_id)
    if new and new in gymnasium.registry:
        return new, f"{env_id} is not in gymnasium {gymnasium.__version__}; running {new}, its successor"
    raise UnavailableComponentError(f"gymnasium {gymnasium.__version__} has no environment {env_id}")


def observation_dtype(space: Any) -> str:
    """What rlbench hands out for observations of a gymnasium space: int64 state ids, uint8 images
    (uint8 or bool boxes of two or more dimensions), float32 for every other box."""
    if isinstance(space, gymnasium.spaces.Discrete):
        return "int64"
    if np.dtype(space.dtype) in (np.uint8, np.bool_) and len(space.shape) >= 2:
        return "uint8"
    return "float32"


class GymnasiumEnv:
    """`num_envs` copies of a gymnasium environment: `gymnasium.make(env_id, **kwargs)`, or `make()`
    where a family builds its copies itself (a preprocessing wrapper, say). `frame_stack`, `returns`
    and `note` go into the spec as given."""

    def __init__(self, env_id: str, num_envs: int = 1, seed: int | None = None, *,
                 make: Callable[[], Any] | None = None, frame_stack: int = 0, returns: str = "raw",
                 note: str = "", **kwargs: Any):
        if num_envs < 1:
            raise ValueError("num_envs must be >= 1")
        resolved, renamed = env_id, ""
        if make is None:
            resolved, renamed = resolve(env_id)
            make = functools.partial(gymnasium.make, resolved, disable_env_checker=True, **kwargs)
        elif kwargs:
            raise TypeError(f"{env_id}: unexpected keyword option(s) {', '.join(sorted(kwargs))}")
        self.envs = [make() for _ in range(num_envs)]
        first = self.envs[0]
        obs_space, act_space = first.observation_space, first.action_space
        spaces = gymnasium.spaces
        # A tuple of discrete spaces (Blackjack) is one discrete state: its mixed-radix index.
        self._radices = None
        if isinstance(obs_space, spaces.Tuple) and all(isinstance(s, spaces.Discrete) for s in obs_space.spaces):
            self._radices = tuple(int(s.n) for s in obs_space.spaces)
            self._starts = np.array([int(s.start) for s in obs_space.spaces])
            obs_space = spaces.Discrete(int(np.prod(self._radices)))
        elif not isinstance(obs_space, (spaces.Discrete, spaces.Box)):
            raise ValueError(f"{env_id}: observation space {obs_space} is neither discrete, a tuple of discrete "
                             "spaces, nor a box")
        discrete_obs = isinstance(obs_space, spaces.Discrete)
        discrete_act = isinstance(act_space, spaces.Discrete)
        registered = first.spec  # gymnasium's registration, where the copies come from one
        self.spec = EnvSpec(
            id=resolved,
            num_envs=num_envs,
            observation_shape=() if discrete_obs else tuple(obs_space.shape),
            observation_dtype=observation_dtype(obs_space),
            action_kind="discrete" if discrete_act else "continuous",
            n_actions=int(act_space.n) if discrete_act else None,
            action_shape=() if discrete_act else tuple(act_space.shape),
            action_low=None if discrete_act else tuple(float(x) for x in act_space.low),
            action_high=None if discrete_act else tuple(float(x) for x in act_space.high),
            n_states=int(obs_space.n) if discrete_obs else None,
            max_episode_steps=registered.max_episode_steps if registered else None,
            reward_threshold=registered.reward_threshold if registered else None,
            note="; ".join(text for text in (renamed, note) if text),
            frame_stack=frame_stack,
            returns=returns,
        )
        self._seed = seed
        self._check_actions = ActionCheck(self.spec)
        shape = (num_envs, *self.spec.observation_shape)
        # assigning into these converts what the copies return to the spec's dtype (float64 -> float32, bool -> uint8)
        self._obs = np.zeros(shape, dtype=self.spec.observation_dtype)
        self._final = np.zeros(shape, dtype=self.spec.observation_dtype)

    def reset(self, seed: int | None = None) -> np.ndarray:
        seed = self._seed if seed is None else seed
        for i, env in enumerate(self.envs):
            obs, _ = env.reset(seed=None if seed is None else seed + i)
            if seed is not None:
                env.action_space.seed(seed + i)
            self._obs[i] = self.encode_observation(obs)
        return self._obs.copy()

    def step(self, actions: np.ndarray) -> StepResult:
        actions = self._check_actions(actions)  # before any copy moves
        n = len(self.envs)
        rewards = np.empty(n, dtype=np.float32)
        terminated = np.empty(n, dtype=bool)
        truncated = np.empty(n, dtype=bool)
        discrete = self.spec.action_kind == "discrete"
        for i, env in enumerate(self.envs):
            action = int(actions[i]) if discrete else actions[i]
            obs, reward, term, trunc, _ = env.step(action)
            rewards[i], terminated[i], truncated[i] = reward, term, trunc
            self._final[i] = self.encode_observation(obs)
            if term or trunc:
                obs, _ = env.reset()
            self._obs[i] = self.encode_observation(obs)
        return StepResult(self._obs.copy(), rewards, terminated, truncated, self._final.copy())

    def encode_observation(self, obs):
        """What the environment returned, as rlbench hands it out (tuple states as one index)."""
        if self._radices is None:
            return obs
        return int(np.ravel_multi_index(tuple(np.asarray(obs) - self._starts), self._radices))

    def close(self) -> None:
        for env in self.envs:
            env.close()


# -- MinAtar -------------------------------------------------------------------------------------------
def make_minatar(env_id: str, num_envs: int = 1, *, seed: int | None = None) -> GymnasiumEnv:
    """MinAtar/<Game>-v0 (all 6 actions) and -v1 (the game's minimal action set), as MinAtar's own
    gymnasium ids name them."""
    match = re.fullmatch(r"MinAtar/(\w+)-v([01])", env_id)
    if match is None:
        raise ValueError(f"{env_id}: MinAtar ids are MinAtar/<Game>-v0 or -v1")
    return GymnasiumEnv(env_id, num_envs=num_envs, seed=seed,
                        make=functools.partial(MinAtarEnv, snake_case(match[1]), minimal_actions=match[2] == "1"))


class MinAtarEnv(gymnasium.Env):
    """A MinAtar game (Young & Tian 2019) as a gymnasium environment: its 10x10 boards of C channels as
    uint8 (C, 10, 10), channels first as torch convolves. MinAtar's defaults stay (sticky actions with
    probability 0.1, difficulty ramping); reset(seed) seeds the game's generator, which draws both, and
    forgets the last action a sticky one would repeat. (MinAtar's own gymnasium class seeds neither
    gymnasium's generator nor the last action, so a seeded reset did not decide the run.)"""

    def __init__(self, game: str, minimal_actions: bool) -> None:
        self.game = _minatar_environment()(game)
        self._actions = self.game.minimal_action_set() if minimal_actions else list(range(self.game.num_actions()))
        height, width, channels = self.game.state_shape()
        self.action_space = gymnasium.spaces.Discrete(len(self._actions))
        self.observation_space = gymnasium.spaces.Box(0, 1, (channels, height, width), np.uint8)

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        if seed is not None:
            self.game.seed(int(self.np_random.integers(2**31)))
            self.game.last_action = 0
        self.game.reset()
        return self._observation(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        reward, done = self.game.act(self._actions[action])
        return self._observation(), float(reward), bool(done), False, {}

    def _observation(self) -> np.ndarray:
        return np.moveaxis(self.game.state(), -1, 0).astype(np.uint8)


def _minatar_environment() -> Any:
    """minatar.Environment, imported without its GUI: minatar imports matplotlib and seaborn at import
    for its display (4 s of a process's start-up here, in every actor and learner of a MinAtar run),
    falling back to a logged warning without them; the games use neither. Only modules not imported yet
    are held back, and only for that import."""
    import logging
    import sys

    if "minatar" in sys.modules:
        return sys.modules["minatar"].Environment
    held = [name for name in ("matplotlib.pyplot", "seaborn") if name not in sys.modules]
    for name in held:
        sys.modules[name] = None  # type: ignore[assignment]  # `import name` raises ImportError
    logging.disable(logging.WARNING)
    try:
        from minatar import Environment
    finally:
        logging.disable(logging.NOTSET)
        for name in held:
            if sys.modules.get(name, 0) is None:
                del sys.modules[name]
    return Environment


# -- MuJoCo --------------------------------------------------------------------------------------------
def make_mujoco(env_id: str, num_envs: int = 1, *, seed: int | None = None) -> GymnasiumEnv:
    """gymnasium's MuJoCo bodies: float64 observations handed out as float32, continuous actions."""
    _route_mujoco_warnings()
    return GymnasiumEnv(env_id, num_envs=num_envs, seed=seed)


def _route_mujoco_warnings() -> None:
    """MuJoCo writes its warnings (mujoco 4 warns about an attribute gymnasium's HalfCheetah model
    uses) to MUJOCO_LOG.TXT in the working directory unless a handler takes them: make them Python
    warnings, where no handler was set already."""
    import mujoco

    if mujoco.get_mju_user_warning() is None:
        mujoco.set_mju_user_warning(lambda message: warnings.warn(f"mujoco: {message}", RuntimeWarning, stacklevel=2))
