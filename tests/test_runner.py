"""End to end through the CLI: a result is written and readable; Ctrl-C still writes one; the
lifecycle hooks see the configuration and the result."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from support import REPO, interrupt_when_ready, run_cli, write_plugin_dist

SHORT_DQN = ["--steps", "600", "--hp", "learning_starts=200", "--hp", "batch_size=32", "--eval-episodes", "2"]

LIFECYCLE_PLUGIN = """
import json, os
from rlbench.hookspecs import hookimpl

@hookimpl
def rlbench_run_configured(config):
    open(os.environ["RLBENCH_TEST_MARK"] + ".configured", "w").write(config.algo)

@hookimpl
def rlbench_run_finished(result, path):
    open(os.environ["RLBENCH_TEST_MARK"] + ".finished", "w").write(json.dumps([result["status"], path]))
"""


def test_run_writes_a_result_that_show_renders(tmp_path):
    result = run_cli("run", *SHORT_DQN, "--replay", "prioritized", "--out", str(tmp_path), "--json")
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1
    saved = json.loads(files[0].read_text())
    assert saved["schema"] == "rlbench.result/1" and saved["status"] == "complete"
    assert saved["config"]["replay"] == "prioritized" and saved["config"]["total_steps"] == 600
    assert printed["throughput"] == saved["throughput"]
    assert saved["throughput"]["env_steps"] == 600 and saved["throughput"]["updates"] > 0
    acc = saved["accounting"]
    assert acc["produced"] == 600 == acc["stored"] + acc["dropped"] and acc["balanced"]
    for op in ("replay.add", "replay.sample", "replay.update_priorities", "learner.update", "actor.inference"):
        summary = saved["latency"][op]
        assert summary["count"] > 0 and 0 < summary["p50"] <= summary["p99"] <= summary["max"]
    rapl = saved["energy"]["rapl"]  # the core's meter, registered through rlbench_energy_meters
    assert rapl["kind"] in ("measured", None)
    if rapl["kind"] is None:
        assert rapl["reason"] and rapl["joules"] is None
    else:
        assert rapl["joules"] > 0 and rapl["env_steps_per_joule"] > 0
    assert saved["evaluation"]["episodes"] == 2
    assert saved["fingerprint"]["cores"] >= 1

    shown = run_cli("show", str(files[0]))
    assert shown.returncode == 0, shown.stderr
    assert "dqn on CartPole-v1" in shown.stdout and "replay.sample" in shown.stdout
    assert "produced 600 = stored 600 + dropped 0" in shown.stdout


def test_lifecycle_hooks_and_ctrl_c_writes_an_incomplete_result(tmp_path, plugin_dir):
    write_plugin_dist(plugin_dir, "rlbench-mark", "mark", "rlbench_mark", LIFECYCLE_PLUGIN)
    mark = tmp_path / "mark"
    out = tmp_path / "out"
    env = dict(os.environ, RLBENCH_TEST_MARK=str(mark))
    proc = subprocess.Popen([sys.executable, "-m", "rlbench", "run", "--seconds", "300", "--out", str(out)],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = interrupt_when_ready(proc, (tmp_path / "mark.configured").exists, settle_s=1.0)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert "INCOMPLETE (interrupted (Ctrl-C))" in stdout
    files = list(out.glob("*.json"))
    assert len(files) == 1
    saved = json.loads(files[0].read_text())
    assert saved["status"] == "incomplete" and saved["status_reason"] == "interrupted (Ctrl-C)"
    assert saved["accounting"]["balanced"]
    assert (tmp_path / "mark.configured").read_text() == "dqn"
    assert json.loads((tmp_path / "mark.finished").read_text()) == ["incomplete", str(files[0])]
