"""An emulator of the UPMEM execution model running SwiftRL's offline tabular Q-learning / SARSA.

What is emulated (and really executed):
- DPUs grouped in ranks of 64; each DPU has a 64 MB MRAM and a 64 KB WRAM budget and 1..24 tasklets.
- host -> DPU scatter (C, `_pim.pack`): the dataset is partitioned (contiguous, stride or random) and
  each DPU's chunk is packed into 16-byte records in its MRAM, in the order that DPU will process it;
  values the program cannot use are refused in the same pass.
- a round (C, `_pim.round`), driven rank by rank: the host table broadcast to every DPU's MRAM; the
  DPU program: Q-table and seen flags loaded into WRAM, the chunk streamed through per-tasklet DMA
  buffers, every update applied in chunk order (exact per-DPU sequential semantics), FP32 or INT32
  fixed point (integer arithmetic only: the DPU has no FPU), WRAM written back to MRAM; the gather of
  every DPU's table and host aggregation: Q(s, a) becomes the mean over the DPUs that updated (s, a);
  a pair no DPU updated keeps its previous host value (zero before any training).
- synchronisation every `sync_every` epochs: the host broadcasts the aggregated table back to every
  DPU and the DPUs go on from it; `sync_every=None` (or >= epochs) aggregates once, at the end.

Tasklets share one Q-table; the emulated program hands the chunk to them block by block (block b to
tasklet b % T) and commits updates in chunk order, so the tasklet count changes WRAM use and the
modelled time, never the result.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from rlbench.errors import RlbenchError
from rlbench_upmem.hardware import UPMEM, DpuHardware, KiB, MiB, dpu_count

PARTITIONS = ("contiguous", "stride", "random")
NUMERICS = ("fp32", "int32")
RULES = ("qlearning", "sarsa")
DEFAULT_SCALE = 1 << 16  # INT32 fixed point: value = integer / scale
DEFAULT_TASKLETS = 16
BLOCK_RECORDS = 32  # one 512-byte mram_read per block

_RECORD_FIELDS = [("obs", "<i4"), ("next_obs", "<i4"), ("reward", None), ("action", "u1"),
                  ("next_action", "u1"), ("done", "u1"), ("pad", "u1")]
RECORD = {numeric: np.dtype([(name, kind or ("<f4" if numeric == "fp32" else "<i4")) for name, kind in _RECORD_FIELDS])
          for numeric in NUMERICS}
RECORD_BYTES = RECORD["fp32"].itemsize
DATASET_FIELDS = ("obs", "action", "reward", "next_obs", "next_action", "done")
INDEX_FIELDS = ("obs", "action", "next_obs", "next_action")  # in the order pim.c's pack takes them


class WorkloadDoesNotFitError(RlbenchError):
    """A DPU's MRAM or WRAM cannot hold what the workload needs."""


