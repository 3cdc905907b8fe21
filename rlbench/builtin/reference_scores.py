"""Random and reference scores of the built-in environments, for normalised scores
(score - random) / (reference - random): 0 is what a uniform random policy gets, 1 the reference
(Agarwal et al. 2021 normalise Atari by random and human scores the same way). A study file can
override them or add other environments' (`[sweep.reference_scores]`, docs/studies.md).

Random: the mean return of 1000 episodes of the uniform random policy (gymnasium 1.4.0, episode e
reset with seed e, actions from the action space seeded 0), measured for this table; ± is the
standard error. Reference: gymnasium's reward threshold (the return its registration calls
solved) where it has one, else the source named.

Atari (the 57 games of the Arcade Learning Environment benchmark, ALE/<Game>-v5): the published random
and human scores in the table of Badia et al. 2020 (Agent57), the one Mnih et al. 2015 (Nature DQN)
began, that rliable (Agarwal et al. 2021) and Dopamine-based code normalise by. Both are raw game
scores of whole games (all lives), each episode started with 1 to 30 no-ops and cut at 108,000 frames,
no sticky actions: what an Atari run's evaluation returns (rlbench.builtin.atari, evaluation=True).
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

# (random, human) per game, read from google-deepmind/dqn_zoo dqn_zoo/atari_data.py (commit 45061f4) and
# checked against google-research/google-research bigger_better_faster/bbf/eval_run_experiment.py (human and
# random) and google-research/reincarnating_rl reincarnating_rl/atari_scores.py (random): all agree but on
# Video Pinball's random score, where the Agent57 table rliable uses is followed.
ATARI_SCORES: dict[str, tuple[float, float]] = {
    "Alien": (227.8, 7127.7),
    "Amidar": (5.8, 1719.5),
    "Assault": (222.4, 742.0),
    "Asterix": (210.0, 8503.3),
    "Asteroids": (719.1, 47388.7),
    "Atlantis": (12850.0, 29028.1),
    "BankHeist": (14.2, 753.1),
    "BattleZone": (2360.0, 37187.5),
    "BeamRider": (363.9, 16926.5),
    "Berzerk": (123.7, 2630.4),
    "Bowling": (23.1, 160.7),
    "Boxing": (0.1, 12.1),
    "Breakout": (1.7, 30.5),
    "Centipede": (2090.9, 12017.0),
    "ChopperCommand": (811.0, 7387.8),
    "CrazyClimber": (10780.5, 35829.4),
    "Defender": (2874.5, 18688.9),
    "DemonAttack": (152.1, 1971.0),
    "DoubleDunk": (-18.6, -16.4),
    "Enduro": (0.0, 860.5),
    "FishingDerby": (-91.7, -38.7),
    "Freeway": (0.0, 29.6),
    "Frostbite": (65.2, 4334.7),
    "Gopher": (257.6, 2412.5),
    "Gravitar": (173.0, 3351.4),
    "Hero": (1027.0, 30826.4),
    "IceHockey": (-11.2, 0.9),
    "Jamesbond": (29.0, 302.8),
    "Kangaroo": (52.0, 3035.0),
    "Krull": (1598.0, 2665.5),
    "KungFuMaster": (258.5, 22736.3),
    "MontezumaRevenge": (0.0, 4753.3),
    "MsPacman": (307.3, 6951.6),
    "NameThisGame": (2292.3, 8049.0),
    "Phoenix": (761.4, 7242.6),
    "Pitfall": (-229.4, 6463.7),
    "Pong": (-20.7, 14.6),
    "PrivateEye": (24.9, 69571.3),
    "Qbert": (163.9, 13455.0),
    "Riverraid": (1338.5, 17118.0),
    "RoadRunner": (11.5, 7845.0),
    "Robotank": (2.2, 11.9),
    "Seaquest": (68.4, 42054.7),
    "Skiing": (-17098.1, -4336.9),
    "Solaris": (1236.3, 12326.7),
    "SpaceInvaders": (148.0, 1668.7),
    "StarGunner": (664.0, 10250.0),
    "Surround": (-10.0, 6.5),
    "Tennis": (-23.8, -8.3),
    "TimePilot": (3568.0, 5229.2),
    "Tutankham": (11.4, 167.6),
    "UpNDown": (533.4, 11693.2),
    "Venture": (0.0, 1187.5),
    "VideoPinball": (0.0, 17667.9),  # random: 0.0 in Agent57's table, BBF's and reincarnating_rl's (_DISPUTED)
    "WizardOfWor": (563.5, 4756.5),
    "YarsRevenge": (3092.9, 54576.9),
    "Zaxxon": (32.5, 9173.3),
}
ATARI_SOURCE = ("random and human: the table of Badia et al. 2020 (Agent57), as google-deepmind/dqn_zoo "
                "dqn_zoo/atari_data.py and google-research/google-research bigger_better_faster/bbf/"
                "eval_run_experiment.py ship them; raw game scores, no-op starts, no sticky actions")
_DISPUTED = {"VideoPinball": "; random 0 as in Agent57's table and BBF's (dqn_zoo: 16,256.9)"}
for _game, (_random, _human) in ATARI_SCORES.items():
    REFERENCE_SCORES[f"ALE/{_game}-v5"] = ReferenceScore(_random, _human, ATARI_SOURCE + _DISPUTED.get(_game, ""))
