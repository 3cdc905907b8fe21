"""Replay memory "fpga": PEARL's K-ary sum tree for proportional prioritized replay, on an OpenCL device.

The transitions, the sum tree and the min tree live in device buffers. Each stored transition is one
fixed-size record (the fields packed back to back, padded to 32-bit words). Only these cross the bus:
- add: one staging upload (records + raw priorities), then the insert kernel;
- sample: the sample kernel (random targets drawn on the device, descent, importance weights, row
  gather), then one download of [status, indices, weights, rows];
- update_priorities: validated and kept on the host, in call order. The next sample uploads them in
  one packed copy [indices][priorities] and its kernel applies them before it samples: a
  sample / learn / update round costs one upload, one launch and one download. Any other call
  (add, priorities, stats) first applies them with the update kernel, and so does update_priorities
  itself once PENDING_LIMIT items wait (not waited for; at most one such launch in flight).
  OpenCL calls cost 5-45 us each on PoCL, more than the kernels' work for a batch of 256.

The law is the core's (rlbench.builtin.replay): P(i) = p_i**alpha / sum p**alpha, stratified over the
batch; w_i = (N P(i))**-beta / max_j (N P(j))**-beta = (p_i / p_min)**(-alpha*beta), the maximum over
the whole memory; new items without priorities get the largest priority seen so far (starting at 1);
an index repeated in one update takes the last priority given (the kernel applies them in order);
zero priorities are never sampled. Arithmetic on the device is float32.
"""

from __future__ import annotations

import functools

from typing import Any, Mapping

import numpy as np
import pyopencl as cl

from rlbench.kit.checks import non_negative, positive_int
from rlbench.errors import RlbenchError
from rlbench.protocols import ReplayCapabilities, Sample
from rlbench_fpga import device as devices
from rlbench_fpga.program import build

MAX_NODES = 1 << 31  # int32 indices on the device
LEVEL_ALIGNMENT = 16  # nodes (64 bytes): each tree level starts on a cache line
PENDING_LIMIT = 4096  # priority updates kept on the host before update_priorities launches them


class FpgaReplayError(RlbenchError, ValueError):
    """Bad input to the fpga replay memory, or a configuration the device cannot hold."""


_positive_int = functools.partial(positive_int, error=FpgaReplayError)
_non_negative = functools.partial(non_negative, error=FpgaReplayError)


