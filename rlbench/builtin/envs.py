"""gymnasium environments behind rlbench's batched `Environment` protocol.

The N copies are stepped in a plain loop with same-step auto-reset (the final observation of an
ended episode is returned beside the first observation of the next), which is what off-policy
learners need and avoids gymnasium's vector-env bookkeeping on the one-env hot path.
"""

from __future__ import annotations

import numpy as np

from rlbench.kit.environment import ActionCheck
from rlbench.protocols import EnvSpec, Probe, StepResult

# Old ids users type, and the ids newer gymnasium releases register instead.
RENAMED = {"Taxi-v3": "Taxi-v4", "CliffWalking-v0": "CliffWalking-v1"}


def resolve(env_id: str) -> tuple[str, str]:
    """(installed id, note). Maps an old id to what the installed gymnasium provides, saying so."""
    import gymnasium

    if env_id in gymnasium.registry:
        return env_id, ""
    new = RENAMED.get(env_id)
    if new and new in gymnasium.registry:
        return new, f"{env_id} is not in gymnasium {gymnasium.__version__}; running {new}, its successor"
    raise KeyError(env_id)


def probe(env_id: str) -> Probe:
    try:
        resolve(env_id)
    except ModuleNotFoundError:
        return Probe.missing("gymnasium not installed: pip install gymnasium")
    except KeyError:
        import gymnasium

        return Probe.missing(f"gymnasium {gymnasium.__version__} has no {env_id}")
    return Probe.ok()


class GymnasiumEnv:
    def __init__(self, env_id: str, num_envs: int = 1, seed: int | None = None, **kwargs):
        import gymnasium

        if num_envs < 1:
            raise ValueError("num_envs must be >= 1")
        resolved, note = resolve(env_id)
        self.envs = [gymnasium.make(resolved, disable_env_checker=True, **kwargs) for _ in range(num_envs)]
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
        self.spec = EnvSpec(
            id=resolved,
            num_envs=num_envs,
            observation_shape=() if discrete_obs else tuple(obs_space.shape),
            observation_dtype="int64" if discrete_obs else "float32",
            action_kind="discrete" if discrete_act else "continuous",
            n_actions=int(act_space.n) if discrete_act else None,
            action_shape=() if discrete_act else tuple(act_space.shape),
            action_low=None if discrete_act else tuple(float(x) for x in act_space.low),
            action_high=None if discrete_act else tuple(float(x) for x in act_space.high),
            n_states=int(obs_space.n) if discrete_obs else None,
            max_episode_steps=first.spec.max_episode_steps if first.spec else None,
            reward_threshold=first.spec.reward_threshold if first.spec else None,
            note=note,
        )
        self._seed = seed
        self._check_actions = ActionCheck(self.spec)
        shape = (num_envs, *self.spec.observation_shape)
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
