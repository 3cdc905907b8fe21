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

The law is the core's (its `prioritized` memory): P(i) = p_i**alpha / sum p**alpha, stratified over the
batch; w_i = (N P(i))**-beta / max_j (N P(j))**-beta = (p_i / p_min)**(-alpha*beta), the maximum over
the whole memory; new items without priorities get the largest priority seen so far (starting at 1);
an index repeated in one update takes the last priority given (the kernel applies them in order);
zero priorities are never sampled. Arithmetic on the device is float32. Input is checked by the
public kit (rlbench.kit.replay), as in the core's memories, before anything reaches the device.

Image observations are stored whole, in each record, like any field (capabilities.frames is False):
an Atari transition is a 56 KB record, so 1 M of them would need 56 GB of device memory. Asked to
store frames once (`frames=k`), the memory refuses at once, naming the memories that do.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pyopencl as cl

from rlbench.kit.replay import (ReplayError, TransitionLayout, check_sample, non_negative_number, positive,
                                validated_update)
from rlbench.protocols import Sample
from rlbench_fpga import device as devices
from rlbench_fpga.capabilities import REPLAY_CAPABILITIES
from rlbench_fpga.program import build

MAX_NODES = 1 << 31  # int32 indices on the device
LEVEL_ALIGNMENT = 16  # nodes (64 bytes): each tree level starts on a cache line
PENDING_LIMIT = 4096  # priority updates kept on the host before update_priorities launches them


