"""NVML energy: without an NVIDIA driver the meter says why and reports no joules; runs that use a
gpu component get the meter through rlbench_energy_meters."""

import pytest
import torch

from rlbench.config import RunConfig
from rlbench_gpu import plugin
from rlbench_gpu.energy import NvmlMeter


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-NVIDIA path")
def test_without_nvml_the_meter_reports_the_reason_and_no_figure():
    meter = NvmlMeter(0)
    meter.start()
    energy = meter.stop()
    meter.close()
    assert energy["kind"] is None and energy["joules"] is None and energy["source"] == "nvml"
    assert energy["reason"].startswith(("pynvml not installed", "NVML unavailable"))


def test_runs_with_gpu_components_get_an_nvml_meter_and_others_none():
    meters = plugin.rlbench_energy_meters(config=RunConfig(compute="gpu"))
    assert [m.name for m in meters] == ["nvml"]
    meters[0].start()
    reading = meters[0].stop()
    meters[0].close()
    assert reading["source"] == "nvml" and (reading["kind"] == "measured") == (reading["joules"] is not None)
    assert plugin.rlbench_energy_meters(config=RunConfig(compute="cpu")) is None


def test_the_runner_puts_every_meter_under_its_name():
    from rlbench.energy import EnergyMeters

    meters = EnergyMeters(RunConfig(replay="gpu"))
    meters.start()
    energy = meters.stop({"samples": 10, "env_steps": 5})
    assert {"rapl", "nvml"} <= set(energy)
    for reading in energy.values():
        assert reading["kind"] in ("measured", None)
        assert (reading["joules"] is None) == (reading["kind"] is None)
