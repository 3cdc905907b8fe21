"""What every suite shares: the fixed component lists, why a listed component cannot run here, and
whether this run is quick or full."""

from __future__ import annotations

import os
from typing import Any

from rlbench.bench.matrix import COMPONENTS

MATRIX_VARIABLE = "RLBENCH_ASV_MATRIX"


def full_matrix() -> bool:
    """RLBENCH_ASV_MATRIX=full (every cell of the grids) or quick (the default: their fixed quick subsets)."""
    matrix = os.environ.get(MATRIX_VARIABLE, "quick")
    if matrix not in ("quick", "full"):
        raise ValueError(f"{MATRIX_VARIABLE} must be quick or full, not {matrix!r}")
    return matrix == "full"


def registry() -> Any:
    from rlbench.plugins import get_registry

    return get_registry()


def unavailable(kind: str) -> dict[str, str]:
    """name -> reason, for each name of the fixed `kind` list that cannot run on this machine."""
    reg = registry()
    reasons = {}
    for name in COMPONENTS[kind]:
        if name not in reg.names(kind):
            reasons[name] = f"{kind} {name!r} is not registered here (its plugin is not installed)"
            continue
        probe = reg.get(kind, name).probe()
        if not probe.available:
            reasons[name] = f"{kind} {name!r} is unavailable here: {probe.reason}"
    return reasons


def lookup(cache: dict[str, Any], key: str) -> dict[str, Any]:
    """The measurement stored under `key` by a setup_cache; NotImplementedError (asv: skipped) with the
    reason when the cell was not measured, RuntimeError (asv: failed) when measuring it failed."""
    outcome = cache[key]
    if "skipped" in outcome:
        raise NotImplementedError(outcome["skipped"])
    if "failed" in outcome:
        raise RuntimeError(outcome["failed"])
    return outcome["metrics"]
