from __future__ import annotations

import json
import re
import subprocess
import sys

import importlib.util

import pytest
from click.testing import CliRunner

from rlbench import get_registry, plugins
from rlbench.config import RunConfig
from rlbench.errors import InvalidCombinationError
from rlbench.hookspecs import hookimpl
from rlbench.protocols import EnvironmentCapabilities
from rlbench.validate import validate
from rlbench_upmem.cost_model import predict

HAS_NUMBA = importlib.util.find_spec("numba") is not None


def test_registers_compute_backend_and_run_options():
    registry = get_registry(refresh=True)
    assert "upmem" in registry.plugins and not [b for b in registry.broken if b.name == "upmem"]
    component = registry.get("compute", "upmem")
    assert component.capabilities.roles == frozenset({"qlearning:tabular", "sarsa:tabular"})
    assert "deep algorithms" in component.capabilities.does_not
    assert component.probe().available
    flags = {o.flag: o for o in registry.options_for("compute", "upmem")}
    assert set(flags) == {"--upmem-dpus", "--upmem-numeric", "--upmem-partition", "--upmem-fixed-point-scale",
                      "--upmem-tasklets", "--upmem-sync-every"}  # prefixed: flags are one namespace
    assert flags["--upmem-numeric"].choices == ("fp32", "int32")
    backend = component.create(**{flags["--upmem-dpus"].param: 8, flags["--upmem-numeric"].param: "int32"})
    assert backend.tabular(16, 4).dpus == 8


