"""Replay `gpu`: proportional prioritized replay whose storage and priority tree live on the device.

Same semantics as the core's `prioritized` memory (rlbench/builtin/replay.py): P(i) = p_i**alpha /
sum_j p_j**alpha, stratified sampling (draw k falls in the k-th of batch_size equal slices of the
total mass), importance weights (N P(i))**-beta / max_j (N P(j))**-beta with the maximum over the
whole memory, FIFO overwrite, new items get the largest priority seen so far (starting at 1.0), a
repeated index in one update takes the LAST priority given, zero priorities are never sampled.

The tree is two levels, made for the GPU: leaves (priority**alpha, float64) grouped in blocks of
~sqrt(capacity), plus each block's sum and minimum. A sample is a cumulative sum over the block sums
and a searchsorted, then one gathered row of leaves per draw, a row-wise cumulative sum and a second
searchsorted: a handful of kernels for the whole batch, whatever the depth a binary tree would
have. An update writes the leaves and recomputes the sums and minima of the blocks it touched. No
Python loop over items or levels, no host round trip except the validity check of device inputs.

Arrays given as numpy are copied to the device; torch tensors are used where they are. Samples
come back as numpy arrays when the memory is on the CPU device and as device tensors on CUDA, so
the learner's batch never crosses to the host.
"""

from __future__ import annotations

import functools

from typing import Any, Mapping

import numpy as np
import torch

from rlbench.kit.checks import non_negative, positive_int
from rlbench.errors import RlbenchError
from rlbench.protocols import ReplayCapabilities, Sample
from rlbench_gpu.device import resolve_device

DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "int64": torch.int64,
          "int32": torch.int32, "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool}
TORCH_TO_NAME = {v: k for k, v in DTYPES.items()}


class ReplayError(RlbenchError, ValueError):
    """Bad input to the gpu replay memory."""


_positive_int = functools.partial(positive_int, error=ReplayError)
_non_negative = functools.partial(non_negative, error=ReplayError)


