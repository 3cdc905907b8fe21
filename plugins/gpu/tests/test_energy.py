"""NVML energy: without an NVIDIA driver the meter says why and reports no joules; the run hooks add
the entry to the result and its file."""

import json

import pytest
import torch

from rlbench.config import RunConfig
from rlbench_gpu import plugin
from rlbench_gpu.energy import NvmlMeter, per_joule


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-NVIDIA path")
def test_without_nvml_the_meter_reports_the_reason_and_no_figure():
    meter = NvmlMeter(0)
    meter.start()
    energy = meter.stop()
    meter.close()
    assert energy["kind"] is None and energy["joules"] is None and energy["source"] == "nvml"
    assert energy["reason"].startswith(("pynvml not installed", "NVML unavailable"))


def test_per_joule_figures_come_from_the_measured_joules():
    energy = per_joule({"kind": "measured", "joules": 50.0}, {"samples": 1000, "env_steps": 200})
    assert energy["samples_per_joule"] == 20.0 and energy["env_steps_per_joule"] == 4.0
    assert per_joule({"kind": None, "joules": None}, {"samples": 5}) == {"kind": None, "joules": None}


def test_run_hooks_add_the_nvml_entry_to_the_result_and_its_file(tmp_path):
    path = tmp_path / "result.json"
    result = {"energy": {"kind": None, "joules": None, "source": "rapl"}, "throughput": {"samples": 10, "env_steps": 5},
              "path": str(path)}
    path.write_text(json.dumps(result))
    plugin.rlbench_run_configured(config=RunConfig(compute="gpu"))
    plugin.rlbench_run_finished(result=result, path=str(path))
    entry = result["energy"]["nvml"]
    assert entry["source"] == "nvml" and (entry["kind"] == "measured") == (entry["joules"] is not None)
    assert json.loads(path.read_text())["energy"]["nvml"] == entry


def test_runs_without_gpu_components_are_not_metered():
    result = {"energy": {}, "throughput": {}}
    plugin.rlbench_run_configured(config=RunConfig(compute="cpu"))
    plugin.rlbench_run_finished(result=result, path=None)
    assert "nvml" not in result["energy"]
