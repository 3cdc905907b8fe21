"""The core's own components, registered through the same hooks as any third-party plugin.

Everything here is a lazy "module:attr" reference or a cheap callable: this module is imported by
`rlbench list`, so it must not import numpy-heavy, torch or gymnasium code.
"""

from __future__ import annotations

import functools
import platform

from rlbench.builtin import capabilities as caps
from rlbench.hookspecs import hookimpl
from rlbench.kit.api import API_VERSION
from rlbench.protocols import EnvironmentCapabilities, Probe, probe_modules

RLBENCH_API = API_VERSION  # the core targets the plugin API it is (rlbench.kit.api)


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
             description="kernel UDP datagrams with fragmentation, sequence numbers and loss detection; trusts the "
                         "network path (no MAC after the handshake): off loopback only with --udp-trust-network")
    register("ray", "rlbench.builtin.transports.ray_actors:RayTransport",
             probe="rlbench.builtin.transports.ray_actors:probe",
             capabilities=caps.RAY,
             description="Ray actor calls through an inbox actor on the listener's node (the Ray/RLlib baseline)")


@hookimpl
def rlbench_register_run_options(option):
    option("transport", "udp", "--udp-trust-network", "trust_network", type=bool, default=False,
           help="Let the replay node listen where other hosts reach it over udp, whose datagrams carry no MAC "
                "after the handshake: anyone who can send from a peer's address and port can inject into its session.")


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


# Static facts about the environments, so the validator and `rlbench list` reason without importing
# gymnasium, ale-py, MinAtar or MuJoCo. gymnasium's classic-control and toy-text ids:
# (id, action, observation, max_episode_steps, reward_threshold)
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
# gymnasium's MuJoCo bodies: (id, max_episode_steps, reward_threshold)
MUJOCO_IDS = [
    ("HalfCheetah-v5", 1000, 4800.0),
    ("Hopper-v5", 1000, 3800.0),
    ("Walker2d-v5", 1000, None),
    ("Ant-v5", 1000, 6000.0),
    ("Humanoid-v5", 1000, None),
    ("HumanoidStandup-v5", 1000, None),
    ("Swimmer-v5", 1000, 360.0),
    ("InvertedPendulum-v5", 1000, 950.0),
    ("InvertedDoublePendulum-v5", 1000, 9100.0),
    ("Reacher-v5", 50, -3.75),
    ("Pusher-v5", 100, 0.0),
]
MINATAR_GAMES = ("Asterix", "Breakout", "Freeway", "Seaquest", "SpaceInvaders")
ATARI_MAX_EPISODE_STEPS = 27_000  # ALE's 108,000-frame cut at 4 frames a step (rlbench.builtin.atari)
INSTALL = {"gymnasium": "pip install gymnasium", "ale_py": "pip install ale-py",
           "cv2": "pip install opencv-python-headless", "minatar": "pip install minatar",
           "mujoco": "pip install mujoco", "imageio": "pip install imageio"}


@hookimpl
def rlbench_register_environments(register):
    from rlbench.builtin.reference_scores import ATARI_SCORES  # data only: the 57 games with published scores

    for env_id, action, observation, max_steps, threshold in GYMNASIUM_IDS:
        family = "toy-text" if observation == "discrete" else "classic-control"
        register(env_id, functools.partial(_make, "rlbench.builtin.envs:GymnasiumEnv", env_id),
                 probe=functools.partial(_probe, "gymnasium"),
                 capabilities=EnvironmentCapabilities(action_space=action, observation_space=observation,
                                                      max_episode_steps=max_steps, reward_threshold=threshold,
                                                      family=family),
                 description="gymnasium " + family.replace("-", " "))
    atari = EnvironmentCapabilities(action_space="discrete", observation_space="image",
                                    max_episode_steps=ATARI_MAX_EPISODE_STEPS, family="atari", evaluation_mode=True)
    for game in ATARI_SCORES:
        env_id = f"ALE/{game}-v5"
        register(env_id, functools.partial(_make, "rlbench.builtin.atari:make_atari", env_id),
                 probe=functools.partial(_probe_atari, game),
                 capabilities=atari,
                 description="Atari 2600 (ale-py), DQN preprocessing: uint8 4x84x84 frames")
    minatar = EnvironmentCapabilities(action_space="discrete", observation_space="image", family="minatar")
    for game in MINATAR_GAMES:
        for version, actions in (("v0", "all 6 actions"), ("v1", "its minimal action set")):
            env_id = f"MinAtar/{game}-{version}"
            register(env_id, functools.partial(_make, "rlbench.builtin.envs:make_minatar", env_id),
                     probe=functools.partial(_probe, "gymnasium", "minatar"),
                     capabilities=minatar,
                     description=f"MinAtar {game}, uint8 channels x 10x10 boards, {actions}")
    for env_id, max_steps, threshold in MUJOCO_IDS:
        register(env_id, functools.partial(_make, "rlbench.builtin.envs:make_mujoco", env_id),
                 probe=functools.partial(_probe, "gymnasium", "mujoco", "imageio"),
                 capabilities=EnvironmentCapabilities(action_space="continuous", observation_space="continuous",
                                                      max_episode_steps=max_steps, reward_threshold=threshold,
                                                      family="mujoco"),
                 description="MuJoCo body (gymnasium v5), float32 observations")


def _make(factory, env_id, num_envs=1, **options):
    """`factory` ("module:attr", imported on first use) builds `num_envs` copies of `env_id`."""
    from rlbench.registry import load_object

    return load_object(factory)(env_id, num_envs, **options)


def _probe(*modules):
    """Each module findable (without importing it), or what to pip install."""
    for module in modules:
        probe = probe_modules(module, hint=INSTALL[module])
        if not probe.available:
            return probe
    return Probe.ok()


def snake_case(game):
    """A game's module or ROM name in ale-py and MinAtar: SpaceInvaders -> space_invaders, UpNDown -> up_n_down."""
    import re

    return re.sub(r"(?<!^)(?=[A-Z])", "_", game).lower()


def _probe_atari(game):
    """ale-py and OpenCV findable, and ale-py's ROM of `game` where ale-py keeps ROMs (ALE_ROMS_DIR,
    else its package's roms/), all without importing them."""
    import importlib.util
    import os

    probe = _probe("gymnasium", "ale_py", "cv2")
    if not probe.available:
        return probe
    rom = snake_case(game)
    package = importlib.util.find_spec("ale_py").submodule_search_locations[0]
    roms = os.environ.get("ALE_ROMS_DIR") or os.path.join(package, "roms")
    if not os.path.isfile(os.path.join(roms, f"{rom}.bin")):
        return Probe.missing(f"ale-py has no ROM {rom}.bin in {roms} (ale-py 0.9 and later ship the ROMs: "
                             "pip install -U ale-py)")
    return probe


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
