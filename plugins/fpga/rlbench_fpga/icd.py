"""Make Intel's pip-installed FPGA emulator visible to the OpenCL ICD loader. Kept apart from
device.py so the cheap probe can use it without importing pyopencl."""

from __future__ import annotations

import glob
import os
import shutil
import sys
import tempfile

EMULATOR_LIBRARY = "libintelocl_emu.so"


def emulator_library() -> str | None:
    path = os.path.join(sys.prefix, "lib", EMULATOR_LIBRARY)
    return path if os.path.exists(path) else None


def register_emulator() -> str | None:
    """Make Intel's pip-installed FPGA emulator visible to the ICD loader; returns the vendors dir.
    Leaves a user's own OCL_ICD_VENDORS alone."""
    library = emulator_library()
    if library is None or "OCL_ICD_VENDORS" in os.environ:
        return os.environ.get("OCL_ICD_VENDORS")
    vendors = os.path.join(tempfile.gettempdir(), f"rlbench-fpga-icd-{os.getuid()}")
    os.makedirs(vendors, exist_ok=True)
    for icd in glob.glob("/etc/OpenCL/vendors/*.icd"):
        shutil.copy(icd, vendors)
    with open(os.path.join(vendors, "intel-fpga-emu.icd"), "w") as handle:
        handle.write(library + "\n")
    os.environ["OCL_ICD_VENDORS"] = vendors
    return vendors
