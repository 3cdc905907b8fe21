"""What the fpga components can do, declared once: plugin.py registers these objects and the
component classes point at the same ones. A leaf: imports nothing of the plugin, and no pyopencl."""

from __future__ import annotations

from rlbench.protocols import ComputeCapabilities, ReplayCapabilities

LEARNER_NOTE = "learner runs on torch CPU"
COMPUTE_CAPABILITIES = ComputeCapabilities(
    roles=frozenset({"dqn:actor", "ddpg:actor", "dqn:learner", "ddpg:learner", "qlearning:tabular", "sarsa:tabular"}),
    device="opencl",
    does_not=f"no OpenCL training kernels: the dqn/ddpg {LEARNER_NOTE} (torch.device('cpu')); the OpenCL "
             "kernels run actor MLP inference and tabular Q-learning/SARSA updates, and no convolution: "
             "no CNN for image observations",
)  # networks: the default, MLPs only
REPLAY_CAPABILITIES = ReplayCapabilities(prioritized=True, device="opencl")
