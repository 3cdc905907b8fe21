"""rlbench hooks of the gpu plugin. Cheap to import: torch is loaded only by probes and factories.

Registered components run on CUDA and say why not when it is absent; the same classes take
device="cpu" for tests (see README: "CPU device").
"""

from __future__ import annotations

import functools
from typing import Any

from rlbench.hookspecs import hookimpl
from rlbench_gpu.capabilities import COMPUTE_CAPABILITIES, ENVIRONMENT_CAPABILITIES, REPLAY_CAPABILITIES, probe
from rlbench_gpu.fingerprint import gpu_fingerprint

RLBENCH_API = "1.1"  # the plugin API this plugin targets (docs/plugin-api-changelog.md)


@hookimpl
def rlbench_register_compute_backends(register):
    register("gpu", "rlbench_gpu.compute:GpuCompute", probe=probe, capabilities=COMPUTE_CAPABILITIES,
             description="torch on a CUDA device: dqn/ddpg learner and batched actor inference")


@hookimpl
def rlbench_register_replay_memories(register):
    register("gpu", "rlbench_gpu.replay:GpuPrioritizedReplay", probe=probe, capabilities=REPLAY_CAPABILITIES,
             description="proportional prioritized replay with storage and a two-level sum tree in GPU memory")


@hookimpl
def rlbench_register_environments(register):
    for env_id, capabilities in ENVIRONMENT_CAPABILITIES.items():
        register(env_id, functools.partial(_make_environment, env_id), probe=probe, capabilities=capabilities,
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
    option("compute", "gpu", "--gpu-capture", "capture", choices=("graph", "compile", "eager"), default="graph",
           help="how the one-device loop launches its chunks: one CUDA graph each (graph), torch.compile's "
                "kernels in one CUDA graph (compile), or kernel by kernel (eager, the reference)")


# Measured on an H100 (README, "Measured on an H100"): what a run with these settings should know first.
KNOWN_FAULTS = {("ddpg", "compile"): "ddpg did not learn under --gpu-capture compile on an H100 (greedy return "
                                     "-1,466 where --gpu-capture graph reached -176; plugins/gpu/README.md): "
                                     "an open fault; --gpu-capture graph is the measured choice"}


@hookimpl
def rlbench_run_configured(config):
    """Warn, before the run starts, of a setting measured to go wrong and not yet understood."""
    if config.compute != "gpu":
        return
    fault = KNOWN_FAULTS.get((config.algo, config.options.get("compute", {}).get("capture", "graph")))
    if fault:
        import warnings

        warnings.warn(f"rlbench-gpu: {fault}", UserWarning, stacklevel=2)


@hookimpl
def rlbench_register_commands(cli):
    from rlbench_gpu.bench import env_command, gpu

    cli.add_command(gpu)
    bench = cli.commands.get("bench")
    if bench is not None and "env" not in bench.commands:
        bench.add_command(env_command)


@hookimpl
def rlbench_fingerprint():
    return gpu_fingerprint()


# -- NVML energy for runs that use a gpu component ----------------------------------------------------
def uses_gpu(config: Any) -> bool:
    return (config.compute == "gpu" or getattr(config, "actor_compute", None) == "gpu" or config.replay == "gpu"
            or str(config.env).startswith("gpu/"))


@hookimpl
def rlbench_energy_meters(config):
    """NVML's reading goes into result["energy"]["nvml"] (the runner adds per-joule rates)."""
    if not uses_gpu(config):
        return None
    from rlbench_gpu.energy import NvmlMeter

    options = config.options.get("compute") if config.compute == "gpu" else config.options.get("actor_compute")
    return [NvmlMeter(int((options or {}).get("device", 0)))]
