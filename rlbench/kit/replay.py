"""For replay-memory authors: the checks every memory makes, with the errors users see.

- `TransitionLayout`: the fields, dtypes and trailing shapes a memory stores, fixed by the first
  `add`; `validate(batch)` checks every later batch against it and returns its rows.
- `check_sample(batch_size, beta, size)`: the arguments of `sample`.
- `validated_update(indices, priorities, size)`: the arguments of `update_priorities` (and of
  `add(..., priorities)`), as flat int64 / float64 arrays.

Every refusal is a `ReplayError` (an `RlbenchError` and a `ValueError`) with one line that says
what was wrong, so the CLI prints it without a traceback and the conformance kit
(`rlbench.testing.check_replay_memory`) recognises it. Arrays may be numpy arrays or anything with
`shape`, `dtype` and `__len__` (a torch tensor): the layout compares dtype names ("float32").
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from rlbench.errors import RlbenchError
from rlbench.kit.checks import non_negative, positive_int


class ReplayError(RlbenchError, ValueError):
    """Bad input to a replay memory (wrong fields, dtypes, indices or priorities)."""


positive = functools.partial(positive_int, error=ReplayError)
non_negative_number = functools.partial(non_negative, error=ReplayError)


def dtype_name(array: Any) -> str:
    """'float32' for numpy arrays and torch tensors alike."""
    return str(array.dtype).removeprefix("torch.")


@dataclass(frozen=True)
class FieldLayout:
    """One stored field: its dtype name and the shape of one row."""

    dtype: str
    shape: tuple[int, ...]  # trailing shape: one row

    @property
    def nbytes(self) -> int:
        """Bytes of one row."""
        return int(np.dtype(self.dtype).itemsize * np.prod(self.shape, dtype=np.int64))

    def describe(self) -> str:
        """The field in words, for refusals: 'float32 rows of shape [4]'."""
        return f"{self.dtype} rows of shape {list(self.shape)}"


class TransitionLayout:
    """Field name -> (dtype, trailing shape), in the order of the first batch."""

    def __init__(self, fields: Mapping[str, FieldLayout]) -> None:
        self.fields = dict(fields)
        # numpy arrays are checked against numpy dtypes directly: naming a dtype costs microseconds,
        # and a replay memory's add sits on every env step of a local run
        self._numpy = [(name, _numpy_dtype(f.dtype), f.shape) for name, f in self.fields.items()]

    @classmethod
    def of(cls, batch: Mapping[str, Any], dtypes: tuple[str, ...] | None = None) -> "TransitionLayout":
        """The layout a first batch fixes; refuses what no memory can store (scalars, objects, and
        dtypes outside `dtypes` when given)."""
        if not isinstance(batch, Mapping) or not batch:
            raise ReplayError("add() needs a non-empty dict of field name -> array with a leading batch axis")
        fields = {}
        for name, value in batch.items():
            if not isinstance(name, str):
                raise ReplayError(f"field names must be strings, got {name!r}")
            if not hasattr(value, "dtype"):
                value = np.asarray(value)
            if len(value.shape) == 0:
                raise ReplayError(f"field {name!r} has no leading batch axis (got a scalar); pass shape (batch, ...)")
            dtype = dtype_name(value)
            if dtype == "object":
                raise ReplayError(f"field {name!r} has dtype object; store numeric or bool arrays")
            if dtypes is not None and dtype not in dtypes:
                raise ReplayError(f"field {name!r} has dtype {dtype}; this memory stores {', '.join(dtypes)}")
            fields[name] = FieldLayout(dtype, tuple(int(n) for n in value.shape[1:]))
        return cls(fields)

    def validate(self, batch: Mapping[str, Any]) -> tuple[list[Any], int]:
        """The batch's arrays in layout order, and its number of rows; a ReplayError when any field
        is missing, extra, of another dtype or row shape, or when the fields' lengths differ."""
        fields = self.fields
        if (type(batch) is not dict and not isinstance(batch, Mapping)) or batch.keys() != fields.keys():
            got = sorted(map(str, batch)) if isinstance(batch, Mapping) else type(batch).__name__
            raise ReplayError(f"add() needs exactly the fields {sorted(fields)}, got {got}")
        rows = []
        n = -1
        for name, numpy_dtype, row_shape in self._numpy:
            value = batch[name]
            if type(value) is np.ndarray:
                same = value.dtype == numpy_dtype
            else:
                if not hasattr(value, "dtype"):
                    value = np.asarray(value)
                same = dtype_name(value) == fields[name].dtype
            shape = value.shape
            if not same or len(shape) == 0 or shape[1:] != row_shape:
                raise ReplayError(
                    f"field {name!r}: got {dtype_name(value)}{list(shape)}, but this memory stores "
                    f"{fields[name].describe()} (set by the first add)")
            if n < 0:
                n = shape[0]
            elif shape[0] != n:
                raise ReplayError(f"fields have different batch lengths: {name!r} has {shape[0]}, others {n}")
            rows.append(value)
        return rows, int(n)

    def row_bytes(self) -> int:
        """The bytes one transition takes, over every field."""
        return sum(f.nbytes for f in self.fields.values())

    def describe(self) -> dict[str, str]:
        """Field name -> 'dtype[shape]' (a row's), for stats and messages."""
        return {name: f"{f.dtype}{list(f.shape)}" for name, f in self.fields.items()}