def tree_shape(capacity: int, fanout: int, depth: int | None) -> tuple[int, list[int]]:
    """(depth, level offsets) of the smallest K-ary tree with >= capacity leaves (or the given depth).
    Level l holds K**l nodes from offset l; each level starts at a multiple of LEVEL_ALIGNMENT."""
    if fanout < 2:
        raise ReplayError(f"fanout must be at least 2, got {fanout}")
    needed = 1
    while fanout ** needed < capacity:
        needed += 1
    if depth is None:
        depth = needed
    elif depth < needed:
        raise ReplayError(f"depth {depth} gives {fanout ** depth} leaves with fanout {fanout}, fewer than "
                          f"capacity {capacity}; use depth >= {needed}")
    offsets = [0]
    for level in range(depth):
        offsets.append(-(-(offsets[-1] + fanout ** level) // LEVEL_ALIGNMENT) * LEVEL_ALIGNMENT)
    if offsets[-1] + fanout ** depth >= MAX_NODES:
        raise ReplayError(f"a {fanout}-ary tree of depth {depth} has too many nodes for 32-bit indices")
    return depth, offsets


class FpgaReplay:
    capabilities = REPLAY_CAPABILITIES

    def __init__(self, capacity: int, *, alpha: float = 0.6, seed: int | None = None, fanout: int = 16,
                 depth: int | None = None, frames: int = 0, **ignored_options: Any) -> None:
        if frames:
            raise ReplayError(f"replay fpga stores each transition whole as one device record (PEARL's layout), not "
                              f"frames once (frames={frames}): use --replay prioritized or uniform (or gpu)")
        self.capacity = positive(capacity, "capacity")
        self.alpha = non_negative_number(alpha, "alpha")
        self.fanout = positive(fanout, "fanout")
        self.depth, self._offsets = tree_shape(self.capacity, self.fanout, None if depth is None else positive(depth, "depth"))
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
        self._layout: TransitionLayout | None = None  # fixed by the first add
        self._record: np.dtype | None = None  # the layout as one packed record
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

    @property
    def record_bytes(self) -> int:
        """Bytes of one stored transition on the device (fields packed, padded to 32-bit words); 0
        before the first add."""
        return 0 if self._record is None else self._record.itemsize

    # -- device plumbing -------------------------------------------------------------------------------
    def _buffer(self, nbytes: int) -> Any:
        try:
            return cl.Buffer(self._context, cl.mem_flags.READ_WRITE, max(4, int(nbytes)))
        except cl.Error as error:
            raise ReplayError(f"the OpenCL device cannot allocate {nbytes / 2**20:.1f} MiB "
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
        layout = TransitionLayout.of(transitions) if first else self._layout
        columns, n = layout.validate(transitions)
        indices = (self._cursor + np.arange(n, dtype=np.int64)) % self.capacity
        raw = None
        if priorities is not None:
            raw = _as_float32(validated_update(indices, priorities, min(self._size + n, self.capacity))[1])
        if first:
            self._allocate_rows(layout)  # only a batch that passed every check fixes the layout
        if n == 0:
            return indices
        keep = min(n, self.capacity)  # a batch longer than the memory keeps only its last items
        record = self._record
        staging = np.empty(keep * record.itemsize + 4 * keep, dtype=np.uint8)
        records = staging[:keep * record.itemsize].view(record)
        for name, column in zip(self._layout.fields, columns):
            records[name] = column[n - keep:]
        staged_priorities = staging[keep * record.itemsize:].view(np.float32)
        if raw is None:
            staged_priorities[:] = self._max_priority
        else:
            staged_priorities[:] = raw[n - keep:]
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

    def _allocate_rows(self, layout: TransitionLayout) -> None:
        record = _packed_record(layout)
        nbytes = self.capacity * record.itemsize
        limit = self._device.max_mem_alloc_size
        if nbytes > limit:
            raise ReplayError(f"{nbytes / 2**30:.2f} GiB of transitions exceed the device's largest buffer "
                              f"({limit / 2**30:.2f} GiB); lower the capacity")
        self._rows = self._buffer(nbytes)
        self._build(record.itemsize // 4)
        self._layout, self._record = layout, record

    # -- sample ----------------------------------------------------------------------------------------
    def sample(self, batch_size: int, beta: float = 0.4) -> Sample:
        batch, beta = check_sample(batch_size, beta, self._size)
        words = self._record.itemsize // 4
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
            raise ReplayError("cannot sample: every stored priority is zero")
        self._counts["samples"] += 1
        self._counts["sampled_items"] += batch
        indices = out[1:1 + batch].view(np.int32).astype(np.int64)
        weights = out[1 + batch:1 + 2 * batch].view(np.float32).copy()
        records = out[1 + 2 * batch:].view(self._record)
        return Sample(indices, {name: records[name].copy() for name in self._layout.fields}, weights)

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
        index_array, priority_array = validated_update(indices, priorities, self._size)
        raw = _as_float32(priority_array)
        n = len(index_array)
        self._counts["updates"] += 1
        self._counts["updated_items"] += n
        if n == 0:
            return
        self._max_priority = max(self._max_priority, float(raw.max()))
        self._pending.append((index_array.astype(np.int32), raw))  # new arrays: the caller may reuse its own
        self._pending_items += n
        if self._pending_items >= PENDING_LIMIT:
            self._apply_pending_updates()

    def priorities(self, indices: np.ndarray) -> np.ndarray:
        """The stored priorities**alpha at `indices` (float64); for tests and inspection."""
        indices = np.asarray(indices).reshape(-1)
        if indices.size and not np.issubdtype(indices.dtype, np.integer):
            raise ReplayError(f"indices must be integers, got {indices.dtype}")
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
            "fields": self._layout.describe() if self._layout else {},
            "device": self.device_info.as_dict(),
        }


def _packed_record(layout: TransitionLayout) -> np.dtype:
    """The layout as one record: fields back to back, padded to whole 32-bit words (the kernels copy words)."""
    names, formats, offsets = [], [], []
    offset = 0
    for name, field in layout.fields.items():
        names.append(name)
        formats.append((field.dtype, field.shape) if field.shape else field.dtype)
        offsets.append(offset)
        offset += field.nbytes
    return np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": max(4, (offset + 3) // 4 * 4)})


def _as_float32(priorities: np.ndarray) -> np.ndarray:
    """Checked priorities (finite, >= 0) as the float32 the device stores; one beyond float32's range
    is refused rather than stored as infinity."""
    with np.errstate(over="ignore"):
        raw = priorities.astype(np.float32)
    if len(raw) and not np.isfinite(raw.max()):
        bad = priorities[~np.isfinite(raw)][0]
        raise ReplayError(f"priority {bad} is invalid: the device stores float32 priorities, at most "
                          f"{float(np.finfo(np.float32).max):.4g}")
    return raw
