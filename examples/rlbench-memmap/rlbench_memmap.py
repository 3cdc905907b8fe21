"""A complete, minimal rlbench plugin: a FIFO, uniformly sampled replay memory whose storage is
memory-mapped files, so a buffer can be larger than RAM (the page cache keeps the hot part).

Every field is stored as given, image observations included (a stack of 4 Atari frames is 28 KB on
disk for obs and again for next_obs). It does not store frames once (capabilities.frames is False):
asked to (`frames=k`), it refuses at once and names the memories that do."""

from __future__ import annotations

import shutil
import tempfile
import weakref

import numpy as np

from rlbench.errors import RlbenchError
from rlbench.hookspecs import hookimpl
from rlbench.protocols import ReplayCapabilities, Sample

RLBENCH_API = "1.1"  # the plugin API this plugin targets (docs/plugin-api-changelog.md)

CAPABILITIES = ReplayCapabilities(prioritized=False, device="disk")
OPTIONS = ("alpha", "seed", "directory", "frames")  # the factory's keywords beside capacity


class MemmapReplayError(RlbenchError, ValueError):
    """Bad input: one clear line for the user (the conformance kit expects an RlbenchError)."""


class MemmapReplay:
    capabilities = CAPABILITIES

    def __init__(self, capacity: int, *, alpha: float = 0.6, seed: int | None = None, directory: str | None = None,
                 frames: int = 0, **options):
        if options:  # refused, not ignored: a misspelt run option must fail
            raise MemmapReplayError(f"replay memmap takes no option {', '.join(map(repr, sorted(options)))}; it takes "
                                    f"{', '.join(OPTIONS)}")
        if frames:
            raise MemmapReplayError(f"replay memmap stores obs and next_obs whole on disk, not frames once "
                                    f"(frames={frames}): use --replay prioritized or uniform")
        if capacity < 1:
            raise MemmapReplayError("capacity must be >= 1")
        self.capacity = int(capacity)
        self._rng = np.random.default_rng(seed)
        self._dir = tempfile.mkdtemp(prefix="rlbench-memmap-", dir=directory)
        weakref.finalize(self, shutil.rmtree, self._dir, ignore_errors=True)  # files go with the object
        self._fields: dict[str, np.memmap] = {}
        self._next = 0
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def add(self, transitions, priorities=None) -> np.ndarray:
        arrays = {k: np.asarray(v) for k, v in transitions.items()}
        lengths = {len(v) for v in arrays.values()}
        if len(lengths) != 1:
            raise MemmapReplayError(f"fields have different lengths: {sorted(lengths)}")
        batch = lengths.pop()
        if not self._fields:
            self._fields = {k: np.memmap(f"{self._dir}/{k}.bin", dtype=v.dtype, mode="w+",
                                         shape=(self.capacity, *v.shape[1:])) for k, v in arrays.items()}
        elif arrays.keys() != self._fields.keys():
            raise MemmapReplayError(f"fields {sorted(arrays)} differ from the stored {sorted(self._fields)}")
        indices = (self._next + np.arange(batch)) % self.capacity
        for key, values in arrays.items():
            stored = self._fields[key]
            if values.shape[1:] != stored.shape[1:] or values.dtype != stored.dtype:
                raise MemmapReplayError(f"field {key!r} is {values.dtype}{list(values.shape[1:])}, "
                                        f"stored {stored.dtype}{list(stored.shape[1:])}")
        for key, values in arrays.items():  # write only once every field is known good
            self._fields[key][indices] = values
        self._next = int((self._next + batch) % self.capacity)
        self._size = min(self.capacity, self._size + batch)
        return indices.astype(np.int64)

    def sample(self, batch_size: int, beta: float = 0.4) -> Sample:
        if self._size == 0 or batch_size < 1:
            raise MemmapReplayError("cannot sample: the memory is empty or batch_size < 1")
        indices = self._rng.integers(self._size, size=batch_size)
        rows = {k: np.asarray(v[indices]) for k, v in self._fields.items()}
        return Sample(indices.astype(np.int64), rows, np.ones(batch_size, dtype=np.float32))

    def update_priorities(self, indices, priorities) -> None:
        indices, priorities = np.asarray(indices), np.asarray(priorities, dtype=np.float64)
        if indices.shape != priorities.shape:
            raise MemmapReplayError(f"{indices.size} indices but {priorities.size} priorities")
        if np.any((indices < 0) | (indices >= self._size)):
            raise MemmapReplayError("priority update for an index that holds no item")
        if not np.all(np.isfinite(priorities) & (priorities >= 0)):
            raise MemmapReplayError("priorities must be finite and >= 0")

    def stats(self) -> dict:
        return {"size": self._size, "capacity": self.capacity, "directory": self._dir}


@hookimpl
def rlbench_register_replay_memories(register):
    # A lazy "rlbench_memmap:MemmapReplay" string works too; this module is light, so the class is fine.
    register("memmap", MemmapReplay, capabilities=CAPABILITIES,
             description="uniform FIFO replay on memory-mapped files (larger than RAM)")
