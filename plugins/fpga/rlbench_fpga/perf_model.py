"""PEARL's analytical FPGA model: what the kernels would take on a real board. Always `modelled`.

Replay (K-ary sum tree of depth D, batch B, clock f):
    sample  ~ 2K(B + D) / f   (K children compared per level, pipelined over B targets, D levels to fill)
    update  ~ 2D / f per item (a read and a write per level on the path to the root)
    insert  ~ 2D / f per item
plus memory terms: one host<->board DMA latency per transfer and bytes / PCIe bandwidth.
MLP: multiply-accumulates / (MACs per cycle) / f plus one cycle per layer and element of pipeline fill.
Tabular: the in-order loop carries a read-after-write dependency through the table: `td_initiation_interval`
cycles per update.
The board parameters are assumptions for a named class of board, not measurements.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Sequence


@dataclass(frozen=True)
class Board:
    name: str
    clock_hz: float
    dma_latency_s: float  # one host<->board transfer, setup and completion
    pcie_bytes_per_s: float
    macs_per_cycle: int  # DSP blocks given to the MLP kernel
    td_initiation_interval: int  # cycles between dependent float64 table updates


DEFAULT_BOARD = Board(name="Agilex-7-class FPGA, 250 MHz, PCIe Gen4 x8", clock_hz=250e6, dma_latency_s=2e-6,
                      pcie_bytes_per_s=12e9, macs_per_cycle=512, td_initiation_interval=8)


def _transfer(board: Board, nbytes: int) -> float:
    return board.dma_latency_s + nbytes / board.pcie_bytes_per_s


def sample_seconds(batch: int, fanout: int, depth: int, row_bytes: int, board: Board = DEFAULT_BOARD) -> float:
    compute = 2 * fanout * (batch + depth) / board.clock_hz
    return compute + _transfer(board, batch * (8 + row_bytes))  # index + weight + row per item, one read


def update_seconds(batch: int, depth: int, board: Board = DEFAULT_BOARD) -> float:
    return batch * 2 * depth / board.clock_hz + _transfer(board, batch * 8)


def insert_seconds(batch: int, depth: int, row_bytes: int, board: Board = DEFAULT_BOARD) -> float:
    return batch * 2 * depth / board.clock_hz + _transfer(board, batch * (row_bytes + 4))


def mlp_seconds(batch: int, layer_sizes: Sequence[int], board: Board = DEFAULT_BOARD) -> float:
    macs = batch * sum(a * b for a, b in zip(layer_sizes[:-1], layer_sizes[1:]))
    fill = sum(layer_sizes[1:])
    compute = (macs / board.macs_per_cycle + fill) / board.clock_hz
    return compute + _transfer(board, batch * layer_sizes[0] * 4) + _transfer(board, batch * layer_sizes[-1] * 4)


def tabular_seconds(transitions: int, epochs: int, board: Board = DEFAULT_BOARD) -> float:
    return transitions * epochs * board.td_initiation_interval / board.clock_hz + _transfer(board, transitions * 28)


def describe(board: Board = DEFAULT_BOARD) -> dict[str, Any]:
    return {"timing": "modelled", "model": "PEARL analytical FPGA model", **asdict(board)}
