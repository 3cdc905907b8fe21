"""What tabular Q-learning and SARSA share: an epsilon-greedy actor over a Q-table, a learner that
applies TD updates through the compute backend's tabular engine, and the algorithm object.

The two algorithms differ only in their TD rule (the engine's `rule`) and their tuned defaults.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from rlbench.algorithms.common import TabularConfig
from rlbench.errors import RlbenchError
from rlbench.builtin import capabilities as caps
from rlbench.protocols import ComputeBackend, EnvSpec, Sample



def table_shape(spec: EnvSpec) -> tuple[int, int]:
    if spec.n_states is None or spec.n_actions is None:
        raise RlbenchError(f"{spec.id} has no discrete states and actions; tabular algorithms need both "
                           "(try FrozenLake-v1, Taxi-v3 or CliffWalking-v0)")
    return spec.n_states, spec.n_actions


class LinearEpsilon:
    """epsilon_start -> epsilon_end linearly over the first exploration_fraction of total_steps."""

    def __init__(self, config: TabularConfig) -> None:
        self.start, self.end = config.epsilon_start, config.epsilon_end
        self.horizon = max(1.0, config.exploration_fraction * config.total_steps)

    def __call__(self, step: int) -> float:
        fraction = min(1.0, step / self.horizon)
        return self.start + fraction * (self.end - self.start)


class EpsilonGreedyActor:
    """Acts on a copy of the learner's table; ties between best actions are broken at random, so
    an all-zero row (a state never updated) does not always pick action 0."""

    def __init__(self, n_states: int, n_actions: int, epsilon: Callable[[int], float], seed: int) -> None:
        self.q = np.zeros((n_states, n_actions))
        self.version = 0
        self.epsilon = epsilon
        self.rng = np.random.default_rng(seed)

    def act(self, observations: np.ndarray, step: int) -> np.ndarray:
        rows = self.q[observations]
        explore = self.rng.random(len(rows)) < self.epsilon(step)
        # Candidates: every action when exploring, else the best ones; pick one uniformly.
        candidates = explore[:, None] | (rows == rows.max(axis=1, keepdims=True))
        return np.argmax(candidates * self.rng.random(rows.shape), axis=1)

    def greedy(self, observations: np.ndarray) -> np.ndarray:
        return np.argmax(self.q[observations], axis=1)

    def load_weights(self, weights: Sequence[np.ndarray], version: int) -> None:
        (table,) = weights
        self.q[...] = table
        self.version = version


class TabularLearner:
    """TD updates on the engine's table; `updates` counts transitions applied (one TD update each).

    relabel_epsilon: offline only. None sweeps the dataset as recorded. A number replaces each
    next_action before every epoch with an epsilon-greedy choice from the learner's current table,
    so an on-policy rule (SARSA) learns the value of the learner's policy, not of the behaviour's.
    """

    def __init__(self, engine: Any, rule: str, config: TabularConfig, seed: int,
                 relabel_epsilon: float | None = None) -> None:
        self.engine = engine
        self.rule = rule
        self.alpha, self.gamma = config.alpha, config.gamma
        self.relabel_epsilon = relabel_epsilon
        self.relabel_policy = None if relabel_epsilon is None else \
            EpsilonGreedyActor(*engine.q.shape, epsilon=lambda step: relabel_epsilon, seed=seed)
        self.updates = 0

    def update(self, sample: Sample) -> tuple[np.ndarray, dict[str, float]]:
        """Apply the batch in order; returns |TD error| of each transition against the table as it
        was before the batch (the priorities a replay memory would take)."""
        batch = sample.transitions
        td_abs = np.abs(self.td_errors(batch))
        self.engine.update(batch, rule=self.rule, alpha=self.alpha, gamma=self.gamma)
        self.updates += len(td_abs)
        return td_abs, {"td_abs_mean": float(td_abs.sum()) / max(1, len(td_abs))}

    def td_errors(self, batch: Mapping[str, np.ndarray]) -> np.ndarray:
        q = self.engine.q
        next_rows = q[batch["next_obs"]]
        if self.rule == "sarsa":
            bootstrap = next_rows[np.arange(len(next_rows)), batch["next_action"]]
        else:
            bootstrap = next_rows.max(axis=1)
        target = batch["reward"] + self.gamma * np.where(batch["done"], 0.0, bootstrap)
        return target - q[batch["obs"], batch["action"]]

    def fit_offline(self, dataset: Mapping[str, np.ndarray], epochs: int) -> dict[str, Any]:
        if int(epochs) < 1:
            raise RlbenchError(f"epochs must be >= 1, got {epochs!r}")
        if self.relabel_epsilon is None:  # the whole job in one engine call (SwiftRL's offload)
            measured = self.engine.fit_offline(dataset, rule=self.rule, alpha=self.alpha, gamma=self.gamma,
                                               epochs=epochs)
        else:
            measured = self._fit_relabelled(dict(dataset), epochs)
        self.updates += int(measured["updates"])
        return measured

    def _fit_relabelled(self, dataset: dict[str, np.ndarray], epochs: int) -> dict[str, Any]:
        policy = self.relabel_policy
        per_epoch = []
        for _ in range(int(epochs)):
            policy.load_weights(self.weights(), self.updates)
            dataset["next_action"] = policy.act(dataset["next_obs"], 0)
            per_epoch.append(self.engine.fit_offline(dataset, rule=self.rule, alpha=self.alpha, gamma=self.gamma,
                                                     epochs=1))
        measured = dict(per_epoch[-1])
        measured.update(updates=sum(m["updates"] for m in per_epoch), epochs=len(per_epoch),
                        seconds=sum(m.get("seconds", 0.0) for m in per_epoch), next_action="relabelled each epoch",
                        relabel_epsilon=self.relabel_epsilon)
        if measured["seconds"] > 0:
            measured["updates_per_s"] = measured["updates"] / measured["seconds"]
        return measured

    def weights(self) -> list[np.ndarray]:
        return [np.array(self.engine.q, dtype=np.float64, copy=True)]


class TabularAlgorithm:
    """Base of QLearning and Sarsa: subclasses set name, rule and Config."""

    name: str
    rule: str
    Config: type[TabularConfig] = TabularConfig
    capabilities = caps.TABULAR

    def make_actor(self, spec: EnvSpec, compute: ComputeBackend, config: TabularConfig, seed: int) -> EpsilonGreedyActor:
        n_states, n_actions = table_shape(spec)
        return EpsilonGreedyActor(n_states, n_actions, LinearEpsilon(config), seed)

    def make_learner(self, spec: EnvSpec, compute: ComputeBackend, config: TabularConfig, seed: int) -> TabularLearner:
        n_states, n_actions = table_shape(spec)
        return TabularLearner(compute.tabular(n_states, n_actions), self.rule, config, seed,
                              relabel_epsilon=self.offline_relabel_epsilon(config))

    def offline_relabel_epsilon(self, config: TabularConfig) -> float | None:
        """Offline: None learns from the dataset's next_action as recorded (what off-policy rules do)."""
        return None
