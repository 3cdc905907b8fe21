"""Which OpenCL device the FPGA kernels run on, and what that means for a result.

Order: an OpenCL ACCELERATOR device (a real FPGA board, or Intel's FPGA emulator from PyPI), else an
OpenCL CPU device (PoCL). Oclgrind reports type 15 (every bit set), so the match is exact, not a
bit test. `RLBENCH_FPGA_PLATFORM` (substring of the platform name) restricts the choice.

On PoCL the "basic" driver is used unless POCL_DEVICES says otherwise (see below).

Intel's pip-installed emulator ships `libintelocl_emu.so` but no .icd file; `register_emulator()`
writes one beside the system ICDs and points OCL_ICD_VENDORS at it. This must happen before
pyopencl lists platforms for the first time, so this module does it before importing pyopencl.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache
from typing import Any

from rlbench.errors import RlbenchError

PLATFORM_ENV = "RLBENCH_FPGA_PLATFORM"
INSTALL_HINT = ("install an OpenCL device: `apt-get install pocl-opencl-icd ocl-icd-libopencl1 binutils` (CPU, PoCL), "
                "or Intel's FPGA emulator: `pip install intel-opencl-fpga-emu-rt==2025.0.5 intel-opencl-rt==2025.0.5 "
                "intel-cmplr-lib-rt==2025.0.5` (see plugins/fpga/README.md)")


class OpenclDeviceError(RlbenchError):
    """No usable OpenCL device, or a kernel that will not build on the chosen one."""


from rlbench_fpga.icd import register_emulator  # noqa: E402

register_emulator()
# PoCL's "basic" CPU driver runs each command in the thread that waits for it; its default "pthread"
# driver hands every command to a worker thread and back. The kernels here are single work-items, so
# worker threads add nothing but that hand-off: an upload + empty launch + blocking download took
# ~3 us on "basic" and 10-70 us on "pthread" (70 when the worker sits on another, idle vCPU of a VM).
# Set before PoCL starts; a user's own POCL_DEVICES is left alone.
os.environ.setdefault("POCL_DEVICES", "basic")
import pyopencl as cl  # noqa: E402  (after the ICD set-up above)

TYPE_NAMES = {cl.device_type.CPU: "CPU", cl.device_type.GPU: "GPU", cl.device_type.ACCELERATOR: "ACCELERATOR",
              cl.device_type.CUSTOM: "CUSTOM"}
PREFERENCE = ("ACCELERATOR", "CPU")


def type_name(device_type: int) -> str:
    # Exact names only: "ALL" (0xffffffff) would match every bit.
    return TYPE_NAMES.get(device_type, f"type {device_type}")


@dataclass(frozen=True)
class DeviceInfo:
    platform: str
    platform_version: str
    device: str
    type: str
    driver: str
    emulation: bool
    emulation_kind: str  # what stands in for the FPGA board
    channels: bool  # cl_intel_channels: the kernels run as a pipeline of concurrent kernels

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def describe(device: Any) -> DeviceInfo:
    platform = device.platform.name.strip()
    kind = type_name(device.type)
    if "emulat" in platform.lower() or "emulat" in device.name.lower():
        emulation = "Intel FPGA emulator (ACCELERATOR on the host CPU)"
    elif kind == "ACCELERATOR":
        emulation = ""
    else:
        emulation = f"OpenCL {kind} device standing in for the FPGA"
    return DeviceInfo(platform=platform, platform_version=device.platform.version.strip(), device=device.name.strip(),
                      type=kind, driver=device.driver_version.strip(), emulation=bool(emulation),
                      emulation_kind=emulation, channels="cl_intel_channels" in device.extensions)


def all_devices() -> list[Any]:
    devices = []
    try:
        platforms = cl.get_platforms()
    except cl.Error:  # the ICD loader found no platform at all
        return []
    for platform in platforms:
        try:
            devices.extend(platform.get_devices())
        except cl.Error:
            continue
    return devices


def choose(devices: list[Any] | None = None) -> tuple[Any, str]:
    """The device the kernels use, and why (one line)."""
    devices = all_devices() if devices is None else devices
    wanted = os.environ.get(PLATFORM_ENV, "")
    if wanted:
        devices = [d for d in devices if wanted.lower() in d.platform.name.lower()]
    for kind in PREFERENCE:
        matches = [d for d in devices if type_name(d.type) == kind]
        if matches:
            why = "ACCELERATOR devices come first (FPGA board or emulator)" if kind == "ACCELERATOR" else \
                "no OpenCL ACCELERATOR device found; an OpenCL CPU device runs the same kernels"
            if wanted:
                why += f" ({PLATFORM_ENV}={wanted!r})"
            return matches[0], why
    where = f" on platforms matching {PLATFORM_ENV}={wanted!r}" if wanted else ""
    raise OpenclDeviceError(f"no OpenCL ACCELERATOR or CPU device{where}; {INSTALL_HINT}")


@cache
def default_context() -> tuple[Any, Any, DeviceInfo]:
    """(context, device, info) shared by every component of this process."""
    device, _ = choose()
    return cl.Context([device]), device, describe(device)


def fingerprint() -> dict[str, Any]:
    try:
        device, why = choose()
    except OpenclDeviceError as error:
        return {"available": False, "reason": str(error)}
    info = describe(device)
    return {**info.as_dict(), "chosen_because": why, "pyopencl": cl.VERSION_TEXT,
            "learner": "learner runs on torch CPU (no OpenCL training kernels for dqn/ddpg)"}
