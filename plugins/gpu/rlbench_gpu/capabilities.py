"""What the gpu components can do, declared once, and the cheap probe that says whether CUDA is here.

plugin.py registers these objects; the component classes point at the same ones (a component built
on torch's CPU device, for tests, reports a copy whose `device` says "cpu"). A leaf: imports nothing
of the plugin, and no torch.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rlbench.protocols import ComputeCapabilities, EnvironmentCapabilities, Probe, ReplayCapabilities, probe_modules

COMPUTE_CAPABILITIES = ComputeCapabilities(
    roles=frozenset({"dqn:actor", "dqn:learner", "ddpg:actor", "ddpg:learner"}), device="cuda",
    networks=frozenset({"mlp", "cnn"}), does_not="no tabular engine: Q-learning and SARSA run on compute cpu")
REPLAY_DTYPES = ("float32", "float64", "float16", "int64", "int32", "int16", "int8", "uint8", "bool")
REPLAY_CAPABILITIES = ReplayCapabilities(prioritized=True, dtypes=REPLAY_DTYPES, device="cuda", accepts_tensors=True,
                                         frames=True)
ENVIRONMENT_CAPABILITIES = {
    "gpu/CartPole-v1": EnvironmentCapabilities(action_space="discrete", observation_space="continuous",
                                               max_episode_steps=500, reward_threshold=475.0, device="cuda"),
    "gpu/Pendulum-v1": EnvironmentCapabilities(action_space="continuous", observation_space="continuous",
                                               max_episode_steps=200, device="cuda"),
}


def on_device(capabilities: Any, device_type: str) -> Any:
    """The declared capabilities themselves on CUDA; on another device (torch's CPU device, in tests)
    a copy that says where the component really runs."""
    return capabilities if device_type == capabilities.device else dataclasses.replace(capabilities, device=device_type)


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
