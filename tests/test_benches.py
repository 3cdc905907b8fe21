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
needs_atari = pytest.mark.skipif(
    not all(importlib.util.find_spec(module) for module in ("ale_py", "cv2", "stable_baselines3")),
    reason="the Atari peer needs ale-py, opencv and stable-baselines3: pip install rlbench[envs,test]")
needs_mujoco = pytest.mark.skipif(importlib.util.find_spec("mujoco") is None,
                                  reason="mujoco not installed: pip install rlbench[envs]")
needs_minatar = pytest.mark.skipif(importlib.util.find_spec("minatar") is None,
                                   reason="minatar not installed: pip install rlbench[envs]")
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


@pytest.mark.parametrize("command, steps, env, episodes_end", [
    (algo.dqn_command, 400, None, True), (algo.ddpg_command, 300, None, True),
    # Atari frames through the Nature CNN on both sides, learning from step 30; MinAtar boards (learning
    # from MinAtar's 5,000: none here); HalfCheetah's episodes last 1,000 steps, so none ends in 300
    pytest.param(algo.dqn_command, 300, "ALE/Breakout-v5", True, marks=needs_atari),
    pytest.param(algo.dqn_command, 300, "MinAtar/Breakout-v1", True, marks=needs_minatar),
    pytest.param(algo.ddpg_command, 300, "HalfCheetah-v5", False, marks=needs_mujoco),
], ids=["dqn", "ddpg", "dqn-atari", "dqn-minatar", "ddpg-mujoco"])
def test_bench_algo_reports_rates_start_up_returns_settings_and_machine_state(command, steps, env, episodes_end,
                                                                              monkeypatch):
    """Short runs: the structure of what is printed, not a speed or a learning result."""
    options = ["--steps", str(steps)]
    if env:
        options += ["--env", env]
        monkeypatch.setattr(algo, "EVAL_EPISODES", 1)  # an evaluation episode of Atari or MuJoCo costs seconds
    result = CliRunner().invoke(command, [*options, "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["steps"] == steps and report["threads"]["torch_threads"] == 1
    assert report["env"] == (env or command.params[0].default)
    comparison = algo.comparison_for(command.name, report["env"])
    assert report["settings_from"] == comparison.settings_from
    assert report["cleanrl_settings"]["total_timesteps"] == steps
    assert ("github.com/kenjyoung/MinAtar" if "MinAtar" in report["env"] else "github.com/vwxyzjn/cleanrl") \
        in report["settings_from"]
    assert MACHINE_STATE_KEYS <= set(report["machine_state"])
    assert all(report["returns"][side]["training"] and report["returns"][side]["evaluation"]
               for side in ("cleanrl", "rlbench"))
    for side in ("cleanrl", "rlbench"):
        (run,) = report["runs"][side]
        assert run["env_steps"] == steps
        assert run["env_steps_per_s"] > 0 and run["startup_s"] >= 0
        assert (run["last_episodes_mean_return"] is not None and run["last_episodes"] >= 1) == episodes_end
        assert run["evaluation"]["episodes"] == algo.EVAL_EPISODES
    if env:  # the comparison's settings reached rlbench's run, not its family's preset
        starts = comparison.rlbench_hyperparameters(steps)["learning_starts"]
        assert report["runs"]["rlbench"][0]["hyperparameters"]["learning_starts"] == starts
        assert report["cleanrl_settings"]["learning_starts"] == starts
    rates = report["steady_env_steps_per_s"]
    assert report["ratio_rlbench_to_cleanrl"] == pytest.approx(rates["rlbench"] / rates["cleanrl"])
    if env:  # the table of the same report (the command's table path is the default envs')
        table = algo.format_report(report)
    else:
        invoked = CliRunner().invoke(command, options)
        assert invoked.exit_code == 0, invoked.output
        table = invoked.output
    assert set(report["runs"]["rlbench"][0]["time_split_s"]) == set(algo.TIME_SPLIT)
    for text in ("steady steps/s", "start-up s", "eval return", "rlbench/cleanrl =",
                 "# settings: " + report["settings_from"], "rlbench run 0, seconds in: env"):
        assert text in table


def test_atari_and_mujoco_comparisons_map_cleanrls_settings_and_scale_them_to_the_budget():
    """The Atari comparison in rlbench's terms: the target period in updates, CleanRL's loss, target and
    no clipping; learning from the first tenth of a short run, CleanRL's 80,000 / 25,000 on long ones."""
    for steps, starts in ((10_000, 1_000), (2_000_000, 80_000)):
        cleanrl = algo.dqn_atari_args(steps)
        ours = algo.DQN_ATARI.rlbench_hyperparameters(steps)
        names = {"learning_rate": "learning_rate", "buffer_size": "buffer_size", "gamma": "gamma", "tau": "tau",
                 "batch_size": "batch_size", "learning_starts": "learning_starts", "train_frequency": "train_every",
                 "start_e": "epsilon_start", "end_e": "epsilon_end"}
        for theirs, mine in names.items():
            assert ours[mine] == getattr(cleanrl, theirs), (theirs, mine)
        assert cleanrl.learning_starts == ours["learning_starts"] == starts
        assert cleanrl.buffer_size == min(steps, 1_000_000) and cleanrl.env_id == "BreakoutNoFrameskip-v4"
        assert (cleanrl.learning_rate, cleanrl.batch_size, cleanrl.end_e) == (1e-4, 32, 0.01)
        assert ours["target_update_every"] == 250 and ours["target_update_every"] * ours["train_every"] == 1000
        assert ours["exploration_steps"] == cleanrl.exploration_fraction * steps
        assert (ours["loss"], ours["double_dqn"], ours["max_grad_norm"]) == ("mse", False, 0.0)
    mujoco = algo.DDPG_MUJOCO.rlbench_hyperparameters(10_000)
    assert mujoco["learning_starts"] == algo.ddpg_mujoco_args(10_000).learning_starts == 1_000
    assert algo.ddpg_mujoco_args(2_000_000).learning_starts == 25_000
    assert {k: v for k, v in mujoco.items() if k != "learning_starts"} == {
        k: v for k, v in algo.DDPG.rlbench_hyperparameters(10_000).items() if k != "learning_starts"}


def test_minatar_comparison_runs_minatars_settings_on_both_sides_as_rlbenchs_preset():
    """MinAtar examples/dqn.py's settings in rlbench's terms are rlbench's "minatar" preset (what a plain
    `rlbench run --env MinAtar/...` gets), with actors given every update's weights as the peer acts on them."""
    from rlbench.algorithms.dqn import DQN

    ours = algo.DQN_MINATAR.rlbench_hyperparameters(150_000)
    theirs = algo.dqn_minatar_args(150_000)
    names = {"learning_rate": "learning_rate", "buffer_size": "buffer_size", "gamma": "gamma",
             "batch_size": "batch_size", "learning_starts": "learning_starts", "train_frequency": "train_every",
             "start_e": "epsilon_start", "end_e": "epsilon_end", "target_network_frequency": "target_update_every"}
    for their_name, our_name in names.items():
        assert ours[our_name] == getattr(theirs, their_name), (their_name, our_name)
    assert (theirs.batch_size, theirs.buffer_size, theirs.target_network_frequency, theirs.learning_starts) == \
        (32, 100_000, 1_000, 5_000)
    assert ours["exploration_steps"] == theirs.learning_starts + theirs.exploration_frames == 105_000
    preset = DQN.presets["minatar"]
    assert {k: v for k, v in ours.items() if k in preset} == {k: v for k, v in preset.items() if k in ours}
    assert ours["publish_every"] == 1 and ours["loss"] == "huber" and theirs.optimizer == "adam"
    assert "centered RMSProp" in algo.DQN_MINATAR.departures


@needs_minatar
def test_minatar_peer_learns_from_minatars_own_env_with_minatars_schedule(monkeypatch):
    """A few hundred steps of the MinAtar peer with an early start and a short target period: MinAtar's
    gymnasium boards (bool, height x width x channels) in its memory, one update per step after
    learning starts, a target copy every `target_network_frequency` updates, MinAtar's epsilon."""
    import torch

    from rlbench.bench import cleanrl_dqn_minatar as peer
    from rlbench.errors import RlbenchError

    memories, samples, copies = [], [], []

    class WatchedBuffer(peer.SimpleReplayBuffer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            memories.append(self)

        def sample(self, batch_size):
            samples.append(batch_size)
            return super().sample(batch_size)

    load_state_dict = torch.nn.Module.load_state_dict
    monkeypatch.setattr(peer, "SimpleReplayBuffer", WatchedBuffer)
    monkeypatch.setattr(torch.nn.Module, "load_state_dict", lambda self, *a, **k: copies.append(1) or
                        load_state_dict(self, *a, **k))
    steps, starts = 400, 100
    args = peer.CleanRLDQNMinAtarArgs(total_timesteps=steps, learning_starts=starts, target_network_frequency=50,
                                      batch_size=8, seed=3)
    result = peer.run(args, eval_episodes=2)

    (memory,) = memories
    assert memory.observations.shape == (100_000, 10, 10, 4) and memory.observations.dtype == np.bool_
    assert memory.pos == steps and memory.observations[:steps].any() and not memory.observations[steps:].any()
    updates = steps - starts - 1  # MinAtar learns at frames t > REPLAY_START_SIZE, one update each
    assert samples == [8] * updates and len(copies) == 1 + updates // 50
    assert [peer.epsilon_at(args, t) for t in (0, starts - 1, starts, starts + 50_000, starts + 100_000, 10**6)] == \
        pytest.approx([1.0, 1.0, 1.0, 0.55, 0.1, 0.1])
    assert set(result) == {"settings", "env_steps", "wall_s", "startup_s", "env_steps_per_s", "learning_curve",
                           "evaluation"}  # what every CleanRL-style loop reports (cleanrl_dqn.loop_result)
    curve = result["learning_curve"]
    assert curve and [p["step"] for p in curve] == sorted(p["step"] for p in curve) and curve[-1]["step"] <= steps
    assert all(p["return"] >= 0 and p["return"] == int(p["return"]) for p in curve)  # bricks hit, raw
    assert result["evaluation"]["episodes"] == 2 and result["settings"]["optimizer"] == "adam"
    with pytest.raises(RlbenchError, match="'adam' or 'rmsprop'"):
        peer.run(peer.CleanRLDQNMinAtarArgs(total_timesteps=10, optimizer="sgd"), eval_episodes=0)


def test_bench_algo_study_writes_both_sides_as_one_study_a_report_reads(tmp_path, monkeypatch):
    """`--study DIR`: rlbench's run and the CleanRL-style loop's, each a result under DIR/runs, one study
    whose axis is the harness: the report's estimates and curves cover both sides."""
    from rlbench.report.collect import group, load_inputs
    from rlbench.report.measures import measures

    monkeypatch.setattr(algo, "EVAL_EPISODES", 2)
    folder = tmp_path / "cartpole-dqn"
    for seed in (1, 2):  # two processes' worth of seeds into one folder
        done = CliRunner().invoke(algo.dqn_command, ["--steps", "400", "--seed", str(seed), "--study", str(folder)])
        assert done.exit_code == 0, done.output
    assert sorted(p.name for p in (folder / "runs").iterdir()) == [
        f"harness-{side}_seed-{seed}.json" for side in ("cleanrl-style", "rlbench") for seed in (1, 2)]
    (study,) = group(load_inputs([str(folder)]))
    assert study.name == "cartpole-dqn" and study.axes == ["harness"]
    assert [c.label for c in study.combinations] == ["harness=cleanrl-style", "harness=rlbench"]
    for combination in study.combinations:
        assert sorted(run.data["config"]["seed"] for run in combination.runs) == [1, 2]
        for run in combination.runs:
            assert run.env == "CartPole-v1" and run.data["evaluation"]["episodes"] == 2
            assert run.data["learning_curve"] and run.data["machine_state"]["cores"] >= 1
    peer = study.combinations[0].runs[0].data
    assert peer["hyperparameters"]["total_timesteps"] == 400 and "cleanrl/dqn.py" in peer["notes"][0]
    assert {"final_return", "steady_env_steps_per_s"} <= {m.key for m in measures(study)}


def test_bench_algo_picks_its_comparison_by_env_and_refuses_one_without_a_comparison():
    from rlbench.errors import RlbenchError

    assert algo.comparison_for("dqn", "MinAtar/Breakout-v1") is algo.DQN_MINATAR
    assert algo.comparison_for("dqn", "ALE/Breakout-v5") is algo.DQN_ATARI
    assert algo.comparison_for("ddpg", "HalfCheetah-v5") is algo.DDPG_MUJOCO
    assert algo.comparison_for("ddpg", "Pendulum-v1") is algo.DDPG
    refused = CliRunner().invoke(algo.dqn_command, ["--env", "ALE/Pong-v5", "--steps", "10"])
    assert refused.exit_code != 0 and isinstance(refused.exception, RlbenchError)
    message = str(refused.exception)
    assert "'ALE/Pong-v5'" in message and "CartPole-v1, ALE/Breakout-v5, MinAtar/Breakout-v1" in message
    assert "\n" not in message
    assert "did you mean 'HalfCheetah-v5'" in str(pytest.raises(RlbenchError, algo.comparison_for, "ddpg",
                                                                 "HalfCheetah-v4").value)
    assert "--env" in CliRunner().invoke(algo.ddpg_command, ["--help"]).output


@needs_atari
def test_cleanrl_style_atari_loop_trains_on_frames_through_sb3s_frame_sharing_buffer(monkeypatch):
    """A few hundred steps of the CleanRL-style dqn_atari loop with a small memory and an early start:
    SB3's buffer as CleanRL builds it (each stacked observation stored once), the updates CleanRL's
    schedule makes, and the fields every CleanRL-style loop reports."""
    import stable_baselines3.common.buffers as sb3_buffers

    from rlbench.bench.cleanrl_dqn_atari import CleanRLDQNAtariArgs, run

    built, samples = [], []

    class WatchedReplayBuffer(sb3_buffers.ReplayBuffer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built.append((self, kwargs))

        def sample(self, batch_size, env=None):
            samples.append(batch_size)
            return super().sample(batch_size, env)

    monkeypatch.setattr(sb3_buffers, "ReplayBuffer", WatchedReplayBuffer)
    steps, starts = 300, 100
    args = CleanRLDQNAtariArgs(total_timesteps=steps, learning_starts=starts, buffer_size=1_000, batch_size=8)
    result = run(args, eval_episodes=1)

    (memory, kwargs), = built
    assert kwargs == {"optimize_memory_usage": True, "handle_timeout_termination": False}
    assert not hasattr(memory, "next_observations")  # next_obs is the next slot's obs: each stack stored once
    assert memory.observations.shape == (1_000, 1, 4, 84, 84) and memory.observations.dtype == np.uint8
    assert memory.pos == steps and memory.observations[:steps].any() and not memory.observations[steps + 1:].any()
    assert samples == [8] * sum(1 for step in range(starts + 1, steps) if step % args.train_frequency == 0)
    assert set(result) == {"settings", "env_steps", "wall_s", "startup_s", "env_steps_per_s", "learning_curve",
                           "evaluation"}  # what every CleanRL-style loop reports (cleanrl_dqn.loop_result)
    assert result["env_steps"] == steps and result["env_steps_per_s"] > 0 and result["settings"]["batch_size"] == 8
    # whole games' raw scores: at least one of Breakout's 5-life games ends within 300 agent steps of a
    # mostly random policy, and its score counts bricks (never negative, whole numbers)
    returns = [point["return"] for point in result["learning_curve"]]
    assert returns and all(r >= 0 and r == int(r) for r in returns)
    assert result["evaluation"]["episodes"] == 1
