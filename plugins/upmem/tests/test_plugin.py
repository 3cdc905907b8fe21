from __future__ import annotations

import json
import subprocess
import sys

from click.testing import CliRunner

from rlbench.plugins import build
from rlbench_upmem.cost_model import predict


def test_registers_compute_backend_and_run_options():
    registry, _ = build()
    assert "upmem" in registry.plugins and not [b for b in registry.broken if b.name == "upmem"]
    component = registry.get("compute", "upmem")
    assert component.capabilities.roles == frozenset({"qlearning:tabular", "sarsa:tabular"})
    assert "deep algorithms" in component.capabilities.does_not
    assert component.probe().available
    flags = {o.flag: o for o in registry.options_for("compute", "upmem")}
    assert set(flags) == {"--dpus", "--numeric", "--partition", "--fixed-point-scale", "--tasklets", "--sync-every"}
    assert flags["--numeric"].choices == ("fp32", "int32")
    backend = component.create(**{flags["--dpus"].param: 8, flags["--numeric"].param: "int32"})
    assert backend.tabular(16, 4).dpus == 8


def test_plugin_module_is_cheap_to_import():
    code = "import sys, rlbench_upmem.plugin; print(json.dumps(sorted(m for m in ('numpy', 'torch', 'rlbench_upmem._pim') if m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", "import json; " + code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_fingerprint_says_it_is_an_emulator():
    from rlbench_upmem.plugin import rlbench_fingerprint

    fp = rlbench_fingerprint()
    assert fp["mode"] == "emulator" and fp["emulator_native"] is True
    json.dumps(fp)


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
    assert data["rows"][0]["efficiency"] == 1.0 and data["rows"][-1]["upmem_s"] < data["rows"][0]["upmem_s"]
    assert (tmp_path / "scale.csv").read_text().count("\n") == 4
    assert (tmp_path / "scale.png").exists() or "ideal linear" in (tmp_path / "scale.txt").read_text()


def test_scale_command_refuses_bad_dpu_list(tmp_path):
    from rlbench_upmem.cli import upmem

    result = CliRunner().invoke(upmem, ["scale", "--dpus", "64,abc", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "comma-separated integers" in result.output


def test_bench_command_prints_rates_beside_baselines():
    from rlbench_upmem.cli import upmem

    result = CliRunner().invoke(upmem, ["bench", "--env", "FrozenLake-v1", "--dataset", "10000", "--dpus", "16",
                                        "--epochs", "1", "--python-updates", "2000"])
    assert result.exit_code == 0, result.output
    assert "numpy lock-step" in result.output and "plain Python loop" in result.output
    assert "max |diff| = 0" in result.output  # the lock-step baseline computes the same FP32 tables
