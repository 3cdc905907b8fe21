"""Environments: steps per second of a batch of `num_envs` environments (same-step auto-reset) under
uniformly random actions drawn beforehand, so the figure is the environment's own cost.

RLBENCH_ASV_MATRIX=quick (the default) steps rlbench.bench.matrix.QUICK_ENVIRONMENTS (the classic ones, and
of Atari, MinAtar and MuJoCo the games the matrix trains on); RLBENCH_ASV_MATRIX=full steps them all."""

from __future__ import annotations

import time
from typing import Any

from .common import full_matrix, lookup, registry, unavailable

from rlbench.bench.matrix import ENVIRONMENTS, QUICK_ENVIRONMENTS

OUTSIDE_QUICK = "outside the quick subset (rlbench.bench.matrix.QUICK_ENVIRONMENTS; RLBENCH_ASV_MATRIX=full steps it)"

NUM_ENVS = ("1", "8")
SECONDS = 0.2  # stepping time per environment and batch size


def random_actions(spec: Any, count: int, rng: Any) -> list[Any]:
    import numpy as np

    if spec.action_kind == "discrete":
        return [rng.integers(spec.n_actions, size=spec.num_envs) for _ in range(count)]
    low = np.asarray(spec.action_low, dtype=np.float32)
    high = np.asarray(spec.action_high, dtype=np.float32)
    return [rng.uniform(low, high, size=(spec.num_envs, *spec.action_shape)).astype(np.float32) for _ in range(count)]


def steps_per_second(env: Any, seconds: float) -> float:
    """Environment steps (every env of the batch counts) per second of stepping."""
    import numpy as np

    actions = random_actions(env.spec, 256, np.random.default_rng(0))
    env.reset(seed=0)
    for action in actions[:32]:  # warm up
        env.step(action)
    steps = 0
    started = time.perf_counter()
    while True:
        for action in actions:
            env.step(action)
        steps += len(actions)
        elapsed = time.perf_counter() - started
        if elapsed >= seconds:
            return steps * env.spec.num_envs / elapsed


class Step:
    params = [list(ENVIRONMENTS), list(NUM_ENVS)]
    param_names = ["environment", "num_envs"]
    timeout = 600

    def setup_cache(self) -> dict[str, Any]:
        skipped = unavailable("environment")
        chosen = ENVIRONMENTS if full_matrix() else QUICK_ENVIRONMENTS
        cache: dict[str, Any] = {}
        for name in ENVIRONMENTS:
            for num_envs in NUM_ENVS:
                key = f"{name}/{num_envs}"
                if name in skipped or name not in chosen:
                    cache[key] = {"skipped": skipped.get(name, OUTSIDE_QUICK)}
                    continue
                try:
                    env = registry().get("environment", name).create(num_envs=int(num_envs), seed=0)
                except Exception as error:  # asv marks this one cell failed; the others still run
                    cache[key] = {"failed": f"creating {name} failed: {type(error).__name__}: {error}"}
                    continue
                try:
                    cache[key] = {"metrics": {"steps_per_s": steps_per_second(env, SECONDS)}}
                finally:
                    env.close()
        return cache

    def setup(self, cache: dict[str, Any], environment: str, num_envs: str) -> None:
        self.metrics = lookup(cache, f"{environment}/{num_envs}")

    def track_steps_per_s(self, cache, environment, num_envs) -> float:
        return self.metrics["steps_per_s"]

    track_steps_per_s.unit = "env steps/s"