def tree_shape(capacity: int, fanout: int, depth: int | None) -> tuple[int, list[int]]:
    """(depth, level offsets) of the smallest K-ary tree with >= capacity leaves (or the given depth).
    Level l holds K**l nodes from offset l; each level starts at a multiple of LEVEL_ALIGNMENT."""
    if fanout < 2:
        raise FpgaReplayError(f"fanout must be at least 2, got {fanout}")
    needed = 1
    while fanout ** needed < capacity:
        needed += 1
    if depth is None:
        depth = needed
    elif depth < needed:
        raise FpgaReplayError(f"depth {depth} gives {fanout ** depth} leaves with fanout {fanout}, fewer than "
                              f"capacity {capacity}; use depth >= {needed}")
    offsets = [0]
    for level in range(depth):
        offsets.append(-(-(offsets[-1] + fanout ** level) // LEVEL_ALIGNMENT) * LEVEL_ALIGNMENT)
    if offsets[-1] + fanout ** depth >= MAX_NODES:
        raise FpgaReplayError(f"a {fanout}-ary tree of depth {depth} has too many nodes for 32-bit indices")
    return depth, offsets


class FpgaReplay:
    capabilities = ReplayCapabilities(prioritized=True, device="opencl")

    def __init__(self, capacity: int, *, alpha: float = 0.6, seed: int | None = None, fanout: int = 16,
                 depth: int | None = None, **ignored_options: Any) -> None:
        self.capacity = _positive_int(capacity, "capacity")
        self.alpha = _non_negative(alpha, "alpha")
        self.fanout = _positive_int(fanout, "fanout")
        self.depth, self._offsets = tree_shape(self.capacity, self.fanout, None if depth is None else _positive_int(depth, "depth"))
        self._nodes = self._offsets[-1] + self.fanout ** self.depth
        rng = np.random.default_rng(seed)
        self._key_a, self._key_b = (int(k) for k in rng.integers(0, 1 << 32, size=2, dtype=np.uint64))
        self._context, self._device, self.device_info = devices.default_context()
        self._queue = cl.CommandQueue(self._context)
        self._channels = self.device_info.channels
        internal = self._offsets[-1]  # the min tree has no leaf level: a leaf's minimum is its sum value
        self._sum = self._buffer(self._nodes * 4)
        self._least = self._buffer(internal * 4)
        cl.enqueue_fill_buffer(self._queue, self._sum, np.float32(0.0), 0, self._nodes * 4)
        cl.enqueue_fill_buffer(self._queue, self._least, np.float32(np.inf), 0, internal * 4)
        self._layout: np.dtype | None = None  # the packed record, fixed by the first add
        self._fields: dict[str, tuple[np.dtype, tuple[int, ...]]] = {}
        self._rows: Any = None
        self._program: Any = None
        self._staging: dict[str, Any] = {}  # purpose -> (device buffer, bytes)
        self._out_host: dict[int, np.ndarray] = {}
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []  # (indices, priorities) not yet uploaded
        self._pending_items = 0
        self._upload: Any = None  # the last non-blocking upload: pyopencl waits for it when released
        self._staging_buffer("update", 4096)
        self._size = self._cursor = 0
        self._max_priority = 1.0
        self._counts = {"adds": 0, "add_calls": 0, "samples": 0, "sampled_items": 0, "updates": 0, "updated_items": 0}

    def __len__(self) -> int:
        return self._size

    # -- device plumbing -------------------------------------------------------------------------------
    def _buffer(self, nbytes: int) -> Any:
        try:
            return cl.Buffer(self._context, cl.mem_flags.READ_WRITE, max(4, int(nbytes)))
        except cl.Error as error:
            raise FpgaReplayError(f"the OpenCL device cannot allocate {nbytes / 2**20:.1f} MiB "
                                  f"({error.what.routine if hasattr(error, 'what') else error})") from None

    def _staging_buffer(self, purpose: str, nbytes: int) -> Any:
        buffer, size = self._staging.get(purpose, (None, 0))
        if size < nbytes:
            size = max(nbytes, 2 * size, 4096)
            buffer = self._buffer(size)
            self._staging[purpose] = (buffer, size)
        return buffer

    def _build(self, words: int) -> None:
        defines = {"FANOUT": self.fanout, "DEPTH": self.depth, "WORDS": words,
                   "LEVEL_OFFSETS": "{" + ", ".join(map(str, self._offsets)) + "}",
                   "LEVEL_STAGES": " ".join(f"LEVEL_STAGE({level})" for level in range(self.depth))}
        if self.device_info.type == "CPU":
            defines["PREFETCH(p)"] = "__builtin_prefetch(p)"  # clang's; PoCL compiles with clang
        program = build(self._context, "sumtree.cl", defines)
        buf, i32, u32, f32 = None, np.int32, np.uint32, np.float32  # None: a cl.Buffer argument

        def kernel(name: str, *arg_types: Any) -> Any:
            # Declared scalar types let pyopencl pack the arguments itself: setting them one by one
            # costs ~10 us each on PoCL, more than the kernel launch.
            instance = cl.Kernel(program, name)  # one instance per memory: arguments are per instance
            instance.set_scalar_arg_dtypes(arg_types)
            return instance

        self._insert = kernel("sumtree_insert", buf, buf, buf, buf, i32, i32, i32, f32)
        self._update = kernel("sumtree_update", buf, buf, buf, i32, f32)
        if self._channels:
            self._producer = kernel("sumtree_sample_producer", buf, i32, u32, u32)
            self._levels = [kernel(f"sumtree_sample_level_{level}", buf, i32) for level in range(self.depth)]
            self._consumer = kernel("sumtree_sample_consumer", buf, buf, buf, buf, i32, f32)
            self._stage_queues = [cl.CommandQueue(self._context) for _ in range(self.depth + 2)]
        else:
            self._sample = kernel("sumtree_sample", buf, buf, buf, buf, i32, u32, u32, f32, buf, i32, f32)
        self._program = program

    def _upload_pending(self) -> tuple[Any, int]:
        """Enqueue one upload of the pending updates, packed [indices][priorities] in call order, not
        waited for; returns (device buffer, item count) for the kernel that applies them."""
        n = self._pending_items
        buffer = self._staging_buffer("update", 8 * n)
        if n:
            packed = np.empty(2 * n, dtype=np.int32)
            at = 0
            for indices, priorities in self._pending:
                packed[at:at + len(indices)] = indices
                packed[n + at:n + at + len(indices)] = priorities.view(np.int32)
                at += len(indices)
            if self._upload is not None:
                self._upload.wait()  # at most one upload in flight
            self._upload = cl.enqueue_copy(self._queue, buffer, packed, is_blocking=False)
            self._pending.clear()
            self._pending_items = 0
        return buffer, n

    def _apply_pending_updates(self) -> None:
        buffer, n = self._upload_pending()
        if n:
            self._update(self._queue, (1,), (1,), buffer, self._sum, self._least, n, self.alpha)

    def _finished(self) -> None:
        """After a blocking call on the queue: every upload before it is done."""
        self._upload = None

    # -- add -------------------------------------------------------------------------------------------
    def add(self, transitions: Mapping[str, np.ndarray], priorities: np.ndarray | None = None) -> np.ndarray:
        first = self._layout is None
        if first:
            self._define_layout(transitions)
        try:
            columns, n = self._validated_columns(transitions)
            raw = None if priorities is None else _validated_priorities(priorities, n)
        except FpgaReplayError:
            if first:
                self._layout, self._fields = None, {}
            raise
        if first:
            self._allocate_rows()
        indices = (self._cursor + np.arange(n, dtype=np.int64)) % self.capacity
        if n == 0:
            return indices
        keep = min(n, self.capacity)  # a batch longer than the memory keeps only its last items
        layout = self._layout
        staging = np.empty(keep * layout.itemsize + 4 * keep, dtype=np.uint8)
        records = staging[:keep * layout.itemsize].view(layout)
        for name, column in columns.items():
            records[name] = column[n - keep:]
        staged_priorities = staging[keep * layout.itemsize:].view(np.float32)
        if raw is None:
            staged_priorities[:] = self._max_priority
        else:
            staged_priorities[:] = raw[n - keep:]
            if n:
                self._max_priority = max(self._max_priority, float(raw.max()))
        start = (self._cursor + n - keep) % self.capacity
        buffer = self._staging_buffer("insert", staging.nbytes)
        self._apply_pending_updates()
        cl.enqueue_copy(self._queue, buffer, staging, is_blocking=True)
        self._insert(self._queue, (1,), (1,), buffer, self._rows, self._sum, self._least, start, keep,
                     self.capacity, self.alpha)
        self._queue.finish()
        self._finished()
        self._cursor = (self._cursor + n) % self.capacity
        self._size = min(self._size + n, self.capacity)
        self._counts["adds"] += n
        self._counts["add_calls"] += 1
        return indices

    def _define_layout(self, transitions: Mapping[str, np.ndarray]) -> None:
        if not isinstance(transitions, Mapping) or not transitions:
            raise FpgaReplayError("add() needs a non-empty dict of field name -> array with a leading batch axis")
        names, formats, offsets, fields = [], [], [], {}
        offset = 0
        for name, value in transitions.items():
            if not isinstance(name, str):
                raise FpgaReplayError(f"field names must be strings, got {name!r}")
            value = np.asarray(value)
            if value.ndim == 0:
                raise FpgaReplayError(f"field {name!r} has no leading batch axis (got a scalar); pass shape (batch, ...)")
            if value.dtype.hasobject:
                raise FpgaReplayError(f"field {name!r} has dtype object; store numeric or bool arrays")
            shape = tuple(value.shape[1:])
            names.append(name)
            formats.append((value.dtype, shape) if shape else value.dtype)
            offsets.append(offset)
            fields[name] = (value.dtype, shape)
            offset += value.dtype.itemsize * int(np.prod(shape, dtype=np.int64))
        itemsize = max(4, (offset + 3) // 4 * 4)  # whole 32-bit words: the kernels copy words
        self._layout = np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": itemsize})
        self._fields = fields

    def _allocate_rows(self) -> None:
        nbytes = self.capacity * self._layout.itemsize
        limit = self._device.max_mem_alloc_size
        if nbytes > limit:
            self._layout, self._fields = None, {}
            raise FpgaReplayError(f"{nbytes / 2**30:.2f} GiB of transitions exceed the device's largest buffer "
                                  f"({limit / 2**30:.2f} GiB); lower the capacity")
        self._rows = self._buffer(nbytes)
        self._build(self._layout.itemsize // 4)

    def _validated_columns(self, transitions: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], int]:
        if not isinstance(transitions, Mapping) or transitions.keys() != self._fields.keys():
            got = sorted(transitions) if isinstance(transitions, Mapping) else type(transitions).__name__
            raise FpgaReplayError(f"add() needs exactly the fields {sorted(self._fields)}, got {got}")
        columns, n = {}, -1
        for name, (dtype, shape) in self._fields.items():
            value = np.asarray(transitions[name])
            if value.dtype != dtype or value.ndim == 0 or value.shape[1:] != shape:
                raise FpgaReplayError(f"field {name!r}: got {value.dtype}{list(value.shape)}, but this memory stores "
                                      f"{dtype} rows of shape {list(shape)} (set by the first add)")
            if n < 0:
                n = len(value)
            elif len(value) != n:
                raise FpgaReplayError(f"fields have different batch lengths: {name!r} has {len(value)}, others {n}")
            columns[name] = value
        return columns, n

    # -- sample ----------------------------------------------------------------------------------------
    def sample(self, batch_size: int, beta: float = 0.4) -> Sample:
        if self._size == 0:
            raise FpgaReplayError("cannot sample from an empty replay memory; add transitions first")
        batch = _positive_int(batch_size, "batch_size")
        beta = _non_negative(beta, "beta")
        if beta > 1.0:
            raise FpgaReplayError(f"beta must lie in [0, 1], got {beta!r}")
        words = self._layout.itemsize // 4
        out = self._out_host.get(batch)
        if out is None:
            out = self._out_host[batch] = np.empty(1 + 2 * batch + batch * words, dtype=np.uint32)
        buffer = self._staging_buffer(f"sample-{batch}", out.nbytes)
        call = self._counts["samples"]
        key_a = (self._key_a + call * 0x9E3779B9) & 0xFFFFFFFF
        key_b = self._key_b ^ (call & 0xFFFFFFFF)
        if self._channels:
            self._sample_with_channels(buffer, out, batch, key_a, key_b, beta)
        else:
            updates, pending = self._upload_pending()  # applied by the sample kernel, before it samples
            self._sample(self._queue, (1,), (1,), self._sum, self._least, self._rows, buffer, batch, key_a, key_b,
                         beta, updates, pending, self.alpha)
            cl.enqueue_copy(self._queue, out, buffer, is_blocking=True)
        self._finished()
        if out[0] != 0:
            raise FpgaReplayError("cannot sample: every stored priority is zero")
        self._counts["samples"] += 1
        self._counts["sampled_items"] += batch
        indices = out[1:1 + batch].view(np.int32).astype(np.int64)
        weights = out[1 + batch:1 + 2 * batch].view(np.float32).copy()
        records = out[1 + 2 * batch:].view(self._layout)
        return Sample(indices, {name: records[name].copy() for name in self._fields}, weights)

    def _sample_with_channels(self, buffer: Any, out: np.ndarray, batch: int, key_a: Any, key_b: Any, beta: float) -> None:
        """Producer, level stages and consumer run concurrently, each on its own queue."""
        self._apply_pending_updates()
        self._queue.finish()  # inserts and updates land before the producer reads the tree
        self._finished()
        queues = self._stage_queues
        size = (1,)
        self._producer(queues[0], size, size, self._sum, batch, key_a, key_b)
        for level, kernel in enumerate(self._levels):
            kernel(queues[1 + level], size, size, self._sum, batch)
        self._consumer(queues[-1], size, size, self._sum, self._least, self._rows, buffer, batch, beta)
        cl.enqueue_copy(queues[-1], out, buffer, is_blocking=True)
        for queue in queues[:-1]:
            queue.finish()

    # -- priorities ------------------------------------------------------------------------------------
    def update_priorities(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        """New priorities; an index repeated in one call takes the last priority given for it."""
        index_array = _as_indices(indices)
        if priorities is None:
            raise FpgaReplayError("update_priorities: priorities are required")
        n = len(index_array)
        raw = _validated_priorities(priorities, n)
        if n:
            low, high = int(index_array.min()), int(index_array.max())
            if low < 0 or high >= self._size:
                raise FpgaReplayError(f"index {low if low < 0 else high} out of range for a memory holding {self._size} items")
        self._counts["updates"] += 1
        self._counts["updated_items"] += n
        if n == 0:
            return
        self._max_priority = max(self._max_priority, float(raw.max()))
        # Copies: the caller may reuse its arrays before the upload.
        self._pending.append((index_array.astype(np.int32), raw.copy()))
        self._pending_items += n
        if self._pending_items >= PENDING_LIMIT:
            self._apply_pending_updates()

    def priorities(self, indices: np.ndarray) -> np.ndarray:
        """The stored priorities**alpha at `indices` (float64); for tests and inspection."""
        indices = _as_indices(indices)
        self._apply_pending_updates()
        leaves = np.empty(self.fanout ** self.depth, dtype=np.float32)
        cl.enqueue_copy(self._queue, leaves, self._sum, src_offset=4 * self._offsets[-1], is_blocking=True)
        self._finished()
        return leaves[indices].astype(np.float64)

    def stats(self) -> dict[str, Any]:
        roots = np.empty(1, dtype=np.float32), np.empty(1, dtype=np.float32)
        self._apply_pending_updates()
        cl.enqueue_copy(self._queue, roots[0], self._sum, is_blocking=True)
        cl.enqueue_copy(self._queue, roots[1], self._least, is_blocking=True)
        self._finished()
        least = float(roots[1][0])
        return {
            "size": self._size, "capacity": self.capacity, "prioritized": True, **self._counts,
            "overwritten": max(0, self._counts["adds"] - self.capacity),
            "alpha": self.alpha, "fanout": self.fanout, "depth": self.depth,
            "total_priority": float(roots[0][0]), "min_priority": least if np.isfinite(least) else None,
            "max_priority_seen": self._max_priority,
            "pipeline": "intel channels" if self._channels else "single kernel, global-memory stages",
            "fields": {name: f"{dtype}{list(shape)}" for name, (dtype, shape) in self._fields.items()},
            "device": self.device_info.as_dict(),
        }


# -- validation ----------------------------------------------------------------------------------------
def _as_indices(indices: Any) -> np.ndarray:
    array = np.asarray(indices)
    if array.size and array.dtype.kind not in "iu":
        raise FpgaReplayError(f"indices must be integers, got {array.dtype}")
    return array.reshape(-1)


def _validated_priorities(priorities: Any, n: int) -> np.ndarray:
    try:
        raw = np.asarray(priorities, dtype=np.float32).reshape(-1)
    except (TypeError, ValueError):
        raise FpgaReplayError(f"priorities must be numbers, got {type(priorities).__name__}") from None
    if len(raw) != n:
        raise FpgaReplayError(f"got {n} items but {len(raw)} priorities")
    if n and not (np.isfinite(raw).all() and raw.min() >= 0.0):
        bad = raw[~(np.isfinite(raw) & (raw >= 0.0))][0]
        raise FpgaReplayError(f"priority {bad} is invalid: priorities must be finite and >= 0 (float32)")
    return raw
