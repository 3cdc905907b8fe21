"""What machine a result came from: the core's facts (CPU, cores, memory, versions; in
rlbench.builtin.fingerprint) and every plugin's own view, gathered through `rlbench_fingerprint`."""

from __future__ import annotations

from typing import Any

from rlbench.builtin.fingerprint import core_fingerprint  # noqa: F401  (the core's part, where users look for it)
from rlbench.plugins import call_hook_safely


def machine_fingerprint() -> dict[str, Any]:
    """The core's fingerprint plus each plugin's, under its plugin name."""
    result: dict[str, Any] = {"plugins": {}}
    for plugin, data in call_hook_safely("rlbench_fingerprint"):
        if plugin == "builtin":
            result.update(data or {})
        elif data is not None:
            result["plugins"][plugin] = data
    return result
