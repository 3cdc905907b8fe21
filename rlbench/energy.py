"""A run's energy meters: every meter the plugins offer through `rlbench_energy_meters` (the core's
RAPL meter, rlbench.builtin.energy, comes through the same hook), started and stopped together.

Never a made-up measured figure: a result says `"kind": "measured"` only with a counter behind it;
otherwise the entry is null with the reason.
"""

from __future__ import annotations

from typing import Any

from rlbench.builtin.energy import RaplMeter  # noqa: F401  (the core's meter, where users look for it)
from rlbench.plugins import call_hook_safely

class EnergyMeters:
    """Every meter the plugins offer for a run (the core's RAPL meter comes through the same hook)."""

    def __init__(self, config: Any) -> None:
        self.meters: list[Any] = []
        self.failed: dict[str, Any] = {}
        for plugin, meters in call_hook_safely("rlbench_energy_meters", config=config):
            if isinstance(meters, dict) and "error" in meters:
                self.failed[plugin] = {"kind": None, "joules": None, "source": plugin, "reason": meters["error"]}
            else:
                self.meters.extend(meters or [])

    def start(self) -> None:
        for meter in self.meters:
            meter.start()

    def stop(self, throughput: dict[str, Any]) -> dict[str, Any]:
        """{meter name: reading}, with samples and env steps per joule where joules were measured."""
        readings = dict(self.failed)
        for meter in self.meters:
            try:
                reading = meter.stop()
            finally:
                close = getattr(meter, "close", None)
                if close is not None:
                    close()
            if reading.get("joules"):
                reading = {**reading, "samples_per_joule": throughput.get("samples", 0) / reading["joules"],
                           "env_steps_per_joule": throughput.get("env_steps", 0) / reading["joules"]}
            readings[meter.name] = reading
        return readings
