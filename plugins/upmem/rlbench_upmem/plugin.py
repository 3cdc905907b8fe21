"""rlbench hooks of the upmem plugin. Cheap to import: factories and probes are "module:attr" strings."""

from __future__ import annotations

from rlbench.hookspecs import hookimpl
from rlbench.protocols import ComputeCapabilities

CAPABILITIES = ComputeCapabilities(
    roles=frozenset({"qlearning:tabular", "sarsa:tabular"}),
    device="upmem-emulator",
    does_not="cannot run deep algorithms (dqn, ddpg): UPMEM DPUs have no FPU and no torch device; "
             "tabular Q-learning and SARSA only",
)


@hookimpl
def rlbench_register_compute_backends(register):
    register("upmem", "rlbench_upmem.backend:UpmemCompute", probe="rlbench_upmem.plugin:probe",
             capabilities=CAPABILITIES,
             description="UPMEM processing-in-memory (SwiftRL tabular), on an execution-model emulator")


@hookimpl
def rlbench_register_run_options(option):
    option("compute", "upmem", "--dpus", "dpus", type=int, default=64,
           help="DPUs to emulate (64 per rank); the offline dataset is split across them")
    option("compute", "upmem", "--numeric", "numeric", default="fp32", choices=("fp32", "int32"),
           help="DPU arithmetic: fp32 (software float) or int32 fixed point")
    option("compute", "upmem", "--partition", "partition", default="contiguous",
           choices=("contiguous", "stride", "random"), help="how dataset rows are assigned to DPUs")
    option("compute", "upmem", "--fixed-point-scale", "fixed_point_scale", type=int, default=1 << 16,
           help="int32 numerics: a value v is stored as round(v * scale)")
    option("compute", "upmem", "--tasklets", "tasklets", type=int, default=16,
           help="tasklets per DPU (1..24; fewer than 11 leave the pipeline idle in the cost model)")
    option("compute", "upmem", "--sync-every", "sync_every", type=int, default=1,
           help="epochs between host aggregations and re-broadcasts (>= the epoch count: once, at the end)")


@hookimpl
def rlbench_register_commands(cli):
    from rlbench_upmem.cli import upmem

    cli.add_command(upmem)


@hookimpl
def rlbench_fingerprint():
    import glob
    import importlib.util
    import shutil

    ranks = len(glob.glob("/dev/dpu_rank*"))
    return {
        "mode": "emulator",
        "hardware_dpus": ranks * 64,  # the UPMEM driver exposes one /dev/dpu_rankN per rank
        "sdk": shutil.which("dpu-upmem-dpurte-clang"),
        "emulator_native": importlib.util.find_spec("rlbench_upmem._pim") is not None,
        "note": "DPU results come from the emulator; hardware times are modelled",
    }


def probe():
    from rlbench.protocols import Probe, probe_modules

    found = probe_modules("numpy", "rlbench_upmem._pim",
                          hint="reinstall with `pip install -e plugins/upmem` (needs gcc and Python headers)")
    if not found.available:
        return found
    return Probe.ok("execution-model emulator (no UPMEM hardware needed); hardware time is modelled")
