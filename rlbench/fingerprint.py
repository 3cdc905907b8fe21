"""What machine a result came from: the core's facts (CPU, cores, memory, versions; in
rlbench.builtin.fingerprint) and every plugin's own view, gathered through `rlbench_fingerprint`."""

from __future__ import annotations

from typing import Any

from rlbench.builtin.fingerprint import core_fingerprint  # noqa: F401  (the core's part, where users look for it)
from rlbench.plugins import plugin_fingerprints
from rlbench.registry import Registry


def machine_fingerprint(registry: Registry | None = None) -> dict[str, Any]:
    """The core's fingerprint plus each plugin's, under its plugin name. A plugin whose fingerprint
    raises is refused wholly (rlbench.plugins.plugin_fingerprints), not described by an error."""
    result: dict[str, Any] = {"plugins": {}}
    for plugin, data in plugin_fingerprints(registry).items():
        if plugin == "builtin":
            result.update(data)
        else:
            result["plugins"][plugin] = data
    return result
