"""Everything in one process on one device: environments, actor, replay memory and learner.

On CUDA with gpu components this is the GPU's one-device loop (captured environment and learner
chunks); anywhere else it is the single-process loop. Named as a policy so that a study can put "one
accelerator does it all" beside one learner fed by actor processes and beside data parallelism.
"""

from __future__ import annotations

from typing import Any

from rlbench.builtin import capabilities as caps
from rlbench.errors import InvalidCombinationError


class Device:
    capabilities = caps.DEVICE

    def check(self, config: Any, hp: Any) -> None:
        if config.placement != "local":
            raise InvalidCombinationError(f"policy device runs every part in one process: --placement "
                                          f"{config.placement} asks for a replay node (drop it, or use policy "
                                          "single-learner or data-parallel)")
        if config.learners != 1:
            raise InvalidCombinationError(f"policy device runs one learner, not --learners {config.learners} "
                                          "(use --policy data-parallel)")

    def learners(self, config: Any) -> int:
        return 1

    def learner_group(self, rank: int, world: int, rendezvous: str, host: str, announce: Any) -> None:
        return None
