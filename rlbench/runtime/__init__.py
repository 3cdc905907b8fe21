"""The loops that run a configuration: local, on one device, and distributed (roles and launchers)."""

from __future__ import annotations

import os

TIMEOUT_FACTOR_ENV = "RLBENCH_TIMEOUT_FACTOR"


def patience(seconds: float) -> float:
    """A failure-detection timeout of `seconds` (a role's start, a reply from a peer) times
    RLBENCH_TIMEOUT_FACTOR (default 1). These timeouts tell a peer that is gone from one that is
    slow, and pace nothing: on a machine loaded past what they allow for (a test suite beside other
    work, a shared host) a healthy run is declared lost, so such a machine scales them instead. Read
    at each use; the roles a launcher starts inherit the variable from the process that started them
    (a Ray node's roles, from the process that started that node)."""
    raw = os.environ.get(TIMEOUT_FACTOR_ENV, "").strip()
    try:
        factor = float(raw) if raw else 1.0
    except ValueError:
        factor = 1.0
    return seconds * max(factor, 1.0)
