"""rlbench hooks of the gpu plugin. Cheap to import: torch is loaded only by probes and factories.

Registered components run on CUDA and say why not when it is absent; the same classes take
device="cpu" for tests (see README: "CPU device").
"""

from __future__ import annotations

import functools
import os
from typing import Any

from rlbench.hookspecs import hookimpl
from rlbench.protocols import (
    ComputeCapabilities,
    EnvironmentCapabilities,
    Probe,
    ReplayCapabilities,
    probe_modules,
)

ROLES = frozenset({"dqn:actor", "dqn:learner", "ddpg:actor", "ddpg:learner"})
ENVIRONMENTS = {  # id: (action space, max episode steps, reward threshold)
    "gpu/CartPole-v1": ("discrete", 500, 475.0),
    "gpu/Pendulum-v1": ("continuous", 200, None),
}
REPLAY_DTYPES = ("float32", "float64", "float16", "int64", "int32", "int16", "int8", "uint8", "bool")


def probe() -> Probe:
    """Cheap on purpose (`rlbench list` runs it; torch is not imported): a CUDA build of torch per its
    package metadata, and a CUDA device per the driver (libcuda through ctypes). The factories check
    again through torch when a component is built."""
    found = probe_modules("torch", "numpy", hint="pip install torch (a CUDA build) numpy")
    if not found.available:
        return found
    import ctypes
    from importlib.metadata import version

    torch_version = version("torch")
    if torch_version.endswith("+cpu"):
        return Probe.missing(f"no CUDA device: torch {torch_version} is a CPU-only build (install a CUDA build of torch)")
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return Probe.missing("no CUDA device: the NVIDIA driver (libcuda.so.1) is not installed")
    count = ctypes.c_int(0)
    if driver.cuInit(0) != 0 or driver.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
        return Probe.missing("no CUDA device: the NVIDIA driver reports none")
    return Probe.ok(f"{count.value} CUDA device(s) (per the driver)")


@hookimpl
def rlbench_register_compute_backends(register):
    register("gpu", "rlbench_gpu.compute:GpuCompute", probe=probe,
             capabilities=ComputeCapabilities(roles=ROLES, device="cuda",
                                              does_not="no tabular engine: Q-learning and SARSA run on compute cpu"),
             description="torch on a CUDA device: dqn/ddpg learner and batched actor inference")


@hookimpl
def rlbench_register_replay_memories(register):
    register("gpu", "rlbench_gpu.replay:GpuPrioritizedReplay", probe=probe,
             capabilities=ReplayCapabilities(prioritized=True, dtypes=REPLAY_DTYPES, device="cuda",
                                                            accepts_tensors=True),
             description="proportional prioritized replay with storage and a two-level sum tree in GPU memory")


@hookimpl
def rlbench_register_environments(register):
    for env_id, (action, max_steps, threshold) in ENVIRONMENTS.items():
        register(env_id, functools.partial(_make_environment, env_id), probe=probe,
                 capabilities=EnvironmentCapabilities(action_space=action, observation_space="continuous",
                                                      max_episode_steps=max_steps, reward_threshold=threshold,
                                                      device="cuda"),
                 description=f"{env_id.split('/')[1]} as batched tensor ops on the GPU (gymnasium's dynamics)")


def _make_environment(env_id: str, num_envs: int = 1, *, seed: int | None = None, **options: Any) -> Any:
    """Hands out device tensors: the core's loops keep them on the device as far as the actor, the
    replay memory and the learner take them, and copy to the host only what must go there."""
    from rlbench_gpu.envs import make

    options.setdefault("output", "torch")
    return make(env_id, num_envs, seed=seed, **options)


@hookimpl
def rlbench_register_run_options(option):
    option("compute", "gpu", "--gpu-device", "device", type=int, default=0,
           help="CUDA device index; it also becomes the current device, where replay gpu and the gpu/ "
                "environments of the run are placed")


@hookimpl
def rlbench_register_commands(cli):
    from rlbench_gpu.bench import env_command, gpu

    cli.add_command(gpu)
    bench = cli.commands.get("bench")
    if bench is not None and "env" not in bench.commands:
        bench.add_command(env_command)


@hookimpl
def rlbench_fingerprint():
    """Cheap when there is no NVIDIA driver (nothing imported); otherwise torch's view of each GPU."""
    if not os.path.exists("/proc/driver/nvidia/version"):
        return {"available": False, "reason": "no NVIDIA driver loaded (/proc/driver/nvidia/version is absent)"}
    found = probe()
    if not found.available:
        return {"available": False, "reason": found.reason}
    import torch

    from rlbench_gpu.device import device_fingerprint

    return {"available": True, "devices": [device_fingerprint(torch.device("cuda", i))
                                           for i in range(torch.cuda.device_count())]}


# -- NVML energy for runs that use a gpu component ----------------------------------------------------
def uses_gpu(config: Any) -> bool:
    return config.compute == "gpu" or config.replay == "gpu" or str(config.env).startswith("gpu/")


@hookimpl
def rlbench_energy_meters(config):
    """NVML's reading goes into result["energy"]["nvml"] (the runner adds per-joule rates)."""
    if not uses_gpu(config):
        return None
    from rlbench_gpu.energy import NvmlMeter

    return [NvmlMeter(int(config.options.get("compute", {}).get("device", 0)))]
