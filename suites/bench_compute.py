"""Compute backends: actor inference (an MLP forward, batch 1 and 256), the learner's update step
(DQN, DDPG) and the tabular TD update (Q-learning, SARSA), p50 latency in microseconds, torch and BLAS
pinned to one thread. Inference and learner steps use `rlbench bench compute`'s code
(rlbench.bench.compute); inference is also reported as a ratio to a torch CPU forward of the same MLP
measured in the same run."""

from __future__ import annotations

from typing import Any

from .common import lookup, registry, unavailable

from rlbench.bench.compute import BATCHES, NETWORKS
from rlbench.bench.matrix import COMPUTES

ITERATIONS = 1000  # timed calls at batch 1 (a tenth at batch 256 and for learner steps)
TABULAR_BATCH = 1024  # transitions per TD update call
TABULAR_SHAPE = (500, 6)  # Taxi-v3's states x actions


def _backends() -> tuple[list[tuple[str, Any]], dict[str, str]]:
    skipped = unavailable("compute")
    return [(name, registry().get("compute", name).create()) for name in COMPUTES if name not in skipped], skipped


def _no_role(name: str, backend: Any, algorithm: str, role: str) -> str:
    detail = f": {backend.capabilities.does_not}" if backend.capabilities.does_not else ""
    return f"compute {name} cannot run the {algorithm} {role}{detail}"


class Inference:
    params = [list(COMPUTES), [name for name, *_ in NETWORKS], [str(b) for b in BATCHES]]
    param_names = ["compute", "network", "batch"]
    timeout = 600

    def setup_cache(self) -> dict[str, Any]:
        from rlbench.bench.compute import measure_inference
        from rlbench.kit.bench import pin_one_thread

        pin_one_thread()
        backends, skipped = _backends()
        rows = {f"{r['backend']}/{r['network']}/{r['batch']}": r for r in measure_inference(backends, ITERATIONS)}
        cache: dict[str, Any] = {}
        for name in COMPUTES:
            backend = dict(backends).get(name)
            for network, *_ in NETWORKS:
                algorithm = network.split("-")[0]
                for batch in BATCHES:
                    key = f"{name}/{network}/{batch}"
                    if name in skipped:
                        cache[key] = {"skipped": skipped[name]}
                    elif key not in rows:
                        cache[key] = {"skipped": _no_role(name, backend, algorithm, "actor")}
                    else:
                        cache[key] = {"metrics": rows[key]}
        return cache

    def setup(self, cache: dict[str, Any], compute: str, network: str, batch: str) -> None:
        self.row = lookup(cache, f"{compute}/{network}/{batch}")

    def track_p50(self, cache, compute, network, batch) -> float:
        return self.row["engine"]["p50_us"]

    track_p50.unit = "us"

    def track_speedup_vs_torch_cpu(self, cache, compute, network, batch) -> float:
        return self.row["speedup_vs_torch_cpu"]

    track_speedup_vs_torch_cpu.unit = "x (torch cpu p50 / p50)"


class LearnerUpdate:
    params = [list(COMPUTES), ["dqn", "ddpg"]]
    param_names = ["compute", "algorithm"]
    timeout = 600

    def setup_cache(self) -> dict[str, Any]:
        from rlbench.bench.compute import measure_learners
        from rlbench.kit.bench import pin_one_thread

        pin_one_thread()
        backends, skipped = _backends()
        rows = {f"{r['backend']}/{r['algorithm']}": r for r in measure_learners(backends, ITERATIONS)}
        cache: dict[str, Any] = {}
        for name in COMPUTES:
            for algorithm in self.params[1]:
                key = f"{name}/{algorithm}"
                if name in skipped:
                    cache[key] = {"skipped": skipped[name]}
                elif key not in rows:
                    cache[key] = {"skipped": _no_role(name, dict(backends)[name], algorithm, "learner")}
                else:
                    cache[key] = {"metrics": rows[key]}
        return cache

    def setup(self, cache: dict[str, Any], compute: str, algorithm: str) -> None:
        self.row = lookup(cache, f"{compute}/{algorithm}")

    def track_update_p50(self, cache, compute, algorithm) -> float:
        return self.row["update"]["p50_us"]

    track_update_p50.unit = "us (batch 128)"

    def track_weights_export_p50(self, cache, compute, algorithm) -> float:
        return self.row["weights_export"]["p50_us"]

    track_weights_export_p50.unit = "us"


def measure_tabular(backend: Any, rule: str, iterations: int) -> dict[str, float]:
    """p50 of one in-order TD update over TABULAR_BATCH random Taxi-sized transitions."""
    import numpy as np

    from rlbench.bench.compute import time_calls

    rng = np.random.default_rng(0)
    n_states, n_actions = TABULAR_SHAPE
    batch = {"obs": rng.integers(n_states, size=TABULAR_BATCH), "action": rng.integers(n_actions, size=TABULAR_BATCH),
             "reward": rng.standard_normal(TABULAR_BATCH).astype(np.float32),
             "next_obs": rng.integers(n_states, size=TABULAR_BATCH),
             "next_action": rng.integers(n_actions, size=TABULAR_BATCH),
             "done": rng.random(TABULAR_BATCH) < 0.05}
    engine = backend.tabular(n_states, n_actions)
    timing = time_calls(lambda: engine.update(batch, rule=rule, alpha=0.1, gamma=0.99), iterations)
    return {"update_p50_us": timing["p50_us"], "transitions_per_s": TABULAR_BATCH / timing["p50_us"] * 1e6}


class TabularUpdate:
    params = [list(COMPUTES), ["qlearning", "sarsa"]]
    param_names = ["compute", "algorithm"]
    timeout = 600

    def setup_cache(self) -> dict[str, Any]:
        from rlbench.kit.bench import pin_one_thread

        pin_one_thread()
        backends, skipped = _backends()
        cache: dict[str, Any] = {}
        for name in COMPUTES:
            for algorithm in self.params[1]:
                key = f"{name}/{algorithm}"
                if name in skipped:
                    cache[key] = {"skipped": skipped[name]}
                elif not dict(backends)[name].capabilities.supports(algorithm, "tabular"):
                    cache[key] = {"skipped": _no_role(name, dict(backends)[name], algorithm, "tabular")}
                else:
                    cache[key] = {"metrics": measure_tabular(dict(backends)[name], algorithm, ITERATIONS // 10)}
        return cache

    def setup(self, cache: dict[str, Any], compute: str, algorithm: str) -> None:
        self.row = lookup(cache, f"{compute}/{algorithm}")

    def track_update_p50(self, cache, compute, algorithm) -> float:
        return self.row["update_p50_us"]

    track_update_p50.unit = f"us ({TABULAR_BATCH} transitions)"

    def track_transitions_per_s(self, cache, compute, algorithm) -> float:
        return self.row["transitions_per_s"]

    track_transitions_per_s.unit = "transitions/s"
