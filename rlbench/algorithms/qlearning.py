"""Tabular Q-learning (Watkins): off-policy TD control.

    Q(s, a) <- Q(s, a) + alpha * (r + gamma * max_a' Q(s', a') - Q(s, a))     (no bootstrap when done)

The actor explores epsilon-greedily; the learner bootstraps from the greedy value of s', whatever
action the actor takes there. Offline (SwiftRL), the same update sweeps a collected dataset.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlbench.algorithms.common import TabularConfig
from rlbench.algorithms.tabular import TabularAlgorithm


@dataclass
class QLearningConfig(TabularConfig):
    total_steps: int = 200_000
    alpha: float = 0.1
    gamma: float = 0.99
    epochs: int = 20


class QLearning(TabularAlgorithm):
    name = "qlearning"
    rule = "qlearning"
    Config = QLearningConfig
