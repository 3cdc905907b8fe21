"""Device choice, the emulator path, the performance model and the CLI."""

import json
import os
import subprocess
import sys

import pytest
from rlbench_fpga import device, icd, perf_model


def rlbench_command(*args: str) -> str:
    """The `rlbench` command as users run it (the plugin's commands arrive through its hook)."""
    env = {**os.environ, "POCL_MAX_PTHREAD_COUNT": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "rlbench", *args], capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_chosen_device_is_described_with_emulation_status():
    chosen, why = device.choose()
    info = device.describe(chosen)
    assert info.type in device.PREFERENCE and why
    assert info.emulation == (info.type != "ACCELERATOR" or "emulat" in info.platform.lower())


def test_no_matching_platform_tells_what_to_install(monkeypatch):
    monkeypatch.setenv(device.PLATFORM_ENV, "no-such-platform")
    with pytest.raises(device.OpenclDeviceError, match="apt-get install pocl-opencl-icd"):
        device.choose()


@pytest.mark.skipif(icd.emulator_library() is None,
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
    report = json.loads(rlbench_command("fpga", "devices", "--json"))
    assert report["chosen"]["device"]["device"] in [d["device"] for d in report["devices"]]


def test_bench_command_reports_the_round_beside_its_peers_and_the_dispatch_floor():
    report = json.loads(rlbench_command("fpga", "bench", "--capacity", "2000", "--rounds", "1", "--seconds", "0.01", "--json"))
    replay = report["replay"]
    assert {"fpga", "numpy-sumtree", "opencl-floor"} <= set(replay["measured_us"])
    assert all(us > 0 for us in replay["measured_us"].values())
    assert replay["modelled_us"]["timing"] == "modelled"


@pytest.mark.parametrize("setting, driver", [(None, "basic"), ("pthread", "pthread")])
def test_pocl_runs_commands_in_the_calling_thread_unless_the_user_chose_a_driver(setting, driver):
    if "Portable Computing Language" not in [d.platform.name for d in device.all_devices()]:
        pytest.skip("PoCL is not installed")
    env = {k: v for k, v in os.environ.items() if k not in ("POCL_DEVICES", "OCL_ICD_VENDORS")}
    env["RLBENCH_FPGA_PLATFORM"] = "Portable Computing Language"
    if setting:
        env["POCL_DEVICES"] = setting
    code = "from rlbench_fpga import device; print(device.default_context()[2].device)"
    chosen = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=True)
    assert chosen.stdout.startswith(driver), chosen.stdout
