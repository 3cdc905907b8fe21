"""rlbench hooks of the upmem plugin, and nothing else. Cheap to import: factories and probes are
"module:attr" strings; what the plugin declares lives in `capabilities`, DPU limits in `hardware`."""

from __future__ import annotations

from rlbench.hookspecs import hookimpl
from rlbench_upmem.capabilities import CAPABILITIES, fingerprint
from rlbench_upmem.hardware import MAX_DPUS, dpu_count

RLBENCH_API = "1.1"  # the plugin API this plugin targets (docs/plugin-api-changelog.md)


@hookimpl
def rlbench_register_compute_backends(register):
    register("upmem", "rlbench_upmem.backend:UpmemCompute", probe="rlbench_upmem.plugin:probe",
             capabilities=CAPABILITIES,
             description="UPMEM processing-in-memory (SwiftRL tabular), on an execution-model emulator")


@hookimpl
def rlbench_register_run_options(option):
    option("compute", "upmem", "--upmem-dpus", "dpus", type=dpu_count, default=64,
           help=f"DPUs to emulate (64 per rank, at most {MAX_DPUS:,}); the offline dataset is split across them")
    option("compute", "upmem", "--upmem-numeric", "numeric", default="fp32", choices=("fp32", "int32"),
           help="DPU arithmetic: fp32 (software float) or int32 fixed point")
    option("compute", "upmem", "--upmem-partition", "partition", default="contiguous",
           choices=("contiguous", "stride", "random"), help="how dataset rows are assigned to DPUs")
    option("compute", "upmem", "--upmem-fixed-point-scale", "fixed_point_scale", type=int, default=1 << 16,
           help="int32 numerics: a value v is stored as round(v * scale)")
    option("compute", "upmem", "--upmem-tasklets", "tasklets", type=int, default=16,
           help="tasklets per DPU (1..24; fewer than 11 leave the pipeline idle in the cost model)")
    option("compute", "upmem", "--upmem-sync-every", "sync_every", type=int, default=1,
           help="epochs between host aggregations and re-broadcasts (>= the epoch count: once, at the end)")


@hookimpl
def rlbench_register_commands(cli):
    from rlbench_upmem.cli import upmem

    cli.add_command(upmem)


@hookimpl
def rlbench_fingerprint():
    return fingerprint()


def probe():
    from rlbench.protocols import Probe, probe_modules

    found = probe_modules("numpy", "rlbench_upmem._pim",
                          hint="reinstall with `pip install -e plugins/upmem` (needs gcc and Python headers)")
    if not found.available:
        return found
    return Probe.ok("execution-model emulator (no UPMEM hardware needed); hardware time is modelled")
