"""Device choice, the emulator path, the performance model and the CLI."""

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from rlbench_fpga import device, perf_model


def test_chosen_device_is_described_with_emulation_status():
    chosen, why = device.choose()
    info = device.describe(chosen)
    assert info.type in device.PREFERENCE and why
    assert info.emulation == (info.type != "ACCELERATOR" or "emulat" in info.platform.lower())


def test_no_matching_platform_tells_what_to_install(monkeypatch):
    monkeypatch.setenv(device.PLATFORM_ENV, "no-such-platform")
    with pytest.raises(device.OpenclDeviceError, match="apt-get install pocl-opencl-icd"):
        device.choose()


@pytest.mark.skipif(device.emulator_library() is None,
                    reason="Intel FPGA emulator not installed (pip install intel-opencl-fpga-emu-rt==2025.0.5 ...)")
def test_fpga_emulator_is_chosen_and_runs_the_channel_pipeline():
    code = ("from rlbench.testing import check_replay_memory; from rlbench_fpga.replay import FpgaReplay; "
            "m = FpgaReplay(8); assert m.device_info.type == 'ACCELERATOR' and m.device_info.channels; "
            "check_replay_memory(lambda c: FpgaReplay(c, alpha=0.6, seed=0))")
    env = {k: v for k, v in os.environ.items() if k not in ("OCL_ICD_VENDORS", device.PLATFORM_ENV)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)


def test_model_follows_pearl_formulas():
    board = perf_model.DEFAULT_BOARD
    compute = 2 * 16 * (256 + 5) / board.clock_hz
    transfer = board.dma_latency_s + 256 * (8 + 48) / board.pcie_bytes_per_s
    assert perf_model.sample_seconds(256, 16, 5, 48) == pytest.approx(compute + transfer)
    assert perf_model.update_seconds(256, 5) == pytest.approx(256 * 10 / board.clock_hz + board.dma_latency_s
                                                              + 256 * 8 / board.pcie_bytes_per_s)
    assert perf_model.describe()["timing"] == "modelled"


def test_devices_command_lists_the_choice():
    from rlbench.cli import cli

    result = CliRunner().invoke(cli, ["fpga", "devices", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["chosen"]["device"]["device"] in [d["device"] for d in report["devices"]]
