"""Tabular SARSA: on-policy TD control.

    Q(s, a) <- Q(s, a) + alpha * (r + gamma * Q(s', a') - Q(s, a))     (no bootstrap when done)

Online, a' is the action the epsilon-greedy actor has already chosen at s' and executes next.
Offline (SwiftRL), the engine sweeps a dataset; what a' is there is a choice:
  offline_next_action="policy"   a' is drawn before each epoch from the learner's own epsilon-greedy
                                 policy (epsilon_end) at s', so SARSA stays on-policy and improves
                                 its policy epoch by epoch (the default);
  offline_next_action="dataset"  a' is the behaviour's recorded action: SARSA then evaluates the
                                 behaviour policy (a random behaviour: the random policy's values).
"""

from __future__ import annotations

from dataclasses import dataclass

from rlbench.algorithms.common import TabularConfig
from rlbench.algorithms.tabular import TabularAlgorithm
from rlbench.errors import RlbenchError

OFFLINE_NEXT_ACTIONS = ("policy", "dataset")


@dataclass
class SarsaConfig(TabularConfig):
    total_steps: int = 200_000
    alpha: float = 0.1
    gamma: float = 0.99
    epsilon_end: float = 0.01  # SARSA learns the value of its epsilon-greedy policy: keep it near greedy
    epochs: int = 20
    offline_next_action: str = "policy"


class Sarsa(TabularAlgorithm):
    name = "sarsa"
    rule = "sarsa"
    Config = SarsaConfig

    def offline_relabel_epsilon(self, config: SarsaConfig) -> float | None:
        if config.offline_next_action not in OFFLINE_NEXT_ACTIONS:
            raise RlbenchError(f"offline_next_action must be one of {', '.join(OFFLINE_NEXT_ACTIONS)}, "
                               f"got {config.offline_next_action!r}")
        return config.epsilon_end if config.offline_next_action == "policy" else None
