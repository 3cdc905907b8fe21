"""The chain plugin through rlbench's public surface only: the environment conformance kit, an online
Q-learning run that learns, and offline datasets collected through the registry per chain length."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import rlbench
from rlbench.testing import check_environment

from rlbench_chain import BACK_REWARD, CAPABILITIES

# Every reward but the far end's is at most BACK_REWARD a step, so an episode returning more than
# this has reached the far end (and beaten always going back).
ONLY_BACK = BACK_REWARD * CAPABILITIES.max_episode_steps


def test_passes_the_environment_conformance_kit():
    check_environment("chain")  # the registered factory, held to its registered capabilities
    report = check_environment("chain", options={"length": 12, "slip": 0.3, "back": "start"},
                               expect=lambda env: (env.spec.n_states, env.slip, env.back) == (12, 0.3, "start"))
    assert "options ['back', 'length', 'slip'] reach the environment" in report.checked


def test_each_run_option_names_a_parameter_of_the_environment():
    options = rlbench.get_registry().options_for("environment", "chain")
    assert {option.flag: option.param for option in options} == \
        {"--chain-length": "length", "--chain-slip": "slip", "--chain-back": "back"}


def test_qlearning_walks_to_the_far_end():
    result = rlbench.run(rlbench.RunConfig(algo="qlearning", env="chain", steps=20_000,
                                           options={"environment": {"length": 8}}))
    assert result["status"] == "complete"
    assert result["evaluation"]["mean_return"] > ONLY_BACK, result["evaluation"]


# Run in a fresh process, to show that collecting a dataset never imports gymnasium.
OFFLINE_RUNS = """
import json, sys, rlbench
def offline(length):
    result = rlbench.run(rlbench.RunConfig(algo="sarsa", env="chain", dataset=20_000,
                                           options={"environment": {"length": length}}))
    return {"status": result["status"], "dataset": result["loop"]["dataset"], "evaluation": result["evaluation"]}
runs = [offline(8), offline(12), offline(8)]
print(json.dumps({"runs": runs, "gymnasium imported": "gymnasium" in sys.modules}))
"""


def test_offline_datasets_are_collected_per_chain_length(tmp_path):
    done = subprocess.run([sys.executable, "-c", OFFLINE_RUNS], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "RLBENCH_CACHE": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert not report["gymnasium imported"]
    eight, twelve, eight_again = report["runs"]
    for run in (eight, twelve):
        assert run["status"] == "complete" and not run["dataset"]["cached"]
        assert run["evaluation"]["mean_return"] > ONLY_BACK, run["evaluation"]
        assert os.path.exists(run["dataset"]["path"])
    assert twelve["dataset"]["path"] != eight["dataset"]["path"]  # the options are part of the key
    assert eight_again["dataset"]["cached"] and eight_again["dataset"]["path"] == eight["dataset"]["path"]
