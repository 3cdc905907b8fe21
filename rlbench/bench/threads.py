"""Pin torch and numpy's BLAS to one thread, so single-thread peers are compared fairly."""

from __future__ import annotations

import ctypes


def pin_one_thread() -> dict[str, object]:
    """torch.set_num_threads(1) and OpenBLAS's set_num_threads(1) on the copy numpy loaded (found in
    /proc/self/maps, as threadpoolctl does). Returns what was pinned, for the benchmark's output."""
    import numpy  # noqa: F401  (its BLAS must be loaded to be found)
    import torch

    torch.set_num_threads(1)
    pinned: dict[str, object] = {"torch_threads": torch.get_num_threads(), "numpy_blas_threads": "not pinned"}
    try:
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split()[-1] for line in maps if "openblas" in line.lower() and "/" in line})
    except OSError:
        return pinned
    for path in paths:
        library = ctypes.CDLL(path)
        for prefix in ("scipy_openblas_", "openblas_"):
            for suffix in ("64_", ""):
                setter = getattr(library, f"{prefix}set_num_threads{suffix}", None)
                if setter is not None:
                    setter(1)
                    pinned["numpy_blas_threads"] = 1
                    return pinned
    return pinned
