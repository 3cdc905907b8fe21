"""GPU energy through NVML (pynvml, from `pip install rlbench-gpu[energy]`), labelled `measured`.

Prefers the driver's cumulative energy counter (nvmlDeviceGetTotalEnergyConsumption, Volta and
later): the difference of two readings is exact. Older GPUs only report instantaneous power; then a
thread samples it every `interval_s` and integrates (trapezoids). Without pynvml or an NVIDIA driver
the meter reports null joules and why, never a made-up figure.
"""

from __future__ import annotations

import threading
import time
from typing import Any

SOURCE = "nvml"


def _nvml() -> Any:
    import pynvml

    pynvml.nvmlInit()
    return pynvml


def nvml_handle(pynvml: Any, torch_index: int) -> Any:
    """The NVML handle of torch's CUDA device `torch_index`, matched by UUID (CUDA_VISIBLE_DEVICES
    renumbers torch's devices, not NVML's); by index when torch cannot say."""
    try:
        import torch

        uuid = str(torch.cuda.get_device_properties(torch_index).uuid)
        return pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
    except Exception:  # noqa: BLE001 - no CUDA torch, or an old driver without UUID lookup
        return pynvml.nvmlDeviceGetHandleByIndex(torch_index)


class NvmlMeter:
    """start() ... stop() -> {"kind": "measured", "joules": ..., "source": "nvml", ...} or the reason why not.
    An rlbench energy meter (hook rlbench_energy_meters): its reading lands in result["energy"]["nvml"]."""

    name = SOURCE

    def __init__(self, device_index: int = 0, *, interval_s: float = 0.02) -> None:
        self.device_index = int(device_index)
        self.interval_s = interval_s
        self.reason = ""
        self._pynvml: Any = None
        self._handle: Any = None
        self._method = ""
        self._start_mj = 0
        self._t0 = 0.0
        self._samples: list[tuple[float, float]] = []  # (time s, watts)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.device_name = ""
        try:
            self._pynvml = _nvml()
            self._handle = nvml_handle(self._pynvml, self.device_index)
            name = self._pynvml.nvmlDeviceGetName(self._handle)
            self.device_name = name.decode() if isinstance(name, bytes) else str(name)
        except ModuleNotFoundError:
            self.reason = "pynvml not installed: pip install 'rlbench-gpu[energy]' (nvidia-ml-py)"
        except Exception as error:  # noqa: BLE001 - pynvml.NVMLError and friends: say what NVML said
            self.reason = f"NVML unavailable: {type(error).__name__}: {error}"

    @property
    def available(self) -> bool:
        return not self.reason

    def start(self) -> None:
        if not self.available:
            return
        self._t0 = time.perf_counter()
        try:
            self._start_mj = self._pynvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)
            self._method = "total energy counter"
            return
        except Exception:  # noqa: BLE001 - not supported before Volta: sample power instead
            pass
        self._method = f"power samples every {self.interval_s * 1000:.0f} ms, trapezoid integral"
        self._samples = [(0.0, self._watts())]
        self._stop.clear()
        self._thread = threading.Thread(target=self._sample_power, name="rlbench-gpu-nvml", daemon=True)
        self._thread.start()

    def _watts(self) -> float:
        return self._pynvml.nvmlDeviceGetPowerUsage(self._handle) / 1000.0  # milliwatts

    def _sample_power(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._samples.append((time.perf_counter() - self._t0, self._watts()))

    def stop(self) -> dict[str, Any]:
        if not self.available:
            return {"kind": None, "joules": None, "source": SOURCE, "reason": self.reason}
        if not self._method:
            return {"kind": None, "joules": None, "source": SOURCE, "reason": "meter not started"}
        seconds = time.perf_counter() - self._t0
        if self._thread is None:
            joules = (self._pynvml.nvmlDeviceGetTotalEnergyConsumption(self._handle) - self._start_mj) / 1000.0
        else:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self._samples.append((seconds, self._watts()))
            joules = sum((t1 - t0) * (w0 + w1) / 2 for (t0, w0), (t1, w1) in zip(self._samples, self._samples[1:]))
        return {"kind": "measured", "joules": joules, "source": SOURCE, "method": self._method,
                "device": f"cuda:{self.device_index} {self.device_name}", "seconds": seconds,
                "mean_watts": joules / seconds if seconds > 0 else None}

    def close(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
        if self._pynvml is not None and self.available:
            self._pynvml.nvmlShutdown()