def dtype_name(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return TORCH_TO_NAME.get(value.dtype, str(value.dtype))
    return str(np.asarray(value).dtype)


class GpuPrioritizedReplay:
    """ReplayMemory "gpu" (see the module docstring)."""

    def __init__(self, capacity: int, *, alpha: float = 0.6, seed: int | None = None, device: Any = "cuda",
                 **ignored_options: Any) -> None:
        self.capacity = _positive_int(capacity, "capacity")
        self.alpha = _non_negative(alpha, "alpha")
        self.device = resolve_device(device)
        self.capabilities = ReplayCapabilities(prioritized=True, dtypes=tuple(DTYPES), device=self.device.type,
                                               accepts_tensors=True)
        self._generator = torch.Generator(device=self.device)
        self._generator.manual_seed(seed if seed is not None else int(torch.seed() % (1 << 63)))
        self.block = 1 << max(1, (max(1, int(np.sqrt(self.capacity)))).bit_length() - 1)
        self.n_blocks = -(-self.capacity // self.block)
        f64 = dict(dtype=torch.float64, device=self.device)
        self._leaves = torch.zeros(self.n_blocks * self.block, **f64)  # priority**alpha; 0 = empty or never sampled
        self._block_sum = torch.zeros(self.n_blocks, **f64)
        self._block_min = torch.full((self.n_blocks,), torch.inf, **f64)  # over positive leaves only
        self._max_priority = torch.ones((), **f64)  # raw priority, before alpha
        self._columns: dict[str, torch.Tensor] = {}
        self._size = 0
        self._cursor = 0
        self._zeros_written = False  # only then can the total mass be zero: sample checks it (a device sync)
        self._counts = dict(adds=0, add_calls=0, samples=0, sampled_items=0, updates=0, updated_items=0)

    def __len__(self) -> int:
        return self._size

    # -- add -----------------------------------------------------------------------------------------
    def add(self, transitions: Mapping[str, Any], priorities: Any = None) -> np.ndarray:
        """Store a batch (leading axis = items); returns the indices written (numpy int64)."""
        first = not self._columns
        rows, n = self._validated_rows(transitions, first)
        indices = np.arange(self._cursor, self._cursor + n, dtype=np.int64) % self.capacity
        new_size = min(self._size + n, self.capacity)
        device_indices = torch.as_tensor(indices, device=self.device)
        if priorities is not None:
            device_priorities = self._validated_priorities(device_indices, priorities, new_size, "add")
        if first:
            self._allocate(rows)
        self._write_rows(rows, n)
        self._size = new_size
        if priorities is None:
            self._set_leaves(device_indices, self._max_priority.expand(n) ** self.alpha)
        else:
            self._set_priorities(device_indices, device_priorities)
        self._counts["adds"] += n
        self._counts["add_calls"] += 1
        return indices

    def _validated_rows(self, transitions: Mapping[str, Any], first: bool) -> tuple[dict[str, torch.Tensor], int]:
        if not isinstance(transitions, Mapping) or not transitions:
            raise ReplayError("add() needs a non-empty dict of field name -> array with a leading batch axis")
        if not first and transitions.keys() != self._columns.keys():
            raise ReplayError(f"add() needs exactly the fields {sorted(self._columns)}, got {sorted(map(str, transitions))}")
        rows: dict[str, torch.Tensor] = {}
        n = -1
        for name, value in transitions.items():
            if not isinstance(name, str):
                raise ReplayError(f"field names must be strings, got {name!r}")
            kind = dtype_name(value)
            if kind not in DTYPES:
                raise ReplayError(f"field {name!r} has dtype {kind}; this memory stores {', '.join(DTYPES)}")
            tensor = value if isinstance(value, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(value))
            if tensor.ndim == 0:
                raise ReplayError(f"field {name!r} has no leading batch axis (got a scalar); pass shape (batch, ...)")
            if not first:
                column = self._columns[name]
                if tensor.dtype != column.dtype or tensor.shape[1:] != column.shape[1:]:
                    raise ReplayError(
                        f"field {name!r}: got {kind}{list(tensor.shape)}, but this memory stores "
                        f"{TORCH_TO_NAME[column.dtype]} rows of shape {list(column.shape[1:])} (set by the first add)")
            if n < 0:
                n = len(tensor)
            elif len(tensor) != n:
                raise ReplayError(f"fields have different batch lengths: {name!r} has {len(tensor)}, others {n}")
            rows[name] = tensor
        return rows, n

    def _allocate(self, rows: dict[str, torch.Tensor]) -> None:
        columns = {}
        for name, tensor in rows.items():
            try:
                columns[name] = torch.zeros((self.capacity, *tensor.shape[1:]), dtype=tensor.dtype, device=self.device)
            except (RuntimeError, MemoryError):  # torch.OutOfMemoryError is a RuntimeError
                gib = self.capacity * tensor[:1].nbytes / 2**30
                raise ReplayError(f"cannot allocate {gib:.2f} GiB on {self.device} for field {name!r} "
                                  f"at capacity {self.capacity}") from None
        self._columns = columns

    def _write_rows(self, rows: dict[str, torch.Tensor], n: int) -> None:
        keep = min(n, self.capacity)  # a batch longer than the memory keeps only its last items
        first = (self._cursor + n - keep) % self.capacity
        split = min(keep, self.capacity - first)
        for name, column in self._columns.items():
            value = rows[name][n - keep:]
            column[first:first + split].copy_(value[:split], non_blocking=True)
            if split < keep:
                column[:keep - split].copy_(value[split:], non_blocking=True)
        self._cursor = (self._cursor + n) % self.capacity

    # -- sample --------------------------------------------------------------------------------------
    def sample(self, batch_size: int, beta: float = 0.4) -> Sample:
        if self._size == 0:
            raise ReplayError("cannot sample from an empty replay memory; add transitions first")
        batch_size = _positive_int(batch_size, "batch_size")
        beta = _non_negative(beta, "beta")
        if beta > 1.0:
            raise ReplayError(f"beta must lie in [0, 1], got {beta!r}")
        if self._zeros_written and not bool(self._block_sum.sum() > 0):
            raise ReplayError("cannot sample: every stored priority is zero")
        indices, scaled = self._draw(batch_size)
        weights = (scaled / self._block_min.min()).pow(-beta).to(torch.float32)
        transitions = {name: column.index_select(0, indices) for name, column in self._columns.items()}
        self._counts["samples"] += 1
        self._counts["sampled_items"] += batch_size
        if self.device.type == "cpu":  # host memory: hand out numpy views, as every host consumer expects
            return Sample(indices.numpy(), {k: v.numpy() for k, v in transitions.items()}, weights.numpy())
        return Sample(indices, transitions, weights)

    def _draw(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Stratified proportional draws: (leaf indices int64, their priority**alpha)."""
        cumulative = torch.cumsum(self._block_sum, 0)
        total = cumulative[-1]
        uniforms = torch.rand(batch_size, generator=self._generator, dtype=torch.float64, device=self.device)
        mass = (torch.arange(batch_size, dtype=torch.float64, device=self.device) + uniforms) * (total / batch_size)
        # Rounding must never carry a draw past the last positive leaf: keep it strictly below the total.
        mass = torch.minimum(mass, total * (1.0 - 1e-12))
        block = torch.searchsorted(cumulative, mass.unsqueeze(1), right=True).squeeze(1).clamp_(max=self.n_blocks - 1)
        within = (mass - (cumulative[block] - self._block_sum[block])).clamp_(min=0.0)
        rows = self._leaves.view(self.n_blocks, self.block)[block]
        row_cumulative = torch.cumsum(rows, 1)
        within = torch.minimum(within, row_cumulative[:, -1] * (1.0 - 1e-12))
        offset = torch.searchsorted(row_cumulative, within.unsqueeze(1), right=True).squeeze(1).clamp_(max=self.block - 1)
        leaf = block * self.block + offset
        return leaf, rows.gather(1, offset.unsqueeze(1)).squeeze(1)

    # -- priorities ----------------------------------------------------------------------------------
    def update_priorities(self, indices: Any, priorities: Any) -> None:
        """Set new priorities; an index repeated in one call takes the last priority given for it."""
        if priorities is None:
            raise ReplayError("update_priorities: priorities are required")
        index_tensor = _as_index_tensor(indices, self.device)
        values = self._validated_priorities(index_tensor, priorities, self._size, "update_priorities")
        self._set_priorities(index_tensor, values)
        self._counts["updates"] += 1
        self._counts["updated_items"] += len(index_tensor)

    def _validated_priorities(self, indices: torch.Tensor, priorities: Any, size: int, operation: str) -> torch.Tensor:
        """Flat float64 priorities on the device, after checking indices and values (one device sync for
        device inputs, none for numpy ones)."""
        try:
            values = torch.as_tensor(priorities if isinstance(priorities, torch.Tensor) else np.asarray(priorities, np.float64),
                                     dtype=torch.float64, device=self.device).reshape(-1)
        except (TypeError, ValueError, RuntimeError):
            raise ReplayError(f"{operation}: priorities must be numbers, got {type(priorities).__name__}") from None
        if len(values) != len(indices):
            raise ReplayError(f"{operation}: got {len(indices)} indices but {len(values)} priorities")
        if len(values):
            out_of_range = (indices < 0) | (indices >= size)
            invalid = ~(torch.isfinite(values) & (values >= 0))
            any_out, any_invalid, any_zero = torch.stack([out_of_range.any(), invalid.any(), (values == 0).any()]).tolist()
            if any_out:
                bad = int(indices[out_of_range][0])
                raise ReplayError(f"{operation}: index {bad} out of range for a memory holding {size} items")
            if any_invalid:
                raise ReplayError(f"{operation}: priority {float(values[invalid][0])} is invalid: priorities must be "
                                  "finite and >= 0")
            self._zeros_written |= any_zero
        return values

    def _set_priorities(self, indices: torch.Tensor, priorities: torch.Tensor) -> None:
        if len(priorities):
            torch.maximum(self._max_priority, priorities.max(), out=self._max_priority)
        self._set_leaves(indices, priorities.pow(self.alpha))

    def _set_leaves(self, indices: torch.Tensor, scaled: torch.Tensor) -> None:
        if not len(indices):
            return
        # Scatter with repeated indices has no defined winner on CUDA: give every copy of an index the
        # value of its last occurrence, found by a stable sort, so all writes agree.
        order = torch.sort(indices, stable=True).indices
        sorted_indices = indices[order]
        last = torch.searchsorted(sorted_indices, sorted_indices, right=True) - 1
        self._leaves[sorted_indices] = scaled[order][last]
        if len(indices) >= self.n_blocks:  # a big add touches most blocks: recomputing all is cheaper
            rows = self._leaves.view(self.n_blocks, self.block)
            self._block_sum.copy_(rows.sum(1))
            self._block_min.copy_(torch.where(rows > 0, rows, torch.inf).amin(1))
            return
        blocks = sorted_indices // self.block
        rows = self._leaves.view(self.n_blocks, self.block)[blocks]
        self._block_sum[blocks] = rows.sum(1)
        self._block_min[blocks] = torch.where(rows > 0, rows, torch.inf).amin(1)

    def priorities(self, indices: Any) -> np.ndarray:
        """The stored priorities**alpha at `indices` (float64 numpy); for tests and inspection."""
        index_tensor = _as_index_tensor(indices, self.device)
        if len(index_tensor) and bool(((index_tensor < 0) | (index_tensor >= self.capacity)).any()):
            raise ReplayError(f"indices must lie in [0, {self.capacity})")
        return self._leaves[index_tensor].cpu().numpy()

    def stats(self) -> dict[str, Any]:
        positive_min = float(self._block_min.min())
        return {
            "size": self._size,
            "capacity": self.capacity,
            "prioritized": True,
            "device": str(self.device),
            **self._counts,
            "overwritten": max(0, self._counts["adds"] - self.capacity),
            "alpha": self.alpha,
            "total_priority": float(self._block_sum.sum()),
            "min_priority": positive_min if np.isfinite(positive_min) else None,
            "max_priority_seen": float(self._max_priority),
            "tree": f"two levels: {self.n_blocks} blocks of {self.block} leaves",
            "fields": {name: f"{TORCH_TO_NAME[c.dtype]}{list(c.shape[1:])}" for name, c in self._columns.items()},
        }


# -- validation helpers -----------------------------------------------------------------------------
def _as_index_tensor(indices: Any, device: torch.device) -> torch.Tensor:
    if isinstance(indices, torch.Tensor):
        if indices.is_floating_point() or indices.dtype == torch.bool or indices.is_complex():
            raise ReplayError(f"indices must be integers, got {indices.dtype}")
        return indices.to(device=device, dtype=torch.int64).reshape(-1)
    array = np.asarray(indices)
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise ReplayError(f"indices must be integers, got {array.dtype}")
    return torch.as_tensor(array.astype(np.int64, copy=False).reshape(-1), device=device)


