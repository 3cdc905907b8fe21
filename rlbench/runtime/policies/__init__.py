"""Distribution policies (MSRL, ATC'23): *where* the parts of a run execute is configuration, not code.

The algorithm (rlbench/algorithms/) is written once; a policy decides which roles a run starts and
what a learner does beside the algorithm's own update:

- `single_learner`: one learner fed by actors, in its own process with the memory (`--placement
  local`) or beside a replay node (`server`, `in-network`). Today's runs; the default.
- `data_parallel`: N learners (`--learners N`), each sampling its share of every batch from the
  replay node, their gradients averaged with torch.distributed's all-reduce before every optimizer
  step; learner 0 publishes the weights.
- `device`: environments, actor, replay and learner in one process on one device (on CUDA with gpu
  components, the GPU's one-device loop; elsewhere the local loop), named so a study can put it
  beside the others.

A policy is a component like any other: registered through `rlbench_register_policies` with
`PolicyCapabilities`, chosen with `--policy NAME` (did-you-mean on a typo), checked by
`rlbench.testing.check_policy`. Launchers (rlbench.runtime.distributed: local processes, Ray) ask
it how many learners to start and hand each learner process its rank and the group's rendezvous;
what a learner group does is the policy's own (`DistributionPolicy.learner_group`).
"""

from __future__ import annotations

from typing import Any


def policy_of(config: Any, registry: Any = None) -> Any:
    """The distribution policy `config.policy` names, created (an RlbenchError with a close match
    for an unknown name)."""
    if registry is None:
        from rlbench.plugins import get_registry

        registry = get_registry()
    return registry.get("policy", config.policy).create()