def test_plugin_module_is_cheap_to_import():
    heavy = ('numpy', 'torch', 'numba', 'rlbench_upmem._pim')
    code = f"import sys, rlbench_upmem.plugin; print(json.dumps(sorted(m for m in {heavy} if m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", "import json; " + code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_only_the_benchmark_imports_numba():
    code = ("import sys, rlbench_upmem.cli, rlbench_upmem.bench, rlbench_upmem.backend, rlbench_upmem.scale; "
            "print('numba' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_fingerprint_says_it_is_an_emulator():
    from rlbench_upmem.backend import UpmemCompute
    from rlbench_upmem.plugin import rlbench_fingerprint

    fp = rlbench_fingerprint()
    assert fp["mode"] == "emulator" and fp["emulator_native"] is True
    assert UpmemCompute(dpus=8).fingerprint() == fp | {"settings": UpmemCompute(dpus=8).settings}
    json.dumps(fp)


def test_run_option_refuses_more_dpus_than_the_modelled_server_has():
    flags = {o.flag: o for o in get_registry().options_for("compute", "upmem")}
    assert flags["--upmem-dpus"].type("2560") == 2560
    out = subprocess.run([sys.executable, "-m", "rlbench", "run", "--algo", "qlearning", "--env", "FrozenLake-v1",
                          "--compute", "upmem", "--dataset", "10000", "--upmem-dpus", "100000", "--no-out"],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "100,000 DPUs" in lines[0] and "2,560 DPUs" in lines[0], out.stderr


@pytest.mark.parametrize("args", [["scale", "--dpus", "64,2561"], ["bench", "--dpus", "2561"]])
def test_upmem_commands_refuse_more_dpus_than_the_modelled_server_has(args, tmp_path):
    from rlbench_upmem.cli import upmem

    result = CliRunner().invoke(upmem, args + (["--out", str(tmp_path)] if args[0] == "scale" else []))
    assert result.exit_code == 2 and "2,560 DPUs in a 20-DIMM UPMEM server" in result.output, result.output


def base(**kw):
    args = dict(rule="qlearning", numeric="fp32", scale=1 << 16, dpus=64, tasklets=16, chunk_records=15_625,
                total_records=1_000_000, n_states=500, n_actions=6, epochs=10, rounds=1)
    return predict(**(args | kw))


def test_cost_model_pipeline_fills_at_eleven_tasklets():
    kernel = {t: base(tasklets=t)["seconds"]["kernel"] for t in (1, 2, 4, 8, 11, 16, 24)}
    assert kernel[1] > kernel[2] > kernel[4] > kernel[8] > kernel[11]
    assert kernel[11] == kernel[16] == kernel[24]
    assert base(tasklets=4)["pipeline_occupancy"] == 4 / 11


def test_cost_model_scales_near_linearly_and_int32_is_cheaper():
    t64 = base()["seconds"]["kernel"]
    t1024 = base(dpus=1024, chunk_records=977)["seconds"]["kernel"]
    assert 14 < t64 / t1024 <= 16.1
    fp32, int32 = base(), base(numeric="int32")
    assert int32["cycles_per_update"] < fp32["cycles_per_update"]
    assert fp32["kind"] == int32["kind"] == "modelled"


def test_scale_command_writes_table_and_chart(tmp_path):
    from rlbench_upmem.cli import upmem

    result = CliRunner().invoke(upmem, ["scale", "--env", "FrozenLake-v1", "--dataset", "10000", "--dpus", "4,8,16",
                                        "--epochs", "2", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "UPMEM s [modelled]" in result.output and "emulator s [measured]" in result.output
    data = json.loads((tmp_path / "scale.json").read_text())
    assert [row["dpus"] for row in data["rows"]] == [4, 8, 16]
    # Every figure is one kind: the CPU is compared with the emulator (both measured), never with the model.
    headers = (tmp_path / "scale.csv").read_text().splitlines()[0].split(",")
    assert all(h.endswith(("[measured]", "[modelled]")) for h in headers[1:]), headers
    assert "CPU s / emulator s [measured]" in headers and "speed-up vs CPU" not in result.output
    for row in data["rows"]:
        assert row["cpu_over_emulator"] == pytest.approx(row["cpu_s"] / row["emulator_s"])
    assert "cpu_over_emulator" in data["labels"]["measured"] and "upmem_s" in data["labels"]["modelled"]
    assert data["rows"][0]["efficiency"] == 1.0 and data["rows"][-1]["upmem_s"] < data["rows"][0]["upmem_s"]
    assert (tmp_path / "scale.csv").read_text().count("\n") == 4
    assert (tmp_path / "scale.png").exists() or "ideal linear" in (tmp_path / "scale.txt").read_text()


def test_scale_command_refuses_bad_dpu_list(tmp_path):
    from rlbench_upmem.cli import upmem

    result = CliRunner().invoke(upmem, ["scale", "--dpus", "64,abc", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "comma-separated integers" in result.output


BENCH = ["bench", "--env", "FrozenLake-v1", "--dataset", "10000", "--dpus", "16", "--epochs", "1",
         "--python-updates", "2000", "--rounds", "1", "--seconds", "0.01"]


@pytest.mark.skipif(not HAS_NUMBA, reason="numba is not installed (pip install -e 'plugins/upmem[bench]')")
def test_bench_command_prints_rates_beside_numba_and_baselines():
    from rlbench_upmem.cli import upmem

    result = CliRunner().invoke(upmem, BENCH)
    assert result.exit_code == 0, result.output
    numba_line = next(line for line in result.output.splitlines() if "numba single-table loop (numba" in line)
    assert "emulator / numba = " in numba_line
    assert "vs the emulator on 1 DPU: max |diff| = 0)" in numba_line  # the same FP32 sequential sweep
    assert "numpy lock-step" in result.output and "plain Python loop" in result.output
    assert "emulator vs numpy lock-step tables: max |diff| = 0" in result.output  # the same FP32 tables


def test_bench_command_without_numba_says_how_to_install_it():
    code = ("import sys; sys.modules['numba'] = None; from rlbench_upmem.cli import upmem; "
            f"upmem({BENCH!r}, standalone_mode=False)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = [line for line in out.stdout.splitlines() if "numba" in line]
    assert len(lines) == 1 and re.fullmatch(r"  numba single-table loop: numba is not installed: "
                                            r"pip install 'numba==\d+\.\d+\.\d+'", lines[0]), lines
    assert "emulator vs numpy lock-step tables: max |diff| = 0" in out.stdout


class ImageEnvironment:
    """A plugin registering an environment of uint8 frames (never built: validation refuses first)."""

    @hookimpl
    def rlbench_register_environments(self, register):
        register("frames/Frames-v0", "rlbench_test_frames:make", capabilities=EnvironmentCapabilities(
            action_space="discrete", observation_space="image", family="minatar"))


@pytest.mark.parametrize("env", ["frames/Frames-v0", "ALE/Breakout-v5"])
def test_an_image_run_is_refused_before_it_starts_with_the_reason(env):
    registry, _ = plugins.build([("frames", ImageEnvironment())])
    if env not in registry.names("environment"):
        pytest.skip(f"{env} is not registered here (ale-py's environments are the core's)")
    with pytest.raises(InvalidCombinationError) as refused:
        validate(RunConfig(algo="dqn", env=env, compute="upmem"), registry)
    message = str(refused.value)
    assert f"{env} has image observations" in message and "compute backend upmem runs no network" in message
    assert "no convolution" in message and "compute backends that run a CNN: cpu" in message
