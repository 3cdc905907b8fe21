"""Does a piece of torch code stay on its device? Checked on any device, the CPU device included (CI).

`HostRoundTripAudit` counts, while active, every aten op the code dispatches (forward, backward
and optimizer alike), and apart the ones that compute (`kernel_ops`: neither a view, which only
relabels memory, nor the profiler's markers): on CUDA each of those is about one kernel launch,
which is what a small RL step is bound by. It flags everything that would make the device wait for
the host, the host wait for the device, or a CUDA-graph capture fail:

- an op whose output depends on device values (torch tags it `data_dependent_output`: `.item()`,
  `bool(t)`, `float(t)` all dispatch `aten._local_scalar_dense`; or `dynamic_output_shape`:
  nonzero, masked_select, indexing by a boolean mask; integer indexing keeps a static shape and is
  not flagged);
- a tensor made from host data (`aten.lift_fresh`: `torch.tensor(...)`, `torch.as_tensor(array)`):
  on CUDA a copy from pageable host memory, refused inside a graph capture;
- a copy between devices (`_to_copy` or `copy_` whose source and result are on different devices),
  visible when the code runs on (fake) CUDA tensors;
- reads that dispatch nothing on the CPU device but wait for a GPU (`TorchFunctionMode`):
  `Tensor.item`, `tolist`, `cpu`, `numpy`, `__bool__`, `__float__`, `__int__`, `__index__`.

Imports torch (the plugin loads it lazily, from tests and benchmarks).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

HOST_READS = frozenset({"item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__"})
_aten = torch.ops.aten
_INTEGER_INDEXING = {_aten.index.Tensor, _aten.index_put.default, _aten.index_put_.default,
                     _aten._index_put_impl_.default}
_HOST_DATA = {_aten.lift_fresh.default, _aten.lift_fresh_copy.default}
_COPIES = {_aten._to_copy.default, _aten.copy_.default}


class HostRoundTripAudit:
    """with HostRoundTripAudit() as audit: ...; then audit.op_count, audit.kernel_ops, audit.ops (Counter
    by op name) and audit.round_trips (one line per offending call, in order)."""

    def __init__(self) -> None:
        self.ops: Counter[str] = Counter()
        self.kernel_ops = 0
        self.round_trips: list[str] = []
        self._modes = (_FunctionReads(self), _Dispatches(self))

    @property
    def op_count(self) -> int:
        return sum(self.ops.values())

    def __enter__(self) -> "HostRoundTripAudit":
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)

    def _dispatched(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        self.ops[str(func)] += 1
        self.kernel_ops += _computes(func)
        why = _why_it_waits(func, args, out)
        if why:
            self.round_trips.append(f"{func}: {why}")


class _Dispatches(TorchDispatchMode):
    def __init__(self, audit: HostRoundTripAudit) -> None:
        super().__init__()
        self.audit = audit

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.audit._dispatched(func, args, kwargs, out)
        return out


class _FunctionReads(TorchFunctionMode):
    def __init__(self, audit: HostRoundTripAudit) -> None:
        super().__init__()
        self.audit = audit

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in HOST_READS:
            self.audit.round_trips.append(f"Tensor.{name}: reads a device value on the host")
        return func(*args, **(kwargs or {}))


def _why_it_waits(func: Any, args: tuple, out: Any) -> str:
    tags = getattr(func, "tags", ())
    if func in _HOST_DATA:
        return "a tensor made from host data (a host-to-device copy on CUDA, refused in a graph capture)"
    if torch.Tag.data_dependent_output in tags:
        return "its output is a device value read on the host (a sync)"
    if torch.Tag.dynamic_output_shape in tags:
        if func in _INTEGER_INDEXING and not _has_bool_index(args):
            return ""
        return "its output's shape depends on device values (a sync)"
    if func in _COPIES:
        source = args[1] if func is _aten.copy_.default else args[0]
        result = args[0] if func is _aten.copy_.default else out
        if isinstance(source, torch.Tensor) and isinstance(result, torch.Tensor) and source.device != result.device:
            return f"a copy from {source.device} to {result.device}"
    return ""


def _computes(func: Any) -> bool:
    """Not a view (its result aliases an input without writing it) and not a profiler marker."""
    if func.namespace != "aten":
        return False
    return not any(r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns)


def _has_bool_index(args: tuple) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in (indices or ()))
