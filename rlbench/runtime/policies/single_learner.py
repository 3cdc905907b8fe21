"""One learner fed by actors (the default policy): the run as --placement describes it."""

from __future__ import annotations

from typing import Any

from rlbench.builtin import capabilities as caps
from rlbench.errors import InvalidCombinationError


class SingleLearner:
    capabilities = caps.SINGLE_LEARNER

    def check(self, config: Any, hp: Any) -> None:
        if config.learners != 1:
            raise InvalidCombinationError(f"--learners {config.learners} needs several learners: use --policy "
                                          "data-parallel (policy single-learner runs one)")

    def learners(self, config: Any) -> int:
        return 1

    def learner_group(self, rank: int, world: int, rendezvous: str, host: str, announce: Any) -> None:
        return None
