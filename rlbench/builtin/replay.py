"""The core's replay memories: a uniform FIFO ring and proportional prioritized replay.

Both store transitions in one preallocated numpy array per field, created on the first `add` from
that batch's dtypes and trailing shapes; later batches must match exactly. When full, the oldest
items are overwritten (FIFO). Sampling is with replacement and uses a seeded numpy Generator, so a
run with the same seed and the same calls samples the same items.

Prioritized replay is proportional (Schaul et al. 2016): P(i) = p_i**alpha / sum_j p_j**alpha,
stratified over the batch (item k falls in the k-th of batch_size equal segments of the total
mass), importance weights w_i = (N P(i))**-beta / max_j (N P(j))**-beta, the maximum taken over
the whole memory as in OpenAI baselines. New items get the given priorities or, without them, the
largest priority seen so far (in `add` or `update_priorities`; it starts at 1.0). In
`update_priorities`, an index repeated within one call takes the LAST priority given for it.
Zero priorities are allowed: such items are never sampled and do not take part in the
normalisation. The sum/min tree is C (`rlbench/_native/sumtree.c`); see there for its layout.

Image observations (`frames=k`, ReplayCapabilities.frames): obs and next_obs are k frames stacked on
axis 0 (k = 1: the observation is one frame). Each distinct frame is kept once, in a
rlbench.kit.frames.FrameRing (a C store of frames shared only when their bytes are equal, with
reference counts, and per transition the ids of its obs and next_obs frames); `sample` rebuilds the
stacks exactly as they were added, whatever the order of the adds (several envs interleaved, actors'
chunks, episode ends and resets anywhere). A stream adds about one frame per transition: 1 M Atari
transitions hold ~1 M frames of 84x84 (7.06 GB) instead of 8 M. Overwriting a transition releases its
frames; a frame nothing refers to any more frees its slot. `add_packed` takes a batch whose
observations come packed (rlbench.kit.frames.pack: each frame once, as a message can carry them). A
checkpoint (`state_dict`) holds each frame still referred to once. Everything else is as without
frames: priorities are per transition.

Neither memory is thread-safe: one owner (the learner or the replay server) calls it.

`native_handle()` gives the replay node's native fast path (rlbench/_native/wire.c) what it works
on: the memory itself, whose ring (_size, _cursor, _columns and the counters) it reads and writes by
these names exactly as add / sample / update_priorities do, its generator and its sum tree (whose
update and sampling code it calls). Only these two classes have one, and only without frames (whose
obs and next_obs are not columns): a subclass may change any of those methods.
tests/test_fast_path.py checks that both paths store and sample the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from rlbench.kit import frames as frame_kit
from rlbench.kit.replay import (ReplayError, TransitionLayout, as_update_arrays, check_sample, non_negative_number,
                                positive, validated_update)
from rlbench.builtin import capabilities as caps
from rlbench.protocols import Probe, Sample

FRAME_FIELDS = frame_kit.FRAME_FIELDS
BUILD_HINT = "build it with `pip install -e .` (needs gcc and the Python headers) or `python setup.py build_ext --inplace`"


def probe_native() -> Probe:
    """Whether the C sum tree behind PrioritizedReplay is built."""
    try:
        from rlbench import _sumtree
    except ImportError as exc:
        return Probe.missing(f"C extension rlbench._sumtree is not built ({exc}); {BUILD_HINT}")
    if not hasattr(_sumtree, "SumTree"):
        return Probe.missing(f"rlbench._sumtree is an old placeholder build; {BUILD_HINT}")
    return Probe.ok(f"C sum/min tree, {_sumtree.ARITY}-ary")


@dataclass(frozen=True)
class NativeHandle:
    memory: "UniformReplay"
    rng: np.random.Generator
    tree: Any  # rlbench._sumtree.SumTree; None for uniform replay


class UniformReplay:
    """FIFO ring of numpy arrays, uniform sampling; importance weights are all ones."""

    capabilities = caps.UNIFORM

    def __init__(self, capacity: int, *, alpha: float = 0.6, seed: int | None = None, frames: int = 0,
                 **ignored_options: Any) -> None:
        self.capacity = positive(capacity, "capacity")
        self.alpha = non_negative_number(alpha, "alpha")
        self.frames = frame_kit.checked_frames(frames)
        self._rng = np.random.default_rng(seed)
        self._layout: TransitionLayout | None = None
        self._columns: dict[str, np.ndarray] = {}  # with frames: every field but obs and next_obs
        self._frame_ring: frame_kit.FrameRing | None = None  # with frames: obs and next_obs
        self._size = 0
        self._cursor = 0  # the slot the next item goes to
        self._adds = self._add_calls = 0
        self._samples = self._sampled_items = 0
        self._updates = self._updated_items = 0

    def __len__(self) -> int:
        return self._size

    # -- add -------------------------------------------------------------------------------------
    def add(self, transitions: Mapping[str, np.ndarray], priorities: np.ndarray | None = None) -> np.ndarray:
        """Store a batch (leading axis = items); returns the indices written."""
        return self._add(transitions, priorities, None)

    def add_packed(self, transitions: Mapping[str, np.ndarray], frames: np.ndarray, obs_refs: np.ndarray,
                   next_refs: np.ndarray, priorities: np.ndarray | None = None) -> np.ndarray:
        """`add` of a batch whose obs and next_obs come packed (rlbench.kit.frames.pack: frames (m,
        *frame_shape), obs_refs and next_refs (n, k) ints into them); `transitions` holds the other
        fields. Each frame given is looked up once, and no stack is built. Needs frames=k."""
        if not self.frames:
            raise ReplayError("add_packed needs a memory built with frames=k (this one stores obs and next_obs whole)")
        frames = np.asarray(frames)
        obs_refs, next_refs = np.asarray(obs_refs), np.asarray(next_refs)
        k = self.frames
        if obs_refs.ndim != 2 or obs_refs.shape[1] != k or next_refs.shape != obs_refs.shape:
            raise ReplayError(f"obs_refs {list(obs_refs.shape)} and next_refs {list(next_refs.shape)} must both be "
                              f"(n, {k}) for frames={k}")
        if not (np.issubdtype(obs_refs.dtype, np.integer) and np.issubdtype(next_refs.dtype, np.integer)):
            raise ReplayError(f"frame refs must be integers, got {obs_refs.dtype} and {next_refs.dtype}")
        if frames.ndim < 2 and k > 1 or frames.ndim < 1:
            raise ReplayError(f"frames must be an array (m, *frame_shape), got shape {list(frames.shape)}")
        if obs_refs.size and (min(obs_refs.min(), next_refs.min()) < 0
                              or max(obs_refs.max(), next_refs.max()) >= len(frames)):
            raise ReplayError(f"frame refs must lie in [0, {len(frames)}): the packed batch holds {len(frames)} frames")
        if isinstance(transitions, Mapping) and set(FRAME_FIELDS) & set(transitions):
            raise ReplayError("add_packed: obs and next_obs come packed (frames and refs), not in `transitions`")
        obs_shape = (k, *frames.shape[1:]) if k > 1 else frames.shape[1:]
        # Stand-ins of the stacks' shape and dtype (no memory): the layout checks them as it checks any batch.
        stand_in = np.broadcast_to(np.zeros((), dtype=frames.dtype), (len(obs_refs), *obs_shape))
        batch = {**transitions, "obs": stand_in, "next_obs": stand_in} if isinstance(transitions, Mapping) else transitions
        return self._add(batch, priorities, (frames, obs_refs.astype(np.int32), next_refs.astype(np.int32)))

    def _add(self, transitions: Mapping[str, np.ndarray], priorities: Any, packed: tuple | None) -> np.ndarray:
        first = self._layout is None
        if first:
            self._allocate(transitions)
        try:
            rows, n = self._layout.validate(transitions)
            indices = np.arange(self._cursor, self._cursor + n, dtype=np.int64)
            if self._cursor + n > self.capacity:
                indices %= self.capacity
            new_size = min(self._size + n, self.capacity)
            if self._frame_ring is not None:
                # Frames first (the one step that can run out of memory; it then keeps nothing), so
                # the priorities are checked before them and written after.
                if priorities is not None:
                    validated_update(indices, priorities, new_size)
                self._write_frames(rows, n, indices, packed)
            self._set_new_priorities(indices, priorities, new_size)  # validates: nothing is written on error
        except ReplayError:
            if first:  # a refused first batch does not fix the layout
                self._layout, self._columns, self._frame_ring = None, {}, None
            raise
        self._write_rows(rows, n)
        self._size = new_size
        self._adds += n
        self._add_calls += 1
        return indices

    def _set_new_priorities(self, indices: np.ndarray, priorities: Any, new_size: int) -> None:
        if priorities is not None:
            validated_update(indices, priorities, new_size)

    def _allocate(self, transitions: Mapping[str, np.ndarray]) -> None:
        layout = TransitionLayout.of(transitions)
        ring = frame_kit.FrameRing.of_layout(layout, self.capacity, self.frames) if self.frames else None
        columns = {}
        for name, field in layout.fields.items():
            if ring is not None and name in FRAME_FIELDS:
                continue
            try:
                columns[name] = np.zeros((self.capacity, *field.shape), dtype=field.dtype)
            except MemoryError:
                gib = self.capacity * field.nbytes / 2**30
                raise ReplayError(f"cannot allocate {gib:.1f} GiB for field {name!r} at capacity {self.capacity}") from None
        self._layout, self._columns, self._frame_ring = layout, columns, ring

    def _write_frames(self, rows: list[Any], n: int, indices: np.ndarray, packed: tuple | None) -> None:
        """obs and next_obs of the rows kept (a batch longer than the memory keeps its last items)."""
        keep = min(n, self.capacity)
        positions = indices[n - keep:]
        ring = self._frame_ring
        if packed is None:
            names = list(self._layout.fields)
            obs, next_obs = rows[names.index("obs")], rows[names.index("next_obs")]
            ring.write(positions, obs[n - keep:], next_obs[n - keep:], self._size)
        else:
            frames, obs_refs, next_refs = packed
            ring.write_packed(positions, frames, obs_refs[n - keep:], next_refs[n - keep:], self._size)

    def _write_rows(self, rows: list[np.ndarray], n: int) -> None:
        if self._frame_ring is not None:  # obs and next_obs are written (as frames)
            rows = [row for name, row in zip(self._layout.fields, rows) if name not in FRAME_FIELDS]
        capacity = self.capacity
        keep = min(n, capacity)  # a batch longer than the memory keeps only its last items
        first = (self._cursor + n - keep) % capacity
        end = first + keep
        for column, value in zip(self._columns.values(), rows):
            if keep < n:
                value = value[n - keep:]
            if end <= capacity:
                column[first:end] = value
            else:
                split = capacity - first
                column[first:] = value[:split]
                column[:end - capacity] = value[split:]
        self._cursor = (self._cursor + n) % capacity

    # -- sample ----------------------------------------------------------------------------------
    def sample(self, batch_size: int, beta: float = 0.4) -> Sample:
        batch_size, beta = self._check_sample(batch_size, beta)
        indices = self._rng.integers(0, self._size, batch_size, dtype=np.int64)
        return Sample(indices, self._gather(indices), np.ones(batch_size, dtype=np.float32))

    def _check_sample(self, batch_size: int, beta: float) -> tuple[int, float]:
        batch_size, beta = check_sample(batch_size, beta, self._size)
        self._samples += 1
        self._sampled_items += batch_size
        return batch_size, beta

    def _gather(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        if self._frame_ring is None:
            return {name: column.take(indices, axis=0) for name, column in self._columns.items()}
        stacks = dict(zip(FRAME_FIELDS, self._frame_ring.read(indices)))
        return {name: stacks[name] if name in stacks else self._columns[name].take(indices, axis=0)
                for name in self._layout.fields}

    # -- priorities ------------------------------------------------------------------------------
    def update_priorities(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        """Accepted and ignored (after validation): uniform sampling has no priorities."""
        self._updated_items += len(validated_update(indices, priorities, self._size)[0])
        self._updates += 1

    def priority_mass(self) -> tuple[float, float]:
        """(the sum of priorities**alpha, the smallest non-zero one): what a sharded run's learner weighs
        shards by (rlbench/runtime/distributed/shards.py). Uniform: every item counts 1."""
        return float(self._size), 1.0

    # -- checkpoints ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything that makes this memory again, as numpy arrays and JSON-able values (a run's
        checkpoint stores it; `load_state_dict` restores it into a memory of the same capacity).
        With frames, each frame still referred to once (a copy: the memory's frames again, while it
        is written) and each transition's frame ids."""
        arrays = {f"column.{name}": column[:self._size].copy() if self._size < self.capacity else column.copy()
                  for name, column in self._columns.items()}
        meta = {"capacity": self.capacity, "size": self._size, "cursor": self._cursor,
                "rng": self._rng.bit_generator.state,
                "counters": [self._adds, self._add_calls, self._samples, self._sampled_items, self._updates,
                             self._updated_items]}
        if self.frames:
            meta["frames"] = self.frames
            if self._layout is not None:
                meta["layout"] = {name: [f.dtype, list(f.shape)] for name, f in self._layout.fields.items()}
                arrays.update(self._frame_ring.state(self._size))
        return {"arrays": arrays, "meta": meta}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        meta, arrays = state["meta"], state["arrays"]
        if meta["capacity"] != self.capacity:
            raise ReplayError(f"a checkpoint of capacity {meta['capacity']} does not fit a memory of {self.capacity}")
        if meta.get("frames", 0) != self.frames:
            raise ReplayError(f"a checkpoint of a memory with frames={meta.get('frames', 0)} does not fit one with "
                              f"frames={self.frames}")
        columns = {name.removeprefix("column."): array for name, array in arrays.items() if name.startswith("column.")}
        if self.frames and "layout" in meta:
            # The layout again, from stand-ins of one row per field (obs and next_obs are not columns).
            self._allocate({name: np.zeros((1, *shape), dtype=dtype) for name, (dtype, shape) in meta["layout"].items()})
            self._frame_ring.load(arrays, int(meta["size"]))
        elif columns:
            self._allocate({name: array[:1] for name, array in columns.items()})
        for name, array in columns.items():
            self._columns[name][:len(array)] = array
        self._size, self._cursor = int(meta["size"]), int(meta["cursor"])
        self._rng.bit_generator.state = meta["rng"]
        (self._adds, self._add_calls, self._samples, self._sampled_items, self._updates,
         self._updated_items) = (int(v) for v in meta["counters"])

    def native_handle(self) -> NativeHandle | None:
        """What the replay node's fast path works on (see the module's notes); None for a subclass and
        with frames (the fast path reads and writes obs and next_obs as columns)."""
        if type(self) not in (UniformReplay, PrioritizedReplay) or self.frames:
            return None
        return NativeHandle(self, self._rng, getattr(self, "_tree", None))

    def stats(self) -> dict[str, Any]:
        stats = {
            "size": self._size,
            "capacity": self.capacity,
            "prioritized": self.capabilities.prioritized,
            "adds": self._adds,
            "add_calls": self._add_calls,
            "overwritten": max(0, self._adds - self.capacity),
            "samples": self._samples,
            "sampled_items": self._sampled_items,
            "updates": self._updates,
            "updated_items": self._updated_items,
            "fields": self._layout.describe() if self._layout else {},
        }
        if self.frames:
            stats["frames"] = self._frame_ring.stats(self._size) if self._frame_ring else {"frames": self.frames}
        return stats


