"""What `rlbench bench replay`, `bench dqn` and `bench ddpg` report (their structure, never their
timings), and cpprb as the replay benchmark calls it (the numpy baseline: tests/test_replay.py)."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
from click.testing import CliRunner

from rlbench.bench import algo
from rlbench.bench.replay import OPERATIONS, command as bench_replay
from rlbench.kit.bench import CpprbPrioritized, cartpole_batch
from rlbench.protocols import Sample
from support import run_cli

CPPRB = importlib.util.find_spec("cpprb") is not None
needs_cpprb = pytest.mark.skipif(not CPPRB, reason="cpprb not installed: pip install cpprb (or rlbench[test])")
MACHINE_STATE_KEYS = {"cores", "busy_processes", "load_before", "other_processes_cores", "contended", "warning"}


# -- bench replay ----------------------------------------------------------------------------------------
def test_bench_replay_reports_every_regime_beside_its_peers():
    # Its own process, as a user runs it: it loads every registered memory (OpenCL's included), and the
    # same call inside a pytest-xdist worker that had run other groups died of SIGABRT twice (cause not
    # found; never outside that worker), taking the worker with it.
    result = run_cli("bench", "replay", "--capacity", "3000", "--hot-capacity", "1000", "--batch-size", "32",
                     "--seconds", "0.05", "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    names = set(report["results"])
    assert {"uniform", "prioritized", "numpy-sumtree"} <= names
    assert ("cpprb" in names) == CPPRB
    for name, measured in report["results"].items():
        assert measured["size"] == 3000, name
        assert set(measured["per_second"]) == set(OPERATIONS), name
        assert all(rate > 0 for rate in measured["per_second"].values()), name
        if CPPRB:
            assert set(measured["ratio_to_cpprb"]) == set(OPERATIONS)
    assert set(report["regimes"]) == {op for op in OPERATIONS if op.startswith(("sample", "update"))}
    assert "1,000 items" in report["regimes"]["sample_hot"] and "learner" in report["learner_sees"]
    assert MACHINE_STATE_KEYS <= set(report["machine_state"]) and report["machine_state"]["busy_processes"] == 1
    assert report["threads"]["torch_threads"] == 1


def test_bench_replay_table_says_the_regimes_the_state_and_refuses_unknown_names():
    runner = CliRunner()
    table = runner.invoke(bench_replay, ["--replay", "prioritized", "--capacity", "2000", "--hot-capacity", "1000",
                                         "--seconds", "0.02"])
    assert table.exit_code == 0, table.output
    assert "prioritized" in table.output and "uniform " not in table.output
    for header in ("sample cold/s", "sample hot/s", "update cold/s", "update hot/s", "update learner/s"):
        assert header in table.output
    assert "machine: quiet" in table.output or "WARNING: measured on a contended machine" in table.output
    assert "a learner on a large memory sees" in table.output
    unknown = runner.invoke(bench_replay, ["--replay", "prioritised", "--capacity", "2000"])
    assert unknown.exit_code != 0
    assert "did you mean 'prioritized'" in str(unknown.exception)


# -- cpprb as its users call it --------------------------------------------------------------------------
@needs_cpprb
def test_cpprb_peer_samples_what_it_was_given_and_takes_its_indices_back():
    memory = CpprbPrioritized(100, alpha=0.6)
    rng = np.random.default_rng(0)
    batch = cartpole_batch(rng, 100)
    batch["reward"] = np.arange(100, dtype=np.float32)  # the reward names the slot
    priorities = np.full(100, 1e-6)
    priorities[7] = 1e6  # all the mass on slot 7
    memory.add(batch, priorities)
    sample = memory.sample(16, 0.4)
    assert isinstance(sample, Sample) and len(memory) == 100
    assert sample.indices.tolist() == [7] * 16
    assert sample.transitions["reward"].ravel().tolist() == [7.0] * 16
    memory.update_priorities(sample.indices, np.full(16, 1e-6, np.float32))  # uint64 indices, as cpprb returns them
    assert len(set(memory.sample(64, 0.4).indices.tolist())) > 1  # slot 7 no longer holds all the mass


# -- bench dqn / bench ddpg ------------------------------------------------------------------------------
@pytest.mark.parametrize("comparison, cleanrl_to_rlbench", [
    (algo.DQN, {"learning_rate": "learning_rate", "buffer_size": "buffer_size", "batch_size": "batch_size",
                "learning_starts": "learning_starts", "train_frequency": "train_every", "gamma": "gamma",
                "tau": "tau", "start_e": "epsilon_start", "end_e": "epsilon_end"}),
    (algo.DDPG, {"learning_rate": "actor_learning_rate", "buffer_size": "buffer_size", "batch_size": "batch_size",
                 "learning_starts": "learning_starts", "gamma": "gamma", "tau": "tau",
                 "exploration_noise": "exploration_noise", "policy_frequency": "policy_delay"}),
], ids=["dqn", "ddpg"])
def test_rlbench_runs_with_the_cleanrl_loops_settings(comparison, cleanrl_to_rlbench):
    from rlbench.bench.cleanrl_ddpg import CleanRLDDPGArgs
    from rlbench.bench.cleanrl_dqn import CleanRLDQNArgs

    cleanrl = {"dqn": CleanRLDQNArgs, "ddpg": CleanRLDDPGArgs}[comparison.algo](total_timesteps=40_000)
    ours = comparison.rlbench_hyperparameters(40_000)
    for theirs, mine in cleanrl_to_rlbench.items():
        assert ours[mine] == getattr(cleanrl, theirs), (theirs, mine)
    if comparison.algo == "dqn":
        assert ours["hidden_sizes"] == (120, 84) and ours["exploration_steps"] == cleanrl.exploration_fraction * 40_000
        assert ours["target_update_every"] * ours["train_every"] == cleanrl.target_network_frequency
    else:
        assert ours["hidden_sizes"] == (256, 256) and ours["critic_learning_rate"] == cleanrl.learning_rate


@pytest.mark.parametrize("command, steps", [(algo.dqn_command, 400), (algo.ddpg_command, 300)], ids=["dqn", "ddpg"])
def test_bench_algo_reports_rates_start_up_returns_settings_and_machine_state(command, steps):
    """Runs shorter than learning_starts: the structure of what is printed, not a speed or a learning result."""
    result = CliRunner().invoke(command, ["--steps", str(steps), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["steps"] == steps and report["threads"]["torch_threads"] == 1
    assert "github.com/vwxyzjn/cleanrl" in report["settings_from"] and report["cleanrl_settings"]["total_timesteps"] == steps
    assert MACHINE_STATE_KEYS <= set(report["machine_state"])
    for side in ("cleanrl", "rlbench"):
        (run,) = report["runs"][side]
        assert run["env_steps"] == steps
        assert run["env_steps_per_s"] > 0 and run["startup_s"] >= 0
        assert run["last_episodes_mean_return"] is not None and run["last_episodes"] >= 1
        assert run["evaluation"]["episodes"] == algo.EVAL_EPISODES
    rates = report["steady_env_steps_per_s"]
    assert report["ratio_rlbench_to_cleanrl"] == pytest.approx(rates["rlbench"] / rates["cleanrl"])
    table = CliRunner().invoke(command, ["--steps", str(steps)])
    assert table.exit_code == 0, table.output
    for text in ("steady steps/s", "start-up s", "greedy eval return", "rlbench/cleanrl =", "settings: CleanRL"):
        assert text in table.output
