"""Which torch device a component runs on, whether CUDA is usable here, and what the GPU is.

Imports torch (this module is loaded lazily, by probes and factories only).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from rlbench.errors import RlbenchError
from rlbench.protocols import Probe


class GpuError(RlbenchError, ValueError):
    """Bad input to a gpu-plugin component, or a device it cannot use."""


@functools.cache
def probe_cuda() -> Probe:
    """Available when torch sees at least one CUDA device; otherwise the reason, in one line."""
    if not torch.cuda.is_available():
        build = "" if torch.version.cuda else ", a CPU-only build: install a CUDA build of torch"
        return Probe.missing(f"no CUDA device: torch.cuda.is_available() is False (torch {torch.__version__}{build})")
    count = torch.cuda.device_count()
    return Probe.ok(f"{count} CUDA device(s); cuda:0 is {torch.cuda.get_device_name(0)}")


def resolve_device(device: Any) -> torch.device:
    """"cpu", "cuda", "cuda:N", N or a torch.device -> a torch.device that exists here."""
    if isinstance(device, bool):
        raise GpuError(f"device must be 'cpu', 'cuda', 'cuda:N' or an index, got {device!r}")
    if isinstance(device, int):
        device = f"cuda:{device}"
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        raise GpuError(f"device must be 'cpu', 'cuda', 'cuda:N' or an index, got {device!r}") from None
    if resolved.type == "cpu":
        return resolved
    if resolved.type != "cuda":
        raise GpuError(f"the gpu plugin runs on 'cuda' or 'cpu' devices, got {str(resolved)!r}")
    probe = probe_cuda()
    if not probe.available:
        raise GpuError(probe.reason)
    index = torch.cuda.current_device() if resolved.index is None else resolved.index
    count = torch.cuda.device_count()
    if not 0 <= index < count:
        raise GpuError(f"CUDA device index {index} does not exist: this machine has {count} (0..{count - 1})")
    return torch.device("cuda", index)


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels: timings of asynchronous CUDA work are only honest after this."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_fingerprint(device: torch.device) -> dict[str, Any]:
    """Name, memory, compute capability, driver, CUDA and torch versions of the device."""
    info: dict[str, Any] = {"device": str(device), "torch": torch.__version__, "cuda_build": torch.version.cuda}
    if device.type != "cuda":
        info["note"] = "CPU device: the gpu plugin's code path run on the host (tests, CI)"
        return info
    properties = torch.cuda.get_device_properties(device)
    info.update(
        name=properties.name,
        memory_bytes=int(properties.total_memory),
        compute_capability=f"{properties.major}.{properties.minor}",
        multiprocessors=int(properties.multi_processor_count),
        cudnn=torch.backends.cudnn.version(),
        tf32_matmul=bool(torch.backends.cuda.matmul.allow_tf32),
        driver=driver_version(),
    )
    return info


def driver_version() -> str | None:
    """The NVIDIA driver version, from NVML when pynvml is installed, else from /proc."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
            return version.decode() if isinstance(version, bytes) else str(version)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no pynvml or no NVML library: try the kernel module's file
        pass
    try:
        with open("/proc/driver/nvidia/version") as f:
            words = f.readline().split()
    except OSError:
        return None
    return next((w for w in words if w[:1].isdigit() and "." in w), None)
