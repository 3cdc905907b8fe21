"""rlbench hooks of the fpga plugin. Cheap to import: no pyopencl until a component is built or probed."""

from __future__ import annotations

from rlbench.hookspecs import hookimpl
from rlbench.protocols import Probe, probe_modules
from rlbench_fpga.capabilities import COMPUTE_CAPABILITIES, LEARNER_NOTE, REPLAY_CAPABILITIES

RLBENCH_API = "1.1"  # the plugin API this plugin targets (docs/plugin-api-changelog.md)


@hookimpl
def rlbench_register_replay_memories(register):
    register("fpga", "rlbench_fpga.replay:FpgaReplay", probe="rlbench_fpga.plugin:probe",
             capabilities=REPLAY_CAPABILITIES,
             description="PEARL K-ary sum-tree prioritized replay as OpenCL FPGA kernels (board, FPGA emulator or PoCL)")


@hookimpl
def rlbench_register_compute_backends(register):
    register("fpga", "rlbench_fpga.compute:FpgaCompute", probe="rlbench_fpga.plugin:probe",
             capabilities=COMPUTE_CAPABILITIES,
             description=f"OpenCL FPGA kernels for actor MLP inference and tabular TD; {LEARNER_NOTE}")


@hookimpl
def rlbench_register_run_options(option):
    option("replay", "fpga", "--fpga-fanout", "fanout", type=int, default=16,
           help="children per sum-tree node (K); the depth is the smallest that holds the capacity")


@hookimpl
def rlbench_register_commands(cli):
    from rlbench_fpga.cli import fpga

    cli.add_command(fpga)


@hookimpl
def rlbench_fingerprint():
    if not probe_modules("pyopencl").available:
        return {"available": False, "reason": "python module 'pyopencl' not installed: pip install pyopencl mako"}
    from rlbench_fpga.device import fingerprint

    return fingerprint()


def probe() -> Probe:
    """Cheap on purpose (`rlbench list` runs it): asks the OpenCL ICD loader through ctypes how many
    platforms exist, without importing pyopencl; `rlbench fpga devices` shows which device is chosen."""
    found = probe_modules("numpy", "pyopencl", "mako", hint="pip install -e plugins/fpga (pulls pyopencl and mako)")
    if not found.available:
        return found
    import ctypes
    import ctypes.util

    from rlbench_fpga.icd import register_emulator

    register_emulator()  # the FPGA emulator's .icd must be in place before the loader looks
    name = ctypes.util.find_library("OpenCL") or "libOpenCL.so.1"
    try:
        loader = ctypes.CDLL(name)
    except OSError:
        return Probe.missing("no OpenCL ICD loader: apt-get install ocl-icd-libopencl1 pocl-opencl-icd")
    count = ctypes.c_uint(0)
    status = loader.clGetPlatformIDs(0, None, ctypes.byref(count))
    if status != 0 or count.value == 0:
        return Probe.missing("no OpenCL platform found: apt-get install pocl-opencl-icd (CPU), or install Intel's "
                             "FPGA emulator (see plugins/fpga/README.md)")
    return Probe.ok(f"{count.value} OpenCL platform(s); `rlbench fpga devices` shows the device chosen")