"""The core's own components, registered through the same hooks as any third-party plugin.

Everything here is a lazy "module:attr" reference or a cheap callable: this module is imported by
`rlbench list`, so it must not import numpy-heavy, torch or gymnasium code.
"""

from __future__ import annotations

import functools
import platform

from rlbench.builtin import capabilities as caps
from rlbench.hookspecs import hookimpl
from rlbench.protocols import EnvironmentCapabilities, probe_modules


@hookimpl
def rlbench_register_transports(register):
    register("inproc", "rlbench.builtin.transports.inproc:InprocTransport",
             capabilities=caps.INPROC,
             description="queues between threads of one process (the no-network baseline)")
    register("shm", "rlbench.builtin.transports.shm:ShmTransport",
             probe="rlbench.builtin.transports.shm:probe",
             capabilities=caps.SHM,
             description="shared-memory rings between processes, busy-polling, no syscalls on the fast path")
    register("tcp", "rlbench.builtin.transports.tcp:TcpTransport",
             capabilities=caps.TCP,
             description="kernel TCP sockets, length-prefixed messages (kernel baseline)")
    register("udp", "rlbench.builtin.transports.udp:UdpTransport",
             capabilities=caps.UDP,
             description="kernel UDP datagrams with fragmentation, sequence numbers and loss detection")
    register("ray", "rlbench.builtin.transports.ray_actors:RayTransport",
             probe="rlbench.builtin.transports.ray_actors:probe",
             capabilities=caps.RAY,
             description="Ray actor calls through an inbox actor on the listener's node (the Ray/RLlib baseline)")


@hookimpl
def rlbench_register_replay_memories(register):
    register("uniform", "rlbench.builtin.replay:UniformReplay",
             capabilities=caps.UNIFORM,
             description="FIFO ring of numpy arrays, uniform sampling")
    register("prioritized", "rlbench.builtin.replay:PrioritizedReplay",
             probe="rlbench.builtin.replay:probe_native",
             capabilities=caps.PRIORITIZED,
             description="proportional prioritized replay (Schaul et al.), sum/min tree in C")


@hookimpl
def rlbench_register_compute_backends(register):
    register("cpu", "rlbench.builtin.compute_cpu:CpuCompute",
             probe=functools.partial(probe_modules, "torch", "numpy", hint="pip install torch numpy"),
             capabilities=caps.CPU,
             description=f"torch on the CPU for networks, numpy + C for tables ({platform.machine()})")


@hookimpl
def rlbench_register_policies(register):
    register("single-learner", "rlbench.runtime.policies.single_learner:SingleLearner",
             capabilities=caps.SINGLE_LEARNER,
             description="one learner fed by actors: in its own process with the memory (local), or beside a "
                         "replay node (server, in-network)")
    register("data-parallel", "rlbench.runtime.policies.data_parallel:DataParallel",
             capabilities=caps.DATA_PARALLEL,
             description="N learners (--learners) each sampling its share of every batch from the replay node, "
                         "gradients averaged with torch.distributed all-reduce (gloo; NCCL on CUDA)")
    register("device", "rlbench.runtime.policies.device:Device",
             capabilities=caps.DEVICE,
             description="environments, actor, replay and learner in one process on one device (the GPU's "
                         "one-device loop when every component is a gpu one)")


# Static facts about gymnasium's classic-control and toy-text ids, so the validator can reason
# without importing gymnasium. (id, action, observation, max_episode_steps, reward_threshold)
GYMNASIUM_IDS = [
    ("CartPole-v1", "discrete", "continuous", 500, 475.0),
    ("CartPole-v0", "discrete", "continuous", 200, 195.0),
    ("Acrobot-v1", "discrete", "continuous", 500, -100.0),
    ("MountainCar-v0", "discrete", "continuous", 200, -110.0),
    ("MountainCarContinuous-v0", "continuous", "continuous", 999, 90.0),
    ("Pendulum-v1", "continuous", "continuous", 200, None),
    ("FrozenLake-v1", "discrete", "discrete", 100, 0.70),
    ("FrozenLake8x8-v1", "discrete", "discrete", 200, 0.85),
    ("Taxi-v3", "discrete", "discrete", 200, 8.0),
    ("CliffWalking-v0", "discrete", "discrete", None, None),
    ("Blackjack-v1", "discrete", "discrete", None, None),
]


@hookimpl
def rlbench_register_environments(register):
    for env_id, action, observation, max_steps, threshold in GYMNASIUM_IDS:
        register(env_id, functools.partial(_make_gymnasium, env_id),
                 probe=functools.partial(_probe_gymnasium, env_id),
                 capabilities=EnvironmentCapabilities(action_space=action, observation_space=observation,
                                                      max_episode_steps=max_steps, reward_threshold=threshold),
                 description="gymnasium " + ("toy text" if observation == "discrete" else "classic control"))


def _make_gymnasium(env_id, num_envs=1, *, seed=None, **options):
    from rlbench.builtin.envs import GymnasiumEnv

    return GymnasiumEnv(env_id, num_envs=num_envs, seed=seed, **options)


def _probe_gymnasium(env_id):
    from rlbench.builtin.envs import probe

    return probe(env_id)


@hookimpl
def rlbench_register_algorithms(register):
    register("dqn", "rlbench.algorithms.dqn:DQN",
             capabilities=caps.DQN,
             description="DQN (double-DQN and prioritized replay options)")
    register("ddpg", "rlbench.algorithms.ddpg:DDPG",
             capabilities=caps.DDPG,
             description="DDPG (deterministic actor-critic, Gaussian exploration)")
    register("qlearning", "rlbench.algorithms.qlearning:QLearning",
             capabilities=caps.TABULAR,
             description="tabular Q-learning, online or offline over a dataset (SwiftRL)")
    register("sarsa", "rlbench.algorithms.sarsa:Sarsa",
             capabilities=caps.TABULAR,
             description="tabular SARSA, online or offline over a dataset (SwiftRL)")


@hookimpl
def rlbench_energy_meters(config):
    from rlbench.builtin.energy import RaplMeter

    return [RaplMeter()]


@hookimpl
def rlbench_fingerprint():
    from rlbench.builtin.fingerprint import core_fingerprint

    return core_fingerprint()
