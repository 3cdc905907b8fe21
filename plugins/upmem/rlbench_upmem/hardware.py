"""Every UPMEM hardware parameter the emulator and the cost model use, in one place, with its source.

PrIM = J. Gómez-Luna et al., "Benchmarking a New Paradigm: Experimental Analysis and
Characterization of a Real Processing-in-Memory System", IEEE Access 10 (2022), measured on a
2,556-DPU UPMEM server (P21 DIMMs, 350 MHz). UPMEM-SDK = the UPMEM SDK user manual (DPU runtime).
SwiftRL = K. Gogineni et al., "SwiftRL: Towards Efficient Reinforcement Learning on Real
Processing-In-Memory Systems", ISPASS 2024. Values marked "assumption" have no published figure.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

from rlbench.errors import RlbenchError

KiB = 1 << 10
MiB = 1 << 20


@dataclass(frozen=True)
class DpuHardware:
    # --- structure (UPMEM-SDK; PrIM section 2) -------------------------------------------------
    mram_bytes: int = 64 * MiB  # per-DPU DRAM bank
    wram_bytes: int = 64 * KiB  # per-DPU scratchpad; all tasklets share it
    max_tasklets: int = 24  # hardware threads per DPU
    dpus_per_rank: int = 64  # 8 chips x 8 DPUs
    dpus_per_dimm: int = 128  # 2 ranks x 8 chips x 8 DPUs
    dimms_per_server: int = 20  # the largest UPMEM server: PrIM's, 20 double-rank PIM-DIMMs (2,560 DPUs, 2,556 working)
    max_dma_bytes: int = 2048  # one mram_read/mram_write moves 8..2048 bytes, 8-byte aligned
    stack_bytes_per_tasklet: int = 1 * KiB  # assumption: a small DPU program's stack (SDK sizes it per program)

    # --- pipeline (PrIM 2.1 / 3.1) -------------------------------------------------------------
    clock_hz: float = 350e6  # P21 DIMMs; PrIM's 640-DPU system ran at 267 MHz
    pipeline_fill_tasklets: int = 11  # a tasklet issues one instruction every 11 cycles: >= 11 fill the pipeline

    # --- operation costs in pipeline cycles at full occupancy (PrIM Fig. 5, 16 tasklets, 350 MHz:
    #     throughput in MOPS converted as 350 / MOPS; they include the micro-benchmark's load/store) ---
    cycles_int32_add: float = 350 / 58.56
    cycles_int32_mul: float = 350 / 10.27  # no 32x32 multiplier: mul_step sequences
    cycles_int32_div: float = 350 / 11.27
    cycles_fp32_add: float = 350 / 4.91  # no FPU: software emulation
    cycles_fp32_mul: float = 350 / 1.91
    cycles_int64_mul: float = 4 * 350 / 10.27  # assumption: four 32x32 partial products
    cycles_overhead_per_update: float = 20.0  # assumption: WRAM loads/stores, loop and branch instructions

    # --- MRAM <-> WRAM DMA (PrIM 3.2.1: latency = alpha + beta * bytes, in cycles) ---------------
    dma_read_alpha_cycles: float = 77.0
    dma_write_alpha_cycles: float = 61.0
    dma_beta_cycles_per_byte: float = 0.5

    # --- host <-> DPU transfers (PrIM 3.4: parallel transfers to the 64 DPUs of one rank; ranks move
    #     data in parallel, so the model multiplies by the ranks in use, up to a host-side cap) ------
    host_to_dpu_bytes_per_s_per_rank: float = 6.68e9
    dpu_to_host_bytes_per_s_per_rank: float = 4.74e9
    host_transfer_cap_bytes_per_s: float = 25e9  # assumption: the host's DDR4 channels bound the aggregate
    kernel_launch_s: float = 20e-6  # assumption: dpu_launch synchronous round trip

    # --- the host's side of the aggregation ------------------------------------------------------
    host_aggregate_bytes_per_s: float = 10e9  # assumption: one streaming pass over the gathered tables

    @property
    def max_dpus(self) -> int:
        return self.dimms_per_server * self.dpus_per_dimm


UPMEM = DpuHardware()
MAX_DPUS = UPMEM.max_dpus  # 2,560: beyond it there is no hardware whose time the model could predict


def dpu_count(value: object, hardware: DpuHardware = UPMEM) -> int:
    """A DPU count as an int, refused in one line unless 1 <= value <= the modelled server's DPUs.
    The type of `rlbench run`'s --upmem-dpus and of the upmem commands' --dpus, so the message names
    no flag (the CLI prints the RlbenchError in one line, exit 2)."""
    try:
        dpus = None if isinstance(value, bool) else int(value) if isinstance(value, str) else operator.index(value)
    except (TypeError, ValueError):
        dpus = None
    if dpus is None or dpus < 1:
        raise RlbenchError(f"the DPU count must be a positive integer, got {value!r}")
    if dpus > hardware.max_dpus:
        raise RlbenchError(
            f"{dpus:,} DPUs is more than the modelled hardware has: {hardware.max_dpus:,} DPUs in a "
            f"{hardware.dimms_per_server}-DIMM UPMEM server ({hardware.dimms_per_server} DIMMs x "
            f"{hardware.dpus_per_dimm} DPUs)")
    return dpus
