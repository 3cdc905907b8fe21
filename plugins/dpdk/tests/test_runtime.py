"""`rlbench run --transport dpdk` end to end: replay node, learner and two actors as spawned
processes, all talking memif, with server and in-network placement."""

import json
import subprocess
import sys

import pytest


@pytest.mark.parametrize("placement", ["server", "in-network"])
def test_run_over_dpdk(dpdk_available, placement, tmp_path):
    command = [sys.executable, "-m", "rlbench", "run", "--transport", "dpdk", "--dpdk-port", "memif",
               "--placement", placement, "--actors", "2", "--steps", "1200", "--eval-episodes", "1",
               "--hp", "learning_starts=200", "--no-out", "--json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode in (0, 130), done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["status"] == "complete", result["status_reason"]
    assert result["config"]["transport"] == "dpdk" and result["config"]["options"]["transport"]["port"] == "memif"
    accounting = result["accounting"]
    assert accounting["produced"] >= 1200 and accounting["balanced"] and accounting["dropped"] == 0
    node_link = result["loop"]["links"]["replay"]
    assert node_link["messages_received"] > 0 and node_link["lost"] == 0
