"""For memories and messages of image observations: each distinct frame kept once, stacks rebuilt exactly.

A memory built with `frames=k` (ReplayCapabilities.frames) takes obs and next_obs that are k frames
stacked on axis 0 (k = 1: the whole observation is one frame). Consecutive stacks of an episode
share k-1 frames, and a transition's next_obs shares k-1 with its obs, so a stream of stacked
observations holds about one new frame per transition instead of 2k. What is shared is decided by
content alone, each time verified byte for byte: whatever is added (several envs interleaved, many
actors' chunks, episode ends and reset stacks anywhere, a next_obs that is not obs shifted by one),
what comes back is exactly what was given. Nothing relies on a stream's identity or order.

- `fingerprints(frames)`: each frame's 64-bit fingerprint (uint64): the frame read as little-endian
  uint64 words w_i (the last zero-padded), s = sum_i w_i * (2i+1) * 0x9E3779B97F4A7C15 mod 2**64,
  then murmur3's fmix64 (a bijection). Frames that differ in a single word always differ. It only
  finds candidates: sharing is decided by comparing bytes.
- `pack(obs, next_obs, k)` -> (frames (m, *frame_shape), obs_refs (n, k) int32, next_refs (n, k)
  int32): a batch of stacked observations with each distinct frame once (in order of first use);
  `unpack(frames, obs_refs, next_refs)` -> (obs, next_obs) gives the batch back, byte-identical.
  What a message can carry instead of the stacks (an INSERT of a chunk of steps: ~1 frame per step).
- `FrameStore(frame_shape, dtype, slots)`: the frames a memory keeps, each once, with a reference
  count per frame, found by fingerprint and shared only when the bytes are equal; it grows when a
  batch needs more room than it has. (C: rlbench/_native/frames.c, built with the core.)
- `FrameRing(capacity, k, obs_shape, dtype)` (or `FrameRing.of_layout(layout, capacity, k)`, which
  checks a memory's transitions first): what a FIFO memory of `capacity` transitions keeps for its
  obs and next_obs: the store and, per position, the ids of its k + k frames. Writing a position
  releases the frames of the transition it overwrites (after the new ones are stored, so frames the
  two share stay); a frame without references frees its slot. `read` copies each transition's k + 1
  frames once when next_obs is obs shifted by one (as in any stream), and hands out obs and next_obs
  as two views of them (they share memory; both are the caller's). Used by the core's memories and
  by replay `gpu` (which mirrors the store's frames on its device).
- `checked_frames(frames)`: a memory's `frames=` option, checked.
- `frame_shape(obs_shape, k)`: the shape of one frame of observations of that shape.
- `FRAME_FIELDS`: ("obs", "next_obs"), the fields kept as frames.
- `probe()`: whether the C part is built.

The stores are not thread-safe (one owner, like the memories). Refusals are ReplayErrors.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from rlbench.kit.replay import ReplayError, positive
from rlbench.protocols import Probe

FRAME_FIELDS = ("obs", "next_obs")  # the fields a memory with frames=k keeps as frames
BUILD_HINT = "build it with `pip install -e .` (needs gcc and the Python headers) or `python setup.py build_ext --inplace`"


def probe() -> Probe:
    """Whether rlbench._frames (the C store) is built."""
    try:
        from rlbench import _frames  # noqa: F401
    except ImportError as exc:
        return Probe.missing(f"C extension rlbench._frames is not built ({exc}); {BUILD_HINT}")
    return Probe.ok("C frame store")


def _native() -> Any:
    try:
        from rlbench import _frames
    except ImportError:
        raise ReplayError(probe().reason) from None
    return _frames


def checked_frames(frames: Any) -> int:
    """A memory's `frames=` option: 0 (or None) for observations stored as given, else the frames per
    observation (an integer >= 1); a ReplayError for anything else, or when the C store is not built."""
    if frames is None or (frames == 0 and not isinstance(frames, bool)):
        return 0
    count = positive(frames, "frames")
    if not probe().available:
        raise ReplayError(probe().reason)
    return count


def frame_shape(obs_shape: tuple[int, ...], k: int) -> tuple[int, ...]:
    """One frame of observations of `obs_shape` stacked k deep on axis 0 (k = 1: the observation)."""
    obs_shape = tuple(int(n) for n in obs_shape)
    if k == 1:
        if not obs_shape:
            raise ReplayError("frames=1 needs observations with at least one dimension, got scalars")
        return obs_shape
    if len(obs_shape) < 2 or obs_shape[0] != k:
        raise ReplayError(f"frames={k} stores observations of {k} frames stacked on axis 0, got rows of shape "
                          f"{list(obs_shape)}")
    return obs_shape[1:]


def _frames_of(array: Any, shape: tuple[int, ...]) -> np.ndarray:
    """The rows of a stacked batch as contiguous frames (m, *shape), without a copy when already so."""
    array = np.ascontiguousarray(array)
    return array if array.shape[-len(shape):] == shape and array.ndim == len(shape) + 1 else array.reshape(-1, *shape)


def fingerprints(frames: Any) -> np.ndarray:
    """Each frame's 64-bit fingerprint (uint64; see the module docstring); frames: (m, *frame_shape)."""
    frames = np.ascontiguousarray(frames)
    if frames.ndim < 1:
        raise ReplayError("fingerprints needs an array of frames (m, *frame_shape)")
    out = np.empty(len(frames), dtype=np.uint64)
    frame_bytes = frames[0].nbytes if len(frames) else 1
    if len(frames) and frame_bytes:
        _native().fingerprints(frames, frame_bytes, out)
    return out