def _numpy_dtype(name: str) -> np.dtype | None:
    try:
        return np.dtype(name)
    except TypeError:  # a dtype numpy does not know (e.g. torch's bfloat16): only tensors carry it
        return None


def check_sample(batch_size: Any, beta: Any, size: int) -> tuple[int, float]:
    """`sample`'s arguments: a memory holding something, batch_size >= 1, beta in [0, 1]."""
    if size == 0:
        raise ReplayError("cannot sample from an empty replay memory; add transitions first")
    batch_size = positive(batch_size, "batch_size")
    beta = non_negative_number(beta, "beta")
    if beta > 1.0:
        raise ReplayError(f"beta must lie in [0, 1], got {beta!r}")
    return batch_size, beta


def as_update_arrays(indices: Any, priorities: Any) -> tuple[np.ndarray, np.ndarray]:
    """Flat int64 indices and float64 priorities, or a ReplayError saying what is wrong."""
    index_array = np.asarray(indices)
    if index_array.size and not np.issubdtype(index_array.dtype, np.integer):
        raise ReplayError(f"indices must be integers, got {index_array.dtype}")
    try:
        priority_array = np.ascontiguousarray(priorities, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise ReplayError(f"priorities must be numbers, got {type(priorities).__name__}") from None
    return np.ascontiguousarray(index_array, dtype=np.int64).reshape(-1), priority_array


def validated_update(indices: Any, priorities: Any, size: int) -> tuple[np.ndarray, np.ndarray]:
    """An update's indices (in [0, size)) and priorities (finite, >= 0), as flat arrays."""
    if priorities is None:
        raise ReplayError("update_priorities: priorities are required")
    index_array, priority_array = as_update_arrays(indices, priorities)
    if len(index_array) != len(priority_array):
        raise ReplayError(f"got {len(index_array)} indices but {len(priority_array)} priorities")
    if len(index_array):
        low, high = int(index_array.min()), int(index_array.max())
        if low < 0 or high >= size:
            bad = low if low < 0 else high
            raise ReplayError(f"index {bad} out of range for a memory holding {size} items")
        if not (priority_array.min() >= 0.0 and np.isfinite(priority_array.max())):
            bad = priority_array[~((priority_array >= 0.0) & np.isfinite(priority_array))][0]
            raise ReplayError(f"priority {bad} is invalid: priorities must be finite and >= 0")
    return index_array, priority_array
