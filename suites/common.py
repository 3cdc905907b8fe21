"""What every suite shares: the fixed component lists and why a listed component cannot run here."""

from __future__ import annotations

from typing import Any

from rlbench.bench.matrix import COMPONENTS


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
