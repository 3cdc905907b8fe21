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

Neither memory is thread-safe: one owner (the learner or the replay server) calls it.
"""

from __future__ import annotations

import functools

from typing import Any, Mapping

import numpy as np

from rlbench.checks import non_negative, positive_int
from rlbench.errors import RlbenchError
from rlbench.protocols import Probe, ReplayCapabilities, Sample

BUILD_HINT = "build it with `pip install -e .` (needs gcc and the Python headers) or `python setup.py build_ext --inplace`"


class ReplayError(RlbenchError, ValueError):
    """Bad input to a replay memory (wrong fields, dtypes, indices or priorities)."""


_positive_int = functools.partial(positive_int, error=ReplayError)
_non_negative = functools.partial(non_negative, error=ReplayError)


def probe_native() -> Probe:
    """Whether the C sum tree behind PrioritizedReplay is built."""
    try:
        from rlbench import _sumtree
    except ImportError as exc:
        return Probe.missing(f"C extension rlbench._sumtree is not built ({exc}); {BUILD_HINT}")
    if not hasattr(_sumtree, "SumTree"):
        return Probe.missing(f"rlbench._sumtree is an old placeholder build; {BUILD_HINT}")
    return Probe.ok(f"C sum/min tree, {_sumtree.ARITY}-ary")


class UniformReplay:
    """FIFO ring of numpy arrays, uniform sampling; importance weights are all ones."""

    capabilities = ReplayCapabilities(prioritized=False)

    def __init__(self, capacity: int, *, alpha: float = 0.6, seed: int | None = None, **ignored_options: Any) -> None:
        self.capacity = _positive_int(capacity, "capacity")
        self.alpha = _non_negative(alpha, "alpha")
        self._rng = np.random.default_rng(seed)
        self._columns: dict[str, np.ndarray] = {}
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
        first = not self._columns
        if first:
            self._allocate(transitions)
        try:
            rows, n = self._validated_rows(transitions)
            indices = np.arange(self._cursor, self._cursor + n, dtype=np.int64)
            if self._cursor + n > self.capacity:
                indices %= self.capacity
            new_size = min(self._size + n, self.capacity)
            self._set_new_priorities(indices, priorities, new_size)  # validates: nothing is written on error
        except ReplayError:
            if first:  # a refused first batch does not fix the layout
                self._columns = {}
            raise
        self._write_rows(rows, n)
        self._size = new_size
        self._adds += n
        self._add_calls += 1
        return indices

    def _set_new_priorities(self, indices: np.ndarray, priorities: Any, new_size: int) -> None:
        if priorities is not None:
            _validated_update(indices, priorities, new_size)

    def _allocate(self, transitions: Mapping[str, np.ndarray]) -> None:
        if not isinstance(transitions, Mapping) or not transitions:
            raise ReplayError("add() needs a non-empty dict of field name -> array with a leading batch axis")
        columns = {}
        for name, value in transitions.items():
            if not isinstance(name, str):
                raise ReplayError(f"field names must be strings, got {name!r}")
            value = np.asarray(value)
            if value.ndim == 0:
                raise ReplayError(f"field {name!r} has no leading batch axis (got a scalar); pass shape (batch, ...)")
            if value.dtype.hasobject:
                raise ReplayError(f"field {name!r} has dtype object; store numeric or bool arrays")
            try:
                columns[name] = np.zeros((self.capacity, *value.shape[1:]), dtype=value.dtype)
            except MemoryError:
                gib = self.capacity * value[:1].nbytes / 2**30
                raise ReplayError(f"cannot allocate {gib:.1f} GiB for field {name!r} at capacity {self.capacity}") from None
        self._columns = columns

    def _validated_rows(self, transitions: Mapping[str, np.ndarray]) -> tuple[list[np.ndarray], int]:
        columns = self._columns
        if not isinstance(transitions, Mapping) or transitions.keys() != columns.keys():
            got = sorted(map(str, transitions)) if isinstance(transitions, Mapping) else type(transitions).__name__
            raise ReplayError(f"add() needs exactly the fields {sorted(columns)}, got {got}")
        rows = []
        n = -1
        for name, column in columns.items():
            value = transitions[name]
            if type(value) is not np.ndarray:
                value = np.asarray(value)
            if value.dtype != column.dtype or value.shape[1:] != column.shape[1:] or value.ndim == 0:
                raise ReplayError(
                    f"field {name!r}: got {value.dtype}{list(value.shape)}, but this memory stores "
                    f"{column.dtype} rows of shape {list(column.shape[1:])} (set by the first add)")
            if n < 0:
                n = len(value)
            elif len(value) != n:
                raise ReplayError(f"fields have different batch lengths: {name!r} has {len(value)}, others {n}")
            rows.append(value)
        return rows, n

    def _write_rows(self, rows: list[np.ndarray], n: int) -> None:
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
        if self._size == 0:
            raise ReplayError("cannot sample from an empty replay memory; add transitions first")
        batch_size = _positive_int(batch_size, "batch_size")
        beta = _non_negative(beta, "beta")
        if beta > 1.0:
            raise ReplayError(f"beta must lie in [0, 1], got {beta!r}")
        self._samples += 1
        self._sampled_items += batch_size
        return batch_size, beta

    def _gather(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        return {name: column.take(indices, axis=0) for name, column in self._columns.items()}

    # -- priorities ------------------------------------------------------------------------------
    def update_priorities(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        """Accepted and ignored (after validation): uniform sampling has no priorities."""
        self._updated_items += _validated_update(indices, priorities, self._size)
        self._updates += 1

    def stats(self) -> dict[str, Any]:
        return {
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
            "fields": {name: f"{c.dtype}{list(c.shape[1:])}" for name, c in self._columns.items()},
        }


class PrioritizedReplay(UniformReplay):
    """Proportional prioritized replay over a C sum/min tree (see the module docstring)."""

    capabilities = ReplayCapabilities(prioritized=True)

    def __init__(self, capacity: int, *, alpha: float = 0.6, seed: int | None = None, **ignored_options: Any) -> None:
        super().__init__(capacity, alpha=alpha, seed=seed)
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
                indices, priorities = _as_update_arrays(indices, priorities)
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


# -- validation helpers ----------------------------------------------------------------------------
def _as_update_arrays(indices: Any, priorities: Any) -> tuple[np.ndarray, np.ndarray]:
    """Flat int64 indices and float64 priorities, or a ReplayError saying what is wrong."""
    index_array = np.asarray(indices)
    if index_array.size and not np.issubdtype(index_array.dtype, np.integer):
        raise ReplayError(f"indices must be integers, got {index_array.dtype}")
    try:
        priority_array = np.ascontiguousarray(priorities, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise ReplayError(f"priorities must be numbers, got {type(priorities).__name__}") from None
    return np.ascontiguousarray(index_array, dtype=np.int64).reshape(-1), priority_array


def _validated_update(indices: Any, priorities: Any, size: int) -> int:
    """Check an update's indices (in [0, size)) and priorities (finite, >= 0); returns its length."""
    index_array, priority_array = _as_update_arrays(indices, priorities)
    if len(index_array) != len(priority_array):
        raise ReplayError(f"got {len(index_array)} indices but {len(priority_array)} priorities")
    if len(index_array):
        low, high = int(index_array.min()), int(index_array.max())
        if low < 0 or high >= size:
            bad = low if low < 0 else high
            raise ReplayError(f"index {bad} out of range for a memory holding {size} items")
        if not (np.all(priority_array >= 0.0) and np.all(np.isfinite(priority_array))):
            bad = priority_array[~((priority_array >= 0.0) & np.isfinite(priority_array))][0]
            raise ReplayError(f"priority {bad} is invalid: priorities must be finite and >= 0")
    return len(index_array)
