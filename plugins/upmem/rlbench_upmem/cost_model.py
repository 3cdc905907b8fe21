"""A model of real UPMEM hardware time for the SwiftRL workload. Every output is labelled "modelled".

time = scatter + rounds x (broadcast + launch + slowest DPU's kernel + gather + host aggregation)

- kernel: cycles per update from the update's operations (hardware.py's PrIM-derived costs), divided
  by the pipeline occupancy min(T, 11) / 11 (a tasklet issues every 11 cycles), overlapped with the
  MRAM -> WRAM DMA of the chunk (alpha + beta * bytes per 512-byte block) when T >= 2, plus the
  Q-table's load into and store from WRAM; clock 350 MHz.
- transfers: bytes / bandwidth, PrIM's per-rank bandwidth times the ranks in use, up to a host cap.
"""

from __future__ import annotations

import math
from typing import Any

from rlbench_upmem.emulator import BLOCK_RECORDS, RECORD_BYTES
from rlbench_upmem.hardware import UPMEM, DpuHardware


def cycles_per_update(rule: str, numeric: str, n_actions: int, scale: int, hw: DpuHardware = UPMEM) -> dict[str, float]:
    """Instruction cycles of one TD update at full pipeline occupancy, by operation."""
    compares = n_actions - 1 if rule == "qlearning" else 0
    ops: dict[str, float] = {"row addressing (2 int32 mul)": 2 * hw.cycles_int32_mul,
                             "loads, stores, loop": hw.cycles_overhead_per_update}
    if numeric == "fp32":
        ops["3 fp32 add/sub"] = 3 * hw.cycles_fp32_add
        ops["2 fp32 mul (alpha, gamma)"] = 2 * hw.cycles_fp32_mul
        # assumption: a software float compare is ~4 integer operations
        ops[f"{compares} fp32 compare (max)"] = compares * 4 * hw.cycles_int32_add
    else:
        shift = scale & (scale - 1) == 0  # a power-of-two scale divides by shifting
        ops["3 int32 add/sub"] = 3 * hw.cycles_int32_add
        ops["2 int64 mul (alpha, gamma)"] = 2 * hw.cycles_int64_mul
        ops["2 rescale " + ("shift" if shift else "int64 div")] = 2 * (hw.cycles_int32_add if shift else 2 * hw.cycles_int32_div)
        ops[f"{compares} int32 compare (max)"] = compares * hw.cycles_int32_add
    return ops


def predict(*, rule: str, numeric: str, scale: int, dpus: int, tasklets: int, chunk_records: int, total_records: int,
            n_states: int, n_actions: int, epochs: int, rounds: int, hw: DpuHardware = UPMEM) -> dict[str, Any]:
    ops = cycles_per_update(rule, numeric, n_actions, scale, hw)
    instr = sum(ops.values())
    occupancy = min(tasklets, hw.pipeline_fill_tasklets) / hw.pipeline_fill_tasklets
    compute = instr / occupancy  # cycles per update at this tasklet count
    blocks_per_sweep = math.ceil(chunk_records / BLOCK_RECORDS)
    dma_sweep = blocks_per_sweep * hw.dma_read_alpha_cycles + chunk_records * RECORD_BYTES * hw.dma_beta_cycles_per_byte
    table_bytes = n_states * n_actions * 5  # Q + seen flags
    table_dma = 2 * (math.ceil(table_bytes / hw.max_dma_bytes) * hw.dma_read_alpha_cycles
                     + table_bytes * hw.dma_beta_cycles_per_byte)
    per_round_epochs = epochs / rounds
    sweep_compute = chunk_records * compute
    sweep = sweep_compute + dma_sweep if tasklets == 1 else max(sweep_compute, dma_sweep)
    kernel_round_s = (sweep * per_round_epochs + table_dma) / hw.clock_hz + hw.kernel_launch_s

    ranks = math.ceil(dpus / hw.dpus_per_rank)
    h2d = min(ranks * hw.host_to_dpu_bytes_per_s_per_rank, hw.host_transfer_cap_bytes_per_s)
    d2h = min(ranks * hw.dpu_to_host_bytes_per_s_per_rank, hw.host_transfer_cap_bytes_per_s)
    scatter_s = total_records * RECORD_BYTES / h2d
    broadcast_s = dpus * n_states * n_actions * 4 / h2d
    gather_s = dpus * table_bytes / d2h
    aggregate_s = dpus * table_bytes / hw.host_aggregate_bytes_per_s
    seconds = {"scatter": scatter_s, "broadcast": rounds * broadcast_s, "kernel": rounds * kernel_round_s,
               "gather": rounds * gather_s, "aggregate": rounds * aggregate_s}
    total = sum(seconds.values())
    updates = total_records * epochs
    return {
        "kind": "modelled",
        "what": "predicted UPMEM hardware time (rlbench_upmem.cost_model; parameters and sources in hardware.py)",
        "seconds": {k: v for k, v in seconds.items()} | {"total": total},
        "updates_per_s": updates / total,
        "kernel_updates_per_s": updates / seconds["kernel"],
        "cycles_per_update": compute,
        "instructions_per_update": instr,
        "instruction_mix": ops,
        "pipeline_occupancy": occupancy,
        "dma_cycles_per_update": dma_sweep / max(chunk_records, 1),
        "bound": "compute" if sweep_compute >= dma_sweep else "mram-dma",
        "clock_hz": hw.clock_hz,
        "ranks": ranks,
        "host_to_dpu_bytes_per_s": h2d,
        "dpu_to_host_bytes_per_s": d2h,
        "bandwidth_capped": ranks * hw.dpu_to_host_bytes_per_s_per_rank > hw.host_transfer_cap_bytes_per_s,
    }
