"""The core's view of the machine: CPU, cores, memory, versions. A leaf module (the builtin plugin
answers `rlbench_fingerprint` with it)."""

from __future__ import annotations

import os
import platform
import sys
from importlib.metadata import PackageNotFoundError, version
from typing import Any


def _package_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def core_fingerprint() -> dict[str, Any]:
    """Cheap facts only: versions come from package metadata, nothing heavy is imported."""
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {
        "hostname": platform.node(),
        "os": f"{platform.system()} {platform.release()}",
        "cpu": _cpu_model(),
        "machine": platform.machine(),
        "cores": os.cpu_count(),
        "cores_usable": affinity,
        "memory_bytes": _memory_bytes(),
        "python": sys.version.split()[0],
        "packages": {name: _package_version(name) for name in ("rlbench", "numpy", "torch", "gymnasium", "pluggy", "ray")},
        "threads_env": {k: os.environ[k] for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS") if k in os.environ},
    }