def choose(value: str, allowed: tuple[str, ...], what: str) -> str:
    if value not in allowed:
        import difflib

        close = difflib.get_close_matches(str(value), allowed, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise RlbenchError(f"unknown {what} {value!r} (choose {', '.join(allowed)}){hint}")
    return value


def partition(n: int, dpus: int, strategy: str, seed: int = 0) -> tuple[np.ndarray | None, np.ndarray]:
    """(order, offsets): DPU d processes dataset rows order[offsets[d]:offsets[d+1]] in that order.
    order is None for contiguous (the identity). Chunk sizes differ by at most one row."""
    choose(strategy, PARTITIONS, "partition")
    sizes = np.full(dpus, n // dpus, dtype=np.int64)
    sizes[: n % dpus] += 1
    offsets = np.zeros(dpus + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    if strategy == "contiguous":
        return None, offsets
    if strategy == "stride":  # DPU d gets rows d, d + D, d + 2D, ...: read a (rows, D) grid column-wise
        grid = np.arange(-(-n // dpus) * dpus, dtype=np.int64).reshape(-1, dpus).T.ravel()
        return grid[grid < n], offsets
    return np.random.default_rng(seed).permutation(n), offsets


@dataclass(frozen=True)
class DpuBudget:
    """What one DPU must hold, against its memories."""

    chunk_records: int
    table_entries: int
    tasklets: int
    hardware: DpuHardware = UPMEM

    @property
    def mram_bytes(self) -> int:  # Q-table + seen flags + the chunk
        return _align8(self.table_entries * 4) + _align8(self.table_entries) + self.chunk_records * RECORD_BYTES

    @property
    def wram_bytes(self) -> int:  # Q-table + seen flags + one DMA buffer and one stack per tasklet
        per_tasklet = BLOCK_RECORDS * RECORD_BYTES + self.hardware.stack_bytes_per_tasklet
        return _align8(self.table_entries * 4) + _align8(self.table_entries) + self.tasklets * per_tasklet

    def check(self) -> None:
        hw = self.hardware
        if self.mram_bytes > hw.mram_bytes:
            raise WorkloadDoesNotFitError(
                f"workload does not fit a DPU's MRAM: {self.chunk_records:,} transitions x {RECORD_BYTES} B + "
                f"Q-table {self.table_entries:,} x 5 B = {self.mram_bytes / MiB:.1f} MiB > {hw.mram_bytes // MiB} MiB; "
                f"use more DPUs (--upmem-dpus)")
        if self.wram_bytes > hw.wram_bytes:
            per_tasklet = BLOCK_RECORDS * RECORD_BYTES + hw.stack_bytes_per_tasklet
            raise WorkloadDoesNotFitError(
                f"workload does not fit a DPU's WRAM: Q-table {self.table_entries:,} entries x 5 B + "
                f"{self.tasklets} tasklets x {per_tasklet} B = {self.wram_bytes / KiB:.1f} KiB > "
                f"{hw.wram_bytes // KiB} KiB; use fewer tasklets (--upmem-tasklets) or a smaller table")


def _align8(n: int) -> int:
    return (n + 7) & ~7


class PimSystem:
    """The DPUs' memories and the host-side transfers around them."""

    def __init__(self, dpus: int, n_states: int, n_actions: int, *, tasklets: int = DEFAULT_TASKLETS,
                 numeric: str = "fp32", scale: int = DEFAULT_SCALE, hardware: DpuHardware = UPMEM) -> None:
        choose(numeric, NUMERICS, "numeric")
        dpus = dpu_count(dpus, hardware)
        if not 1 <= tasklets <= hardware.max_tasklets:
            raise RlbenchError(f"tasklets (--upmem-tasklets) must be between 1 and {hardware.max_tasklets}, "
                               f"got {tasklets}")
        if not 1 <= n_actions <= 255:
            raise RlbenchError(f"the DPU record stores actions in one byte: at most 255 actions, got {n_actions}")
        if numeric == "int32" and not 1 <= scale <= 1 << 30:
            raise RlbenchError(f"fixed-point-scale (--upmem-fixed-point-scale) must be between 1 and 2**30, "
                               f"got {scale}")
        self.dpus, self.n_states, self.n_actions = dpus, n_states, n_actions
        self.tasklets, self.numeric, self.scale, self.hardware = tasklets, numeric, int(scale), hardware
        self.ranks = math.ceil(dpus / hardware.dpus_per_rank)
        DpuBudget(0, n_states * n_actions, tasklets, hardware).check()
        q_dtype = np.float32 if numeric == "fp32" else np.int32
        self.q_mram = np.zeros((dpus, n_states, n_actions), dtype=q_dtype)
        self.seen_mram = np.zeros((dpus, n_states, n_actions), dtype=np.uint8)
        self.records = np.zeros(0, dtype=RECORD[numeric])
        self.offsets = np.zeros(dpus + 1, dtype=np.int64)
        self.saturations = 0
        self.unseen_pairs: int | None = None  # pairs no DPU updated in the last round gathered

    # -- host -> DPU --------------------------------------------------------------------------------
    def scatter(self, dataset: Mapping[str, np.ndarray], strategy: str = "contiguous", seed: int = 0) -> int:
        """Partition the dataset and write each DPU's chunk into its MRAM. Returns bytes moved."""
        from rlbench_upmem import _pim

        arrays = _check_layout(dataset)
        n = arrays["obs"].shape[0]
        order, offsets = partition(n, self.dpus, strategy, seed)
        budget = DpuBudget(int(np.max(np.diff(offsets))), self.n_states * self.n_actions, self.tasklets, self.hardware)
        budget.check()
        # Ids are packed as int32: others are range-checked before they are narrowed.
        _check_values(arrays, self.n_states, self.n_actions,
                      tuple(name for name in INDEX_FIELDS if name in arrays and arrays[name].dtype != np.int32))
        ids = [np.ascontiguousarray(arrays[name], dtype=np.int32) if name in arrays else np.zeros(0, np.int32)
               for name in INDEX_FIELDS]
        if self.numeric == "int32":
            _check_values(arrays, self.n_states, self.n_actions, ("reward",))
            reward = self.to_fixed(arrays["reward"], "reward")
        else:
            with np.errstate(over="ignore"):  # float64 beyond float32's range becomes inf, which pack refuses
                reward = np.ascontiguousarray(arrays["reward"], dtype=np.float32)
        done = arrays["done"] if arrays["done"].dtype in (np.uint8, np.bool_) else arrays["done"] != 0
        if self.records.shape[0] != n:  # the MRAM images are reused from one scatter to the next
            self.records = np.empty(n, dtype=RECORD[self.numeric])
        self.offsets = np.zeros(self.dpus + 1, dtype=np.int64)  # no chunk is valid until the pack succeeds
        bad = _pim.pack(self.records, np.zeros(0, np.int64) if order is None else order, *ids, reward,
                        np.ascontiguousarray(done).view(np.uint8), self.n_states, self.n_actions,
                        self.numeric == "fp32")
        if bad:  # pim.c found a value the program cannot use: say which, and what was found
            _check_values(arrays, self.n_states, self.n_actions)
            raise RlbenchError("dataset['reward'] holds values beyond float32's range")  # finite only in float64
        self.offsets = offsets
        return self.records.nbytes

    def to_fixed(self, values: np.ndarray, what: str) -> np.ndarray:
        scaled = np.rint(np.asarray(values, dtype=np.float64) * self.scale)
        if scaled.size and np.abs(scaled).max() > np.iinfo(np.int32).max:
            raise RlbenchError(
                f"{what} values up to {np.abs(values).max():g} overflow INT32 at fixed-point scale {self.scale}; "
                f"lower fixed-point-scale (--upmem-fixed-point-scale) below "
                f"{int(np.iinfo(np.int32).max / np.abs(values).max())}")
        return scaled.astype(np.int32)

    # -- one round: host -> DPU broadcast, the DPU program, DPU -> host gather and aggregation ---------
    def run_round(self, q_host: np.ndarray, rule: str, alpha: float, gamma: float, epochs: int
                  ) -> tuple[np.ndarray, dict[str, float], dict[str, int]]:
        """Every DPU starts from the host's table (seen flags cleared) and sweeps its chunk `epochs`
        times; the host gathers the tables and averages every (s, a) over the DPUs that updated it,
        unseen pairs keeping q_host's value. The emulated MRAM already lies in host memory, so the
        gather reads each DPU's images in place. The C side takes the DPUs rank by rank through the
        three phases (see pim.c) and times each. Returns (new table float64, seconds, bytes moved)."""
        from rlbench_upmem import _pim

        choose(rule, RULES, "rule")
        host = np.ascontiguousarray(q_host.astype(np.float32) if self.numeric == "fp32" else self.to_fixed(q_host, "Q"))
        sums = np.zeros(q_host.shape, dtype=np.float64)
        counts = np.zeros(q_host.shape, dtype=np.int64)
        saturations, broadcast_s, kernel_s, gather_s = _pim.round(
            self.records, self.offsets, self.q_mram, self.seen_mram, host, sums, counts, self.n_states,
            self.n_actions, RULES.index(rule), int(self.numeric == "int32"), float(alpha), float(gamma), self.scale,
            int(epochs), self.tasklets, BLOCK_RECORDS, self.hardware.wram_bytes, self.hardware.dpus_per_rank)
        self.saturations += saturations
        t0 = time.perf_counter()
        if self.numeric == "int32":
            sums /= self.scale
        seen = counts > 0
        self.unseen_pairs = int(seen.size - np.count_nonzero(seen))
        aggregated = np.array(q_host, dtype=np.float64)
        aggregated[seen] = sums[seen] / counts[seen]
        seconds = {"broadcast": broadcast_s, "kernel": kernel_s,
                   "gather_aggregate": gather_s + time.perf_counter() - t0}
        moved = {"host_to_dpu": self.q_mram.nbytes, "dpu_to_host": self.q_mram.nbytes + self.seen_mram.nbytes}
        return aggregated, seconds, moved

    @property
    def nbytes(self) -> int:
        """Everything the emulated DPUs hold (the MRAM images)."""
        return self.records.nbytes + self.q_mram.nbytes + self.seen_mram.nbytes + self.offsets.nbytes

    def chunk_sizes(self) -> np.ndarray:
        return np.diff(self.offsets)


def _check_layout(dataset: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Refuse a dataset the DPU record cannot hold (keys, shapes, dtypes), without copying the arrays
    (a 1M dataset is 21 MB); the values are checked as they are packed. next_action may be absent:
    Q-learning never reads it (the scatter writes zeros)."""
    required = [name for name in DATASET_FIELDS if name != "next_action"]
    missing = [name for name in required if name not in dataset]
    if missing:
        raise RlbenchError(f"dataset lacks {', '.join(missing)} (rlbench.datasets arrays are required)")
    arrays = {name: np.asarray(dataset[name]) for name in DATASET_FIELDS if name in dataset}
    n = arrays["obs"].shape[0] if arrays["obs"].ndim == 1 else -1
    for name, array in arrays.items():
        if array.ndim != 1 or array.shape[0] != n:
            raise RlbenchError(f"dataset[{name!r}] must be 1-D with one row per transition like obs, got shape {array.shape}")
        kinds = "fiu" if name == "reward" else "biu" if name == "done" else "iu"
        if array.dtype.kind not in kinds:
            raise RlbenchError(f"dataset[{name!r}] has dtype {array.dtype}, which the DPU record cannot hold")
    return arrays


def _check_values(arrays: Mapping[str, np.ndarray], n_states: int, n_actions: int,
                  names: tuple[str, ...] = ("reward",) + INDEX_FIELDS) -> None:
    """The values the DPU program cannot run on, refused with what was found."""
    if "reward" in names and not np.isfinite(arrays["reward"]).all():
        raise RlbenchError("dataset['reward'] holds NaN or infinity")
    for name in INDEX_FIELDS:
        if name not in names or name not in arrays or arrays[name].size == 0:
            continue
        high = n_states if name.endswith("obs") else n_actions
        low_seen, high_seen = int(arrays[name].min()), int(arrays[name].max())
        if low_seen < 0 or high_seen >= high:
            raise RlbenchError(f"dataset {name} spans {low_seen}..{high_seen}, outside the table's 0..{high - 1}")


def check_step(rule: str, alpha: float, gamma: float) -> None:
    choose(rule, RULES, "rule")
    if not 0.0 < alpha <= 1.0:
        raise RlbenchError(f"alpha must be in (0, 1], got {alpha!r}")
    if not 0.0 <= gamma <= 1.0:
        raise RlbenchError(f"gamma must be in [0, 1], got {gamma!r}")


def n_records(dataset: Mapping[str, np.ndarray]) -> int:
    return len(dataset["obs"]) if "obs" in dataset else 0


def run_offline(system: PimSystem, dataset: Mapping[str, np.ndarray], q_host: np.ndarray, *, rule: str,
                alpha: float, gamma: float, epochs: int, partition_strategy: str = "contiguous", seed: int = 0,
                sync_every: int | None = None) -> tuple[np.ndarray, dict[str, Any]]:
    """The SwiftRL flow: scatter once, then rounds of broadcast -> DPU sweeps -> gather -> aggregate.
    Returns the aggregated table (float64) and what was measured on this machine."""
    check_step(rule, alpha, gamma)
    if n_records(dataset) == 0:
        raise RlbenchError("the dataset is empty")
    if rule == "sarsa" and "next_action" not in dataset:
        raise RlbenchError("sarsa needs dataset['next_action']")
    if epochs < 1:
        raise RlbenchError(f"epochs must be >= 1, got {epochs}")
    if sync_every is not None and sync_every < 1:
        raise RlbenchError(f"sync-every (--upmem-sync-every) must be >= 1 epoch, got {sync_every}")
    per_round = epochs if sync_every is None else min(sync_every, epochs)
    seconds = {"scatter": 0.0, "broadcast": 0.0, "kernel": 0.0, "gather_aggregate": 0.0}
    moved = {"host_to_dpu": 0, "dpu_to_host": 0}
    t0 = time.perf_counter()
    moved["host_to_dpu"] += system.scatter(dataset, partition_strategy, seed)
    seconds["scatter"] += time.perf_counter() - t0
    done, rounds = 0, 0
    while done < epochs:
        sweeps = min(per_round, epochs - done)
        q_host, round_seconds, round_moved = system.run_round(q_host, rule, alpha, gamma, sweeps)
        for key, value in round_seconds.items():
            seconds[key] += value
        for key, value in round_moved.items():
            moved[key] += value
        done, rounds = done + sweeps, rounds + 1
    updates = int(system.records.shape[0]) * epochs
    total = sum(seconds.values())
    measured = {
        "kind": "measured",
        "what": "UPMEM execution-model emulator on this host (not DPU time)",
        "seconds": {k: round(v, 6) for k, v in seconds.items()} | {"total": round(total, 6)},
        "updates": updates,
        "updates_per_s": updates / total if total > 0 else None,
        "kernel_updates_per_s": updates / seconds["kernel"] if seconds["kernel"] > 0 else None,
        "bytes": moved,
        "rounds": rounds,
        "emulator_bytes": system.nbytes,
        "unseen_pairs": system.unseen_pairs,
        "int32_saturations": system.saturations if system.numeric == "int32" else None,
    }
    return q_host, measured