class FrameStore:
    """Frames of one shape and dtype, each kept once, reference counted (see the module docstring).
    `on_grow(slots)`, when set, is called before the store grows to `slots` (a copy of the store
    elsewhere grows with it); a ReplayError from it refuses the growth as running out of memory does."""

    on_grow: Callable[[int], None] | None = None

    def __init__(self, frame_shape: tuple[int, ...], dtype: Any, slots: int) -> None:
        self.frame_shape = tuple(int(n) for n in frame_shape)
        self.dtype = np.dtype(dtype)
        self.frame_bytes = int(self.dtype.itemsize * np.prod(self.frame_shape, dtype=np.int64))
        if self.frame_bytes < 1:
            raise ReplayError(f"frames of shape {list(self.frame_shape)} hold no bytes")
        try:
            self._store = _native().FrameStore(self.frame_bytes, int(slots))
        except MemoryError:
            raise ReplayError(self._no_room(int(slots))) from None

    @property
    def slots(self) -> int:
        """How many frames the store has room for now (it grows when full)."""
        return self._store.slots

    @property
    def live(self) -> int:
        """Frames held (each at least once referenced)."""
        return self._store.live

    def store(self, frames: Any, fresh: np.ndarray | None = None) -> np.ndarray:
        """Keep `frames` ((m, *frame_shape) of this dtype): ids (int32, one per frame, each counting one
        reference), sharing each frame whose bytes are already held; `fresh` (bool, m), when given,
        gets which frames were copied in. Grows when full; a store that cannot grow raises a
        ReplayError and keeps nothing of this call."""
        frames = _frames_of(frames, self.frame_shape)
        ids = np.empty(len(frames), dtype=np.int32)
        done = self._store.store(frames, ids) if fresh is None else self._store.store(frames, ids, fresh)
        if done < len(frames):
            self._grow_and_store(frames, ids, fresh, done)
        return ids

    def _grow_and_store(self, frames: np.ndarray, ids: np.ndarray, fresh: np.ndarray | None, done: int) -> None:
        while done < len(frames):  # out of slots: grow, then store the rest
            needed = len(frames) - done
            slots = self.slots + max(needed, self.slots // 8, 64)
            try:
                if self.on_grow is not None:
                    self.on_grow(slots)
                self._store.grow(slots)
            except (MemoryError, ReplayError) as error:
                self._store.release(ids[:done])
                raise ReplayError(str(error) if isinstance(error, ReplayError) else self._no_room(slots)) from None
            rest = (frames[done:], ids[done:]) if fresh is None else (frames[done:], ids[done:], fresh[done:])
            done += self._store.store(*rest)

    def _no_room(self, slots: int) -> str:
        return (f"cannot allocate room for {slots:,} frames of {self.frame_bytes:,} bytes "
                f"({slots * self.frame_bytes / 2**30:.2f} GiB)")

    def retain(self, ids: Any) -> None:
        """One more reference to each frame named (an id may repeat)."""
        self._store.retain(np.ascontiguousarray(ids, dtype=np.int32).reshape(-1))

    def release(self, ids: Any) -> None:
        """One reference less to each frame named; a frame left without any frees its slot."""
        self._store.release(np.ascontiguousarray(ids, dtype=np.int32).reshape(-1))

    def gather(self, ids: Any, out: np.ndarray | None = None) -> np.ndarray:
        """The frames named by `ids` (any shape): an array (*ids.shape, *frame_shape), into `out` when given."""
        ids = np.ascontiguousarray(ids, dtype=np.int32)
        if out is None:
            out = np.empty((*ids.shape, *self.frame_shape), dtype=self.dtype)
        self._store.gather(ids.reshape(-1), out)
        return out

    def read_stacks(self, obs_ids: np.ndarray, next_ids: np.ndarray, indices: np.ndarray, out: np.ndarray) -> bool:
        """Into `out` (len(indices), k + 1, *frame_shape): each transition's obs frames and its
        next_obs's last one, from tables of k ids per position, when every next_obs at `indices` is
        its obs shifted by one frame (True); otherwise nothing is written (False)."""
        return self._store.read_stacks(obs_ids, next_ids, indices, out)

    def place(self, obs_table: np.ndarray, next_table: np.ndarray, positions: np.ndarray, obs_ids: np.ndarray,
              next_ids: np.ndarray, size: int) -> None:
        """Tables of k ids per position (int32) take the new ids (each holding the reference `store`
        gave it) at `positions` (distinct); the ids they held at positions below `size` are released."""
        self._store.place(obs_table, next_table, np.ascontiguousarray(positions, dtype=np.int64),
                          np.ascontiguousarray(obs_ids, dtype=np.int32), np.ascontiguousarray(next_ids, dtype=np.int32),
                          int(size))

    def compact(self) -> tuple[np.ndarray, np.ndarray]:
        """(the frames held, in slot order: (live, *frame_shape); each slot's index among them, -1 for a
        free slot): what a checkpoint keeps. A copy: the store is not changed."""
        counts = self.reference_counts()
        held = np.flatnonzero(counts > 0).astype(np.int32)
        renumber = np.full(self.slots, -1, dtype=np.int32)
        renumber[held] = np.arange(len(held), dtype=np.int32)
        return self.gather(held), renumber

    def reference_counts(self) -> np.ndarray:
        """Each slot's reference count (int32, 0 for a free slot)."""
        counts = np.empty(self.slots, dtype=np.int32)
        self._store.refcounts(counts)
        return counts

    def load(self, frames: Any, reference_counts: Any) -> None:
        """Hold exactly `frames` (ids 0..m-1 in this order) with these reference counts (each >= 1)."""
        frames = _frames_of(frames, self.frame_shape)
        if len(frames) > self.slots:
            try:
                self._store.grow(len(frames))
            except MemoryError:
                raise ReplayError(self._no_room(len(frames))) from None
        try:
            self._store.load(frames, np.ascontiguousarray(reference_counts, dtype=np.int32))
        except (ValueError, TypeError) as error:
            raise ReplayError(f"cannot load the frames: {error}") from None

    def stats(self) -> dict[str, Any]:
        """JSON-able counters: frames held and their bytes, slots, frames written and shared, fingerprint
        collisions."""
        store = self._store
        return {"frame_shape": list(self.frame_shape), "frame_dtype": self.dtype.name, "frames_held": store.live,
                "frame_bytes": store.live * self.frame_bytes, "frame_slots": store.slots,
                "frames_written": store.written, "frames_shared": store.shared,
                "fingerprint_collisions": store.collisions}


class FrameRing:
    """The frames of a FIFO memory's obs and next_obs: a FrameStore and, per position, k + k frame ids
    (see the module docstring). Positions are the memory's; the memory says which are occupied."""

    def __init__(self, capacity: int, k: int, obs_shape: tuple[int, ...], dtype: Any) -> None:
        self.k = int(k)
        self.obs_shape = tuple(int(n) for n in obs_shape)
        self.frame_shape = frame_shape(self.obs_shape, self.k)
        self.capacity = int(capacity)
        # A stream adds one new frame per transition (and one or two per episode): capacity plus a
        # margin covers it; only slots ever used are resident (the store's pages are touched on use).
        slots = self.capacity + self.capacity // 16 + 2 * self.k * 64
        self.store = FrameStore(self.frame_shape, dtype, slots)
        self.obs_ids = np.zeros((self.capacity, self.k), dtype=np.int32)
        self.next_ids = np.zeros((self.capacity, self.k), dtype=np.int32)

    @classmethod
    def of_layout(cls, layout: Any, capacity: int, k: int) -> "FrameRing":
        """The ring for a memory's transitions (a rlbench.kit.replay.TransitionLayout), or a ReplayError
        saying why they cannot be stored as frames=k."""
        missing = [name for name in FRAME_FIELDS if name not in layout.fields]
        if missing:
            raise ReplayError(f"frames={k} stores obs and next_obs as frames, but the transitions have no "
                              f"{' or '.join(missing)} (fields: {sorted(layout.fields)})")
        obs, next_obs = layout.fields["obs"], layout.fields["next_obs"]
        if obs != next_obs:
            raise ReplayError(f"frames={k}: obs is {obs.dtype}{list(obs.shape)} per row but next_obs is "
                              f"{next_obs.dtype}{list(next_obs.shape)}; both must be stacks of the same frames")
        return cls(capacity, k, obs.shape, obs.dtype)

    def write(self, positions: np.ndarray, obs: Any, next_obs: Any, size: int) -> np.ndarray:
        """Store the rows for `positions` (distinct), releasing the frames of those below `size` (the
        transitions they overwrite). Returns which of the rows' frames (obs's n*k, then next_obs's) were
        copied in (what a copy of the store elsewhere, on a device, must take). A ReplayError (out of
        memory) leaves everything as it was."""
        half = len(positions) * self.k
        fresh = np.empty(2 * half, dtype=bool)
        obs_ids = self.store.store(obs, fresh[:half])
        try:
            next_ids = self.store.store(next_obs, fresh[half:])
        except ReplayError:
            self.store.release(obs_ids)
            raise
        self._place(positions, obs_ids, next_ids, size)
        return fresh

    def write_packed(self, positions: np.ndarray, frames: Any, obs_refs: np.ndarray, next_refs: np.ndarray,
                     size: int) -> None:
        """`write` of a packed batch (`pack`'s frames and refs, checked by the caller): each frame given
        is looked up once."""
        held = self.store.store(frames)
        obs_ids, next_ids = held[obs_refs], held[next_refs]
        self.store.retain(obs_ids)
        self.store.retain(next_ids)
        self.store.release(held)  # now referenced by the transitions only
        self._place(positions, obs_ids, next_ids, size)

    def _place(self, positions: np.ndarray, obs_ids: np.ndarray, next_ids: np.ndarray, size: int) -> None:
        """The new ids into the tables; the frames of the transitions overwritten (positions below
        `size`) released, after the new ones were stored, so that frames the two share stay."""
        self.store.place(self.obs_ids, self.next_ids, positions, obs_ids, next_ids, size)

    def read(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(obs, next_obs) of the transitions at `indices` (int64), as they were written. When every
        next_obs is its obs shifted by one frame (a stream's transitions, episode ends and reset stacks
        included), each transition's k + 1 frames are copied once, in one C call, and obs and next_obs
        are views of them (frames [0, k) and [1, k + 1) of each row: half the bytes of two copies);
        otherwise two arrays."""
        indices = np.ascontiguousarray(indices, dtype=np.int64)
        k = self.k
        frames = np.empty((len(indices), k + 1, *self.frame_shape), dtype=self.store.dtype)
        if self.store.read_stacks(self.obs_ids, self.next_ids, indices, frames):
            if k == 1:
                return frames[:, 0], frames[:, 1]
            return frames[:, :k], frames[:, 1:]
        shape = (len(indices), *self.obs_shape)
        return (self.store.gather(self.obs_ids.take(indices, axis=0)).reshape(shape),
                self.store.gather(self.next_ids.take(indices, axis=0)).reshape(shape))

    def state(self, size: int) -> dict[str, np.ndarray]:
        """The frames of positions [0, size) compactly (only frames held), with their ids renumbered."""
        frames, renumber = self.store.compact()
        return {"frames": frames, "frame_ids.obs": renumber[self.obs_ids[:size]],
                "frame_ids.next_obs": renumber[self.next_ids[:size]]}

    def load(self, arrays: dict[str, np.ndarray], size: int) -> None:
        """Restore what `state` gave (into a ring of the same capacity, k and observation shape)."""
        frames = np.asarray(arrays["frames"])
        obs_ids = np.asarray(arrays["frame_ids.obs"], dtype=np.int32)
        next_ids = np.asarray(arrays["frame_ids.next_obs"], dtype=np.int32)
        if frames.shape[1:] != self.frame_shape or obs_ids.shape != (size, self.k) or next_ids.shape != obs_ids.shape:
            raise ReplayError(f"the checkpoint's frames {list(frames.shape)} and ids {list(obs_ids.shape)} do not "
                              f"fit {size} transitions of {self.k} frames of shape {list(self.frame_shape)}")
        references = np.concatenate([obs_ids.reshape(-1), next_ids.reshape(-1)])
        if len(references) and (references.min() < 0 or references.max() >= len(frames)):
            raise ReplayError("the checkpoint's frame ids name frames it does not hold")
        self.store.load(frames.astype(self.store.dtype, copy=False),
                        np.bincount(references, minlength=len(frames)).astype(np.int32))
        self.obs_ids[:size] = obs_ids
        self.next_ids[:size] = next_ids

    def stats(self, size: int) -> dict[str, Any]:
        """The store's figures, and how many references a frame held has on average (2k per transition)."""
        stats = self.store.stats()
        references = 2 * self.k * size
        stats.update(frames=self.k, references=references,
                     dedup_ratio=round(references / stats["frames_held"], 3) if stats["frames_held"] else None)
        return stats


def pack(obs: Any, next_obs: Any, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A batch of stacked observations (n, k, *frame_shape) (k = 1: (n, *frame_shape)) as its distinct
    frames, in order of first use in obs then next_obs, and each row's frame ids (n, k) int32."""
    obs, next_obs = np.ascontiguousarray(obs), np.ascontiguousarray(next_obs)
    if obs.shape != next_obs.shape or obs.dtype != next_obs.dtype or obs.ndim < 1:
        raise ReplayError(f"obs {obs.dtype}{list(obs.shape)} and next_obs {next_obs.dtype}{list(next_obs.shape)} "
                          "must be batches of the same shape and dtype")
    shape = frame_shape(obs.shape[1:], int(k))
    n = len(obs)
    if n == 0:
        empty = np.zeros((0, int(k)), dtype=np.int32)
        return np.zeros((0, *shape), dtype=obs.dtype), empty, empty.copy()
    store = FrameStore(shape, obs.dtype, 2 * n * int(k))  # a new store gives out slots 0, 1, 2, ... in order
    obs_refs = store.store(obs).reshape(n, int(k))
    next_refs = store.store(next_obs).reshape(n, int(k))
    return store.gather(np.arange(store.live, dtype=np.int32)), obs_refs, next_refs


def unpack(frames: Any, obs_refs: Any, next_refs: Any) -> tuple[np.ndarray, np.ndarray]:
    """(obs, next_obs) of a packed batch: frames[refs], stacked on axis 1 (k = 1: the frame itself)."""
    frames = np.asarray(frames)
    obs_refs, next_refs = np.asarray(obs_refs), np.asarray(next_refs)
    if obs_refs.ndim != 2 or obs_refs.shape != next_refs.shape:
        raise ReplayError(f"obs_refs {list(obs_refs.shape)} and next_refs {list(next_refs.shape)} must both be (n, k)")
    if obs_refs.size and (min(obs_refs.min(), next_refs.min()) < 0
                          or max(obs_refs.max(), next_refs.max()) >= len(frames)):
        raise ReplayError(f"frame refs must lie in [0, {len(frames)}): the packed batch holds {len(frames)} frames")
    n, k = obs_refs.shape
    shape = (n, k, *frames.shape[1:]) if k > 1 else (n, *frames.shape[1:])
    return frames.take(obs_refs, axis=0).reshape(shape), frames.take(next_refs, axis=0).reshape(shape)
