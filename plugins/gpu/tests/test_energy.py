"""NVML energy: without an NVIDIA driver the meter says why and reports no joules; runs that use a
gpu component get the meter through rlbench_energy_meters."""

import pytest
import torch

from rlbench import RunConfig, run
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


@pytest.mark.skipif(not torch.cuda.is_available(), reason=f"a run with compute gpu needs a CUDA device: "
                                                          f"torch.cuda.is_available() is False (torch {torch.__version__})")
def test_a_run_with_a_gpu_component_reports_nvml_beside_the_other_meters():
    energy = run(RunConfig(compute="gpu", steps=200, eval_episodes=0, hyperparameters={"learning_starts": 100}))["energy"]
    assert {"rapl", "nvml"} <= set(energy)
    for reading in energy.values():
        assert reading["kind"] in ("measured", None)
        assert (reading["joules"] is None) == (reading["kind"] is None)
