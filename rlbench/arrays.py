"""Arrays that may live on a device. The core's loops keep their bookkeeping in numpy; a component may
hand out torch tensors (a gpu environment, a gpu replay memory) so that data stays on its device
between components that can take it. Duck-typed: importing this never imports torch."""

from __future__ import annotations

from typing import Any

import numpy as np


def to_host(array: Any) -> np.ndarray:
    """numpy for numpy and tensors alike (a tensor on a device is copied to the host, which waits for it)."""
    if isinstance(array, np.ndarray):
        return array
    if hasattr(array, "detach"):
        return array.detach().cpu().numpy()
    return np.asarray(array)


def as_float32(array: Any) -> Any:
    """The same kind of array (numpy or tensor, same device) as float32."""
    return array.astype(np.float32) if isinstance(array, np.ndarray) else array.float()


def same_kind(values: Any, like: Any) -> Any:
    """`values` as numpy when `like` is numpy; otherwise left where it is (a tensor on its device)."""
    return to_host(values) if isinstance(like, np.ndarray) else values
