"""Random and reference scores of the built-in environments, for normalised scores
(score - random) / (reference - random): 0 is what a uniform random policy gets, 1 the reference
(Agarwal et al. 2021 normalise Atari by random and human scores the same way). A study file can
override them or add other environments' (`[sweep.reference_scores]`, docs/studies.md).

Random: the mean return of 1000 episodes of the uniform random policy (gymnasium 1.4.0, episode e
reset with seed e, actions from the action space seeded 0), measured for this table; ± is the
standard error. Reference: gymnasium's reward threshold (the return its registration calls
solved) where it has one, else the source named.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReferenceScore:
    random: float
    reference: float
    source: str  # where the two numbers come from


_THRESHOLD = "reference: gymnasium's reward threshold (solved)"
REFERENCE_SCORES: dict[str, ReferenceScore] = {
    "CartPole-v1": ReferenceScore(22.2, 475.0, f"random: 22.2 ± 0.4 measured; {_THRESHOLD}"),
    "CartPole-v0": ReferenceScore(22.2, 195.0, f"random: 22.2 ± 0.4 measured; {_THRESHOLD}"),
    "Acrobot-v1": ReferenceScore(-499.1, -100.0, f"random: -499.1 ± 0.3 measured; {_THRESHOLD}"),
    "MountainCar-v0": ReferenceScore(-200.0, -110.0, f"random: -200 measured (never reaches the flag); {_THRESHOLD}"),
    "MountainCarContinuous-v0": ReferenceScore(-33.3, 90.0, f"random: -33.3 ± 0.03 measured; {_THRESHOLD}"),
    "Pendulum-v1": ReferenceScore(-1230.7, -150.0, "random: -1230.7 ± 9.1 measured; reference: about what trained "
                                                   "DDPG, TD3 and SAC agents reach (RL Baselines3 Zoo's benchmark "
                                                   "lists -150 to -160); gymnasium sets no threshold"),
    "FrozenLake-v1": ReferenceScore(0.012, 0.70, f"random: 0.012 ± 0.003 measured; {_THRESHOLD}"),
    "FrozenLake8x8-v1": ReferenceScore(0.001, 0.85, f"random: 0.001 ± 0.001 measured; {_THRESHOLD}"),
    "Taxi-v3": ReferenceScore(-776.0, 8.0, f"random: -776.0 ± 2.8 measured on Taxi-v4, the successor rlbench "
                                           f"runs; {_THRESHOLD}"),
    "CliffWalking-v0": ReferenceScore(-67710.0, -13.0, "random: -67,710 ± 2,144 measured on CliffWalking-v1 (no "
                                                       "time limit: heavy-tailed); reference: the optimal path, 13 "
                                                       "steps (Sutton & Barto, Example 6.6)"),
    "Blackjack-v1": ReferenceScore(-0.399, -0.0466, "random: -0.399 ± 0.029 measured; reference: the optimal "
                                                    "hit/stick policy under gymnasium's rules (infinite deck, dealer "
                                                    "stands on 17, no natural bonus), by dynamic programming"),
}
# the ids newer gymnasium releases run instead (rlbench.builtin.envs.RENAMED) score the same
REFERENCE_SCORES["Taxi-v4"] = REFERENCE_SCORES["Taxi-v3"]
REFERENCE_SCORES["CliffWalking-v1"] = REFERENCE_SCORES["CliffWalking-v0"]
