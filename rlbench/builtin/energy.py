"""The core's energy meter: RAPL counters when the kernel exposes them; otherwise null with the reason.
A leaf module (the builtin plugin registers it through `rlbench_energy_meters`)."""

from __future__ import annotations

import glob
import os
from typing import Any

RAPL_GLOB = "/sys/class/powercap/intel-rapl:*/energy_uj"


class RaplMeter:
    """Package energy summed over every readable RAPL domain of the top level (one per socket)."""

    name = "rapl"

    def __init__(self) -> None:
        self.paths = [p for p in sorted(glob.glob(RAPL_GLOB)) if p.count(":") == 1]
        self.reason = ""
        if not self.paths:
            self.reason = "no RAPL counters at /sys/class/powercap (virtual machine or non-Intel CPU)"
        elif not all(os.access(p, os.R_OK) for p in self.paths):
            self.reason = "RAPL counters are not readable by this user (root needed since Linux 5.10)"
        self._start: list[int] | None = None
        self._ranges = [self._read_int(os.path.join(os.path.dirname(p), "max_energy_range_uj")) for p in self.paths]

    @staticmethod
    def _read_int(path: str) -> int:
        try:
            with open(path) as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            return 0

    @property
    def available(self) -> bool:
        return not self.reason

    def start(self) -> None:
        if self.available:
            self._start = [self._read_int(p) for p in self.paths]

    def stop(self) -> dict[str, Any]:
        if not self.available or self._start is None:
            return {"kind": None, "joules": None, "source": "rapl", "reason": self.reason or "meter not started"}
        total_uj = 0
        for path, begin, wrap in zip(self.paths, self._start, self._ranges):
            end = self._read_int(path)
            total_uj += end - begin if end >= begin else end + wrap - begin  # counter wrapped
        return {"kind": "measured", "joules": total_uj / 1e6, "source": "rapl", "domains": len(self.paths)}
