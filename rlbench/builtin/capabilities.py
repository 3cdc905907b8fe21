"""What the core's own components can do, declared once: `rlbench.builtin` registers these, and a
class that carries its capabilities (as the protocols let it) refers to the same object. Nothing
else states them; the runtime reads them from the registry. A leaf: imports only the protocols."""

from __future__ import annotations

from rlbench.protocols import (
    COMPUTE_SERVICES,
    AlgorithmCapabilities,
    ComputeCapabilities,
    PolicyCapabilities,
    ReplayCapabilities,
    TransportCapabilities,
)

_MiB = 1 << 20

INPROC = TransportCapabilities(max_message_bytes=1 << 31, reliable=True, ordered=True, crosses_processes=False,
                               crosses_hosts=False, zero_copy=True)
SHM = TransportCapabilities(max_message_bytes=64 * _MiB, reliable=True, ordered=True, crosses_processes=True,
                            crosses_hosts=False, zero_copy=True)
TCP = TransportCapabilities(max_message_bytes=1 << 31, reliable=True, ordered=True, crosses_processes=True,
                            crosses_hosts=True, admission=True)
UDP = TransportCapabilities(max_message_bytes=64 * _MiB, reliable=False, ordered=True, crosses_processes=True,
                            crosses_hosts=True, admission=True)
RAY = TransportCapabilities(max_message_bytes=32 * _MiB, reliable=True, ordered=True, crosses_processes=True,
                            crosses_hosts=True)
RAY_REQUIREMENT = "ray==2.60.0"  # the Ray that --launcher ray and the ray transport are tested with (scripts/setup.sh)

UNIFORM = ReplayCapabilities(prioritized=False, checkpoints=True, shards=True, frames=True)
PRIORITIZED = ReplayCapabilities(prioritized=True, checkpoints=True, shards=True, frames=True)

# it runs any algorithm whose roles need only what it provides (AlgorithmCapabilities.needs), besides these by name
CPU = ComputeCapabilities(roles=frozenset({"dqn:actor", "dqn:learner", "ddpg:actor", "ddpg:learner",
                                           "qlearning:tabular", "sarsa:tabular"}), device="cpu",
                          networks=frozenset({"mlp", "cnn"}), provides=frozenset(COMPUTE_SERVICES))

# a deep algorithm's actor infers with the backend's MLP (an image run's with its CNN: the validator asks
# for "cnn" in its networks) and its learner trains on the backend's torch device
DEEP_NEEDS = {"actor": frozenset({"mlp_inference"}), "learner": frozenset({"torch_device"})}
DQN = AlgorithmCapabilities(action_space="discrete", observation_space=("continuous", "image"), loop="replay",
                            prioritized_replay=True, checkpoints=True, needs=DEEP_NEEDS)
DDPG = AlgorithmCapabilities(action_space="continuous", observation_space="continuous", loop="replay",
                             prioritized_replay=True, checkpoints=True, needs=DEEP_NEEDS)
TABULAR = AlgorithmCapabilities(action_space="discrete", observation_space="discrete", loop="tabular", offline=True,
                                roles=("tabular",), placements=("local",), needs={"tabular": frozenset({"tabular"})})

SINGLE_LEARNER = PolicyCapabilities(learners="one", distributed=True, placements=("local", "server", "in-network"))
DATA_PARALLEL = PolicyCapabilities(learners="many", distributed=True, placements=("server",))
DEVICE = PolicyCapabilities(learners="one", distributed=False, placements=("local",))
