"""What the upmem plugin declares about itself: its compute capabilities and its fingerprint.

A leaf module (it imports nothing of the plugin), so that the hooks in `plugin` and the backend both
read the same objects without importing each other.
"""

from __future__ import annotations

from typing import Any

from rlbench.protocols import ComputeCapabilities

CAPABILITIES = ComputeCapabilities(
    roles=frozenset({"qlearning:tabular", "sarsa:tabular"}),
    device="upmem-emulator",
    does_not="cannot run deep algorithms (dqn, ddpg): UPMEM DPUs have no FPU and no torch device, so no MLP "
             "and no convolution; tabular Q-learning and SARSA only",
    networks=frozenset(),  # no network at all: tables
)

TABULAR_ONLY = "upmem runs tabular algorithms only: " + CAPABILITIES.does_not


def fingerprint() -> dict[str, Any]:
    """The machine as this plugin sees it: emulator mode, and any UPMEM hardware or SDK present."""
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