class PrioritizedReplay(UniformReplay):
    """Proportional prioritized replay over a C sum/min tree (see the module docstring)."""

    capabilities = caps.PRIORITIZED

    def __init__(self, capacity: int, *, alpha: float = 0.6, seed: int | None = None, frames: int = 0,
                 **ignored_options: Any) -> None:
        super().__init__(capacity, alpha=alpha, seed=seed, frames=frames)
        probe = probe_native()
        if not probe.available:
            raise ReplayError(probe.reason)
        from rlbench._sumtree import SumTree

        self._tree = SumTree(self.capacity, self.alpha)

    def _set_new_priorities(self, indices: np.ndarray, priorities: Any, new_size: int) -> None:
        # None makes the tree use the largest priority seen so far.
        self._call_update(indices, priorities, new_size, "add")

    def sample(self, batch_size: int, beta: float = 0.4) -> Sample:
        batch_size, beta = self._check_sample(batch_size, beta)
        uniforms = self._rng.random(batch_size)
        indices = np.empty(batch_size, dtype=np.int64)
        weights = np.empty(batch_size, dtype=np.float32)
        try:
            self._tree.sample(uniforms, beta, indices, weights)
        except ValueError as error:
            raise ReplayError(str(error)) from None
        return Sample(indices, self._gather(indices), weights)

    def update_priorities(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        """Set new priorities; an index repeated in one call takes the last priority given for it."""
        if priorities is None:
            raise ReplayError("update_priorities: priorities are required")
        self._updated_items += self._call_update(indices, priorities, self._size, "update_priorities")
        self._updates += 1

    def _call_update(self, indices: Any, priorities: Any, size: int, operation: str) -> int:
        try:
            try:
                return self._tree.update(indices, priorities, size)
            except TypeError:  # not a contiguous int/float array: convert, then let the tree validate
                indices, priorities = as_update_arrays(indices, priorities)
                return self._tree.update(indices, priorities, size)
        except (ValueError, TypeError) as error:
            raise ReplayError(f"{operation}: {error}") from None

    def priorities(self, indices: np.ndarray) -> np.ndarray:
        """The stored priorities**alpha at `indices` (float64); for tests and inspection."""
        indices = np.ascontiguousarray(indices, dtype=np.int64)
        out = np.empty(indices.shape, dtype=np.float64)
        try:
            self._tree.get(indices, out)
        except ValueError as error:
            raise ReplayError(str(error)) from None
        return out

    def stats(self) -> dict[str, Any]:
        stats = super().stats()
        stats.update(alpha=self.alpha, total_priority=self._tree.total, min_priority=self._tree.min,
                     max_priority_seen=self._tree.max_priority)
        return stats

    def priority_mass(self) -> tuple[float, float]:
        return self._tree.total, self._tree.min

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["arrays"]["priorities_alpha"] = self.priorities(np.arange(self._size))
        state["meta"]["max_priority"] = self._tree.max_priority
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        stored = np.asarray(state["arrays"]["priorities_alpha"], dtype=np.float64)
        indices = np.arange(len(stored), dtype=np.int64)
        # the tree keeps priorities**alpha; it is given raw priorities back (exact to rounding)
        raw = stored if self.alpha == 0 else np.power(stored, 1.0 / self.alpha)
        if len(indices):
            self._call_update(indices[:1], np.array([state["meta"]["max_priority"]]), self._size, "restore")
            self._call_update(indices, raw, self._size, "restore")  # (the first raises the largest seen to its old value)
