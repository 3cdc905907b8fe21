"""Replay `gpu`: proportional prioritized replay whose storage and priority tree live on the device.

Same semantics as the core's `prioritized` memory: P(i) = p_i**alpha /
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

Input is checked as the core's memories check it, with the public kit (rlbench.kit.replay): the
transition layout (dtypes, row shapes, batch lengths) from tensors' metadata alone, and numpy
indices and priorities on the host before they are copied over. Device tensors of indices and
priorities are checked where they are, in one sync; only a refused update is copied to the host,
for the kit to say what is wrong with it.

Arrays given as numpy are copied to the device; torch tensors are used where they are. Samples
come back as numpy arrays when the memory is on the CPU device and as device tensors on CUDA, so
the learner's batch never crosses to the host.

Captured operations (rlbench's one-device loop replays them as CUDA graphs, many per launch):
`write` (add), `draw` (sample) and `set_priorities` (update_priorities) take and give device
tensors only, keep the write position and the size on the device, take beta as a device tensor,
and never wait for the host: what add/sample/update_priorities refuse at once (an index out of
range, a priority that is negative or not finite, a draw from a memory whose every priority is
zero) instead raises a device-side flag, and `check_flags()` reads all flags in one sync (once per
launch of K updates, not once per call) and raises the same ReplayError. An invalid priority is
stored as zero and an out-of-range index clamped, so the tree stays finite until the flag is read.
A captured call's Python runs once, at capture: the caller tells the host-side counts (len,
stats) what each launch did with `count_captured`.

Image observations (`frames=k`, as the core's memories): each distinct frame is kept once on the
device, as uint8, and obs and next_obs are rebuilt on the device by gathering frames by id, exactly as
they were added. Which frames are the same is decided on the host, byte for byte, by the public
kit's rlbench.kit.frames.FrameRing, which therefore keeps a host copy of the frames too (host RAM as
much as the device holds); the device gets each frame once, when it is first stored, into the same
slot, and the frame ids per transition live on the device, so `sample` and `draw` never go back to the
host. `write` (captured adds) stores whole rows and refuses a memory with frames.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch

from rlbench.kit import frames as frame_kit
from rlbench.kit.replay import (ReplayError, TransitionLayout, check_sample, non_negative_number, positive,
                                validated_update)
from rlbench.protocols import Sample
from rlbench_gpu.capabilities import REPLAY_CAPABILITIES, REPLAY_DTYPES, on_device
from rlbench_gpu.device import resolve_device

DTYPES = {name: getattr(torch, name) for name in REPLAY_DTYPES}  # torch.float32, ..., torch.bool
# The device-side flags of captured calls, in the order of GpuPrioritizedReplay._flags.
FLAGS = ("an index out of range for the items stored", "a priority that is negative or not finite",
         "a draw from a memory whose every priority is zero", "a zero priority was written")
BAD_INDEX, BAD_PRIORITY, NO_MASS, ZERO_WRITTEN = range(len(FLAGS))


class GpuPrioritizedReplay:
    """ReplayMemory "gpu" (see the module docstring)."""

    def __init__(self, capacity: int, *, alpha: float = 0.6, seed: int | None = None, device: Any = "cuda",
                 frames: int = 0, **ignored_options: Any) -> None:
        self.capacity = positive(capacity, "capacity")
        self.alpha = non_negative_number(alpha, "alpha")
        self.frames = frame_kit.checked_frames(frames)
        self.device = resolve_device(device)
        self.capabilities = on_device(REPLAY_CAPABILITIES, self.device.type)
        self._generator = torch.Generator(device=self.device)
        self._generator.manual_seed(seed if seed is not None else int(torch.seed() % (1 << 63)))
        self.block = 1 << max(1, (max(1, int(np.sqrt(self.capacity)))).bit_length() - 1)
        self.n_blocks = -(-self.capacity // self.block)
        f64 = dict(dtype=torch.float64, device=self.device)
        self._leaves = torch.zeros(self.n_blocks * self.block, **f64)  # priority**alpha; 0 = empty or never sampled
        self._block_sum = torch.zeros(self.n_blocks, **f64)
        self._block_min = torch.full((self.n_blocks,), torch.inf, **f64)  # over positive leaves only
        self._max_priority = torch.ones((), **f64)  # raw priority, before alpha
        # Per leaf, the position in the last update that wrote it: picks one winner among repeated indices.
        self._last_writer = torch.zeros(self.n_blocks * self.block, dtype=torch.int64, device=self.device)
        # The write position and size again, on the device, for captured writes (add keeps them equal).
        self._cursor_on_device = torch.zeros((), dtype=torch.int64, device=self.device)
        self._size_on_device = torch.zeros((), dtype=torch.int64, device=self.device)
        # Device-side refusals of captured calls, read by check_flags: see FLAGS.
        self._flags = torch.zeros(len(FLAGS), dtype=torch.bool, device=self.device)
        self._layout: TransitionLayout | None = None  # fixed by the first add
        self._columns: dict[str, torch.Tensor] = {}  # with frames: every field but obs and next_obs
        # With frames: the host's ring (which frames are the same, and their slots), the frames on the
        # device by slot, and each position's frame ids on the device.
        self._frame_ring: frame_kit.FrameRing | None = None
        self._device_frames: torch.Tensor | None = None
        self._device_ids: dict[str, torch.Tensor] = {}
        self._size = 0
        self._cursor = 0
        self._zeros_written = False  # only then can the total mass be zero: sample checks it (a device sync)
        self._counts = dict(adds=0, add_calls=0, samples=0, sampled_items=0, updates=0, updated_items=0)

    def __len__(self) -> int:
        return self._size

    # -- add -----------------------------------------------------------------------------------------
    def add(self, transitions: Mapping[str, Any], priorities: Any = None) -> np.ndarray:
        """Store a batch (leading axis = items); returns the indices written (numpy int64)."""
        first = self._layout is None
        layout = TransitionLayout.of(transitions, dtypes=REPLAY_DTYPES) if first else self._layout
        rows, n = layout.validate(transitions)  # shapes and dtypes only: device tensors stay where they are
        indices = np.arange(self._cursor, self._cursor + n, dtype=np.int64) % self.capacity
        new_size = min(self._size + n, self.capacity)
        if priorities is None:
            device_indices = torch.as_tensor(indices, device=self.device)
        else:
            device_indices, device_priorities = self._validated_update(indices, priorities, new_size, "add")
        if first:
            self._allocate(layout)  # only a batch that passed every check fixes the layout
        if self._frame_ring is not None:
            try:
                self._write_frames(rows, n, indices)  # the one step that can still fail (out of memory)
            except ReplayError:
                if first:
                    self._layout, self._columns, self._frame_ring, self._device_frames = None, {}, None, None
                raise
        self._write_rows(rows, n)
        self._size = new_size
        if priorities is None:
            self._set_leaves(device_indices, self._max_priority.expand(n) ** self.alpha)
        else:
            self._set_priorities(device_indices, device_priorities)
        self._counts["adds"] += n
        self._counts["add_calls"] += 1
        self._cursor_on_device.fill_(self._cursor)
        self._size_on_device.fill_(self._size)
        return indices

    def _allocate(self, layout: TransitionLayout) -> None:
        columns = {}
        if self.frames:
            self._frame_ring = frame_kit.FrameRing.of_layout(layout, self.capacity, self.frames)
            self._device_ids = {name: torch.zeros((self.capacity, self.frames), dtype=torch.int64, device=self.device)
                                for name in frame_kit.FRAME_FIELDS}
            self._device_frames = self._frames_tensor(self._frame_ring.store.slots)
            self._frame_ring.store.on_grow = self._grow_device_frames
        for name, field in layout.fields.items():
            if self.frames and name in frame_kit.FRAME_FIELDS:
                continue
            try:
                columns[name] = torch.zeros((self.capacity, *field.shape), dtype=DTYPES[field.dtype], device=self.device)
            except (RuntimeError, MemoryError):  # torch.OutOfMemoryError is a RuntimeError
                gib = self.capacity * field.nbytes / 2**30
                raise ReplayError(f"cannot allocate {gib:.2f} GiB on {self.device} for field {name!r} "
                                  f"at capacity {self.capacity}") from None
        self._layout, self._columns = layout, columns

    def _frames_tensor(self, slots: int) -> torch.Tensor:
        store = self._frame_ring.store
        try:
            return torch.empty((slots, *store.frame_shape), dtype=DTYPES[store.dtype.name], device=self.device)
        except (RuntimeError, MemoryError):
            raise ReplayError(f"cannot allocate {slots * store.frame_bytes / 2**30:.2f} GiB on {self.device} for "
                              f"{slots:,} frames") from None

    def _grow_device_frames(self, slots: int) -> None:
        """The host store is about to grow: so does its copy on the device (first, so that a device out of
        memory refuses the add before the host changes)."""
        grown = self._frames_tensor(slots)
        grown[:len(self._device_frames)].copy_(self._device_frames)
        self._device_frames = grown

    def _write_frames(self, rows: list[Any], n: int, indices: np.ndarray) -> None:
        """obs and next_obs of the rows kept: the host ring decides which frames are new (byte-exact);
        only those are copied to the device, into the slots the ring gave them."""
        keep = min(n, self.capacity)
        positions = indices[n - keep:]
        names = list(self._layout.fields)
        given = [rows[names.index(name)][n - keep:] for name in frame_kit.FRAME_FIELDS]
        ring = self._frame_ring
        fresh = ring.write(positions, _on_host(given[0]), _on_host(given[1]), self._size)
        ids = np.concatenate([ring.obs_ids[positions].reshape(-1), ring.next_ids[positions].reshape(-1)])
        new = np.flatnonzero(fresh)
        if len(new):
            frames = [value if isinstance(value, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(value))
                      for value in given]
            frames = torch.cat([frame.reshape(-1, *ring.frame_shape) for frame in frames])
            self._device_frames.index_copy_(0, torch.as_tensor(ids[new].astype(np.int64), device=self.device),
                                            frames[torch.as_tensor(new, device=frames.device)].to(self.device))
        device_positions = torch.as_tensor(positions, device=self.device)
        for name, table in ((frame_kit.FRAME_FIELDS[0], ring.obs_ids), (frame_kit.FRAME_FIELDS[1], ring.next_ids)):
            self._device_ids[name].index_copy_(0, device_positions,
                                               torch.as_tensor(table[positions], device=self.device).long())

    def _rows_at(self, indices: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every field's rows at `indices` (device tensors), obs and next_obs gathered from frames."""
        if self._frame_ring is None:
            return {name: column.index_select(0, indices) for name, column in self._columns.items()}
        shape = (len(indices), *self._frame_ring.obs_shape)
        return {name: (self._device_frames[self._device_ids[name][indices]].reshape(shape) if name in self._device_ids
                       else self._columns[name].index_select(0, indices)) for name in self._layout.fields}

    def _write_rows(self, rows: list[Any], n: int) -> None:
        if self._frame_ring is not None:  # obs and next_obs are written (as frames)
            rows = [row for name, row in zip(self._layout.fields, rows) if name not in frame_kit.FRAME_FIELDS]
        keep = min(n, self.capacity)  # a batch longer than the memory keeps only its last items
        first = (self._cursor + n - keep) % self.capacity
        split = min(keep, self.capacity - first)
        for column, row in zip(self._columns.values(), rows):
            value = (row if isinstance(row, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(row)))[n - keep:]
            column[first:first + split].copy_(value[:split], non_blocking=True)
            if split < keep:
                column[:keep - split].copy_(value[split:], non_blocking=True)
        self._cursor = (self._cursor + n) % self.capacity

    # -- sample --------------------------------------------------------------------------------------
    def sample(self, batch_size: int, beta: float = 0.4) -> Sample:
        batch_size, beta = check_sample(batch_size, beta, self._size)
        if self._zeros_written and not bool(self._block_sum.sum() > 0):
            raise ReplayError("cannot sample: every stored priority is zero")
        indices, scaled = self._draw(batch_size)
        weights = (scaled / self._block_min.min()).pow(-beta).to(torch.float32)
        transitions = self._rows_at(indices)
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

    # -- captured operations (see the module docstring) ------------------------------------------------
    @property
    def generator(self) -> torch.Generator:
        """The device generator of draws; a CUDA graph that captures draws must register it."""
        return self._generator

    def write(self, transitions: Mapping[str, torch.Tensor]) -> None:
        """add() of device tensors, capturable: written at the device-side position, new items at the
        largest priority seen so far. Only shapes and dtypes are checked (on the host, from metadata)."""
        if self.frames:
            raise ReplayError("write (captured adds) stores whole rows: a memory with frames=k takes add()")
        if self._layout is None:
            self._allocate(TransitionLayout.of(transitions, dtypes=REPLAY_DTYPES))
        rows, n = self._layout.validate(transitions)
        if n > self.capacity:
            raise ReplayError(f"write: {n} items do not fit a memory of capacity {self.capacity}")
        positions = (self._cursor_on_device + torch.arange(n, device=self.device)) % self.capacity
        for column, row in zip(self._columns.values(), rows):
            column.index_copy_(0, positions, row)
        self._set_leaves(positions, self._max_priority.expand(n) ** self.alpha, distinct=True)
        self._cursor_on_device.add_(n).remainder_(self.capacity)
        self._size_on_device.add_(n).clamp_(max=self.capacity)

    def draw(self, batch_size: int, beta: torch.Tensor) -> Sample:
        """sample() as device tensors on every device, capturable: beta is a 0-dim device tensor (one
        graph serves an annealed beta); a memory without positive priorities raises a device flag."""
        batch_size = positive(batch_size, "batch_size")
        if self._layout is None:
            raise ReplayError("cannot draw from an empty memory")
        self._flags[NO_MASS] |= ~(self._block_sum.sum() > 0)
        indices, scaled = self._draw(batch_size)
        weights = (scaled / self._block_min.min()).pow(-beta.to(torch.float64)).to(torch.float32)
        return Sample(indices, self._rows_at(indices), weights)

    def set_priorities(self, indices: torch.Tensor, priorities: torch.Tensor) -> None:
        """update_priorities() of device tensors, capturable: refusals become device flags (see check_flags)."""
        indices, values = indices.reshape(-1), priorities.reshape(-1).to(torch.float64)
        if len(values) != len(indices):
            raise ReplayError(f"set_priorities: got {len(indices)} indices but {len(values)} priorities")
        in_range = (indices >= 0) & (indices < self._size_on_device)
        valid = torch.isfinite(values) & (values >= 0)
        raised = torch.stack((~in_range.all(), ~valid.all(), self._flags[NO_MASS], (values == 0).any()))
        self._flags.logical_or_(raised)
        self._set_priorities(indices.clamp(0, self.capacity - 1), torch.where(valid & in_range, values, 0.0))

    def check_flags(self) -> None:
        """Read the captured calls' flags in one sync; a raised flag is a ReplayError, as the call
        would have raised at once outside a capture."""
        raised = self._flags.tolist()
        self._zeros_written |= raised[ZERO_WRITTEN]
        errors = [FLAGS[i] for i, flag in enumerate(raised) if flag and i != ZERO_WRITTEN]
        if errors:
            self._flags[:ZERO_WRITTEN] = False
            raise ReplayError(f"captured replay calls were refused: {'; '.join(errors)}")

    def count_captured(self, *, added: int = 0, samples: int = 0, sampled_items: int = 0, updates: int = 0,
                       updated_items: int = 0) -> None:
        """Tell the host-side counts (len, stats) what launched captured calls did on the device."""
        self._cursor = (self._cursor + added) % self.capacity
        self._size = min(self._size + added, self.capacity)
        for key, n in (("adds", added), ("samples", samples), ("sampled_items", sampled_items), ("updates", updates),
                       ("updated_items", updated_items)):
            self._counts[key] += n

    # -- priorities ----------------------------------------------------------------------------------
    def update_priorities(self, indices: Any, priorities: Any) -> None:
        """Set new priorities; an index repeated in one call takes the last priority given for it."""
        index_tensor, values = self._validated_update(indices, priorities, self._size, "update_priorities")
        self._set_priorities(index_tensor, values)
        self._counts["updates"] += 1
        self._counts["updated_items"] += len(index_tensor)

    def _validated_update(self, indices: Any, priorities: Any, size: int, operation: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Flat int64 indices and float64 priorities on the device, after the kit's checks (indices in
        [0, size), priorities finite and >= 0)."""
        if priorities is None:
            raise ReplayError(f"{operation}: priorities are required")
        checked = None
        if isinstance(indices, torch.Tensor) or isinstance(priorities, torch.Tensor):
            checked = self._checked_on_device(indices, priorities, size)
        if checked is None:  # numpy input, or a refused update: the kit checks on the host and words the refusal
            try:
                index_array, priority_array = validated_update(_on_host(indices), _on_host(priorities), size)
            except ReplayError as error:
                raise ReplayError(f"{operation}: {error}") from None
            self._zeros_written |= bool((priority_array == 0).any())
            checked = (torch.as_tensor(index_array, device=self.device), torch.as_tensor(priority_array, device=self.device))
        return checked

    def _checked_on_device(self, indices: Any, priorities: Any, size: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The kit's update checks, on the device in one sync, for tensors the host should not see;
        None when the update is refused (or is not numbers torch takes), for the kit to say why."""
        try:
            index_tensor = torch.as_tensor(indices, device=self.device).reshape(-1)
            values = torch.as_tensor(priorities, device=self.device).to(torch.float64).reshape(-1)
        except (TypeError, ValueError, RuntimeError):
            return None
        if index_tensor.is_floating_point() or index_tensor.is_complex() or index_tensor.dtype == torch.bool \
                or len(values) != len(index_tensor):
            return None
        if len(values):
            out_of_range = ((index_tensor < 0) | (index_tensor >= size)).any()
            invalid = (~(torch.isfinite(values) & (values >= 0))).any()
            refused, any_zero = torch.stack([out_of_range | invalid, (values == 0).any()]).tolist()
            if refused:
                return None
            self._zeros_written |= any_zero
        return index_tensor.to(torch.int64), values

    def _set_priorities(self, indices: torch.Tensor, priorities: torch.Tensor) -> None:
        if len(priorities):
            torch.maximum(self._max_priority, priorities.max(), out=self._max_priority)
        self._set_leaves(indices, priorities.pow(self.alpha))

    def _set_leaves(self, indices: torch.Tensor, scaled: torch.Tensor, distinct: bool = False) -> None:
        if not len(indices):
            return
        if distinct:  # a write's positions: no index repeats
            self._leaves.index_copy_(0, indices, scaled)
        else:
            # Scatter with repeated indices has no defined winner on CUDA: every copy of an index takes
            # the value of its last occurrence (the largest position writing it), so all writes agree.
            positions = torch.arange(len(indices), device=self.device)
            self._last_writer.scatter_reduce_(0, indices, positions, reduce="amax", include_self=False)
            self._leaves[indices] = scaled[self._last_writer[indices]]
        if len(indices) >= self.n_blocks:  # a big add touches most blocks: recomputing all is cheaper
            rows = self._leaves.view(self.n_blocks, self.block)
            self._block_sum.copy_(rows.sum(1))
            self._block_min.copy_(torch.where(rows > 0, rows, torch.inf).amin(1))
            return
        blocks = indices // self.block
        rows = self._leaves.view(self.n_blocks, self.block)[blocks]
        self._block_sum[blocks] = rows.sum(1)
        self._block_min[blocks] = torch.where(rows > 0, rows, torch.inf).amin(1)

    def priorities(self, indices: Any) -> np.ndarray:
        """The stored priorities**alpha at `indices` (float64 numpy); for tests and inspection."""
        index_array = np.asarray(_on_host(indices)).reshape(-1)
        if index_array.size and (not np.issubdtype(index_array.dtype, np.integer) or index_array.min() < 0
                                 or index_array.max() >= self.capacity):
            raise ReplayError(f"indices must be integers in [0, {self.capacity})")
        return self._leaves[torch.as_tensor(index_array, device=self.device)].cpu().numpy()

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
            "fields": self._layout.describe() if self._layout else {},
            **({"frames": {**self._frame_ring.stats(self._size), "device_frame_slots": len(self._device_frames)}}
               if self._frame_ring is not None else {}),
        }


def _on_host(value: Any) -> Any:
    """A tensor's values as numpy (a copy from the device); anything else as it is."""
    return value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else value
