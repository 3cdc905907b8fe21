"""Energy meters come from plugins through rlbench_energy_meters (the core's RAPL meter too); the
runner labels nothing measured that no counter measured."""

from __future__ import annotations

from rlbench import plugins
from rlbench.config import RunConfig
from rlbench.energy import EnergyMeters, RaplMeter


class CountingMeter:
    name = "fake-board"

    def __init__(self) -> None:
        self.started = self.closed = False

    def start(self) -> None:
        self.started = True

    def stop(self) -> dict:
        return {"kind": "measured", "joules": 50.0, "source": "fake-board"}

    def close(self) -> None:
        self.closed = True


def test_meters_from_plugins_and_per_joule_rates(monkeypatch):
    meter = CountingMeter()

    class Board:
        @plugins.hookspecs.hookimpl
        def rlbench_energy_meters(self, config):
            return [meter]

    class Broken:
        @plugins.hookspecs.hookimpl
        def rlbench_energy_meters(self, config):
            raise RuntimeError("counter driver missing")

    registry, manager = plugins.build([("board", Board()), ("broken", Broken())], load_entry_points=False)
    monkeypatch.setattr(plugins, "_registry", registry)
    monkeypatch.setattr(plugins, "_manager", manager)
    meters = EnergyMeters(RunConfig())
    meters.start()
    energy = meters.stop({"samples": 1000, "env_steps": 200})
    assert meter.started and meter.closed
    assert energy["fake-board"]["samples_per_joule"] == 20.0 and energy["fake-board"]["env_steps_per_joule"] == 4.0
    assert energy["broken"] == {"kind": None, "joules": None, "source": "broken",
                                "reason": energy["broken"]["reason"]}
    assert "counter driver missing" in energy["broken"]["reason"]
    rapl = energy["rapl"]
    assert (rapl["kind"] == "measured") == (rapl["joules"] is not None)
    if rapl["joules"] is None:
        assert "samples_per_joule" not in rapl and rapl["reason"]


def test_rapl_without_counters_says_why(monkeypatch):
    monkeypatch.setattr("rlbench.builtin.energy.RAPL_GLOB", "/nonexistent/intel-rapl:*/energy_uj")
    meter = RaplMeter()
    meter.start()
    reading = meter.stop()
    assert reading["kind"] is None and reading["joules"] is None and "no RAPL counters" in reading["reason"]
