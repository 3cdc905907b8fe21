"""`rlbench bench actors` (EMC2'20's actor sweep) on a job at its real size: with an image environment
the actors run the CNN on every step, the family's preset is overridden for a short run and the output
says so, and the knee and each role's time are reported (their structure, never their timings)."""

from __future__ import annotations

import importlib.util
import json

import pytest
from click.testing import CliRunner

from rlbench.bench import runtime
from rlbench.errors import RlbenchError
from rlbench.plugins import get_registry

needs_minatar = pytest.mark.skipif(importlib.util.find_spec("minatar") is None,
                                   reason="minatar not installed: pip install rlbench[envs]")


def test_cartpoles_job_is_the_one_the_sweep_always_ran():
    dqn = get_registry().get("algorithm", "dqn").create()
    assert runtime.actor_job(dqn, "classic-control", 240_000, 512, 8) == {
        "learning_starts": 500, "batch_size": 32, "train_every": 512, "publish_every": 8}
    atari = runtime.actor_job(dqn, "atari", 12_000, 512, 8)
    assert atari["buffer_size"] == 12_000  # not the preset's 1 M frames
    assert atari["epsilon_start"] == atari["epsilon_end"] == runtime.ACTING_EPSILON  # the actors run their CNN


def test_an_invalid_job_is_refused_before_any_run():
    done = CliRunner().invoke(runtime.actors_command, ["--env", "HalfCheetah-v5", "--algo", "dqn", "--max-actors", "2"])
    assert isinstance(done.exception, RlbenchError) and "needs a discrete action space" in str(done.exception)


@needs_minatar
def test_bench_actors_sweeps_minatar_actors_running_the_cnn():
    done = CliRunner().invoke(runtime.actors_command, ["--env", "MinAtar/Breakout-v1", "--max-actors", "2",
                                                       "--steps-per-actor", "600", "--json"])
    assert done.exit_code == 0, done.output
    sweep = json.loads(done.stdout)
    assert sweep["preset_overridden"] and sweep["family"] == "minatar"
    assert sweep["hyperparameters"]["buffer_size"] == 1200 and sweep["hyperparameters"]["epsilon_end"] == 0.01
    assert [row["actors"] for row in sweep["rows"]] == [1, 2]
    for row in sweep["rows"]:
        assert row["status"] == "complete" and row["env_steps_per_s"] > 0
        spent = row["role_time"]
        assert spent["actors_us_per_step"]["inference"] > 0 and spent["actors_us_per_step"]["env"] > 0
        assert 0 <= spent["actors_off_cpu_share"] <= 1
        assert set(spent["learner_share"]) == {"learner", "replay", "weights", "waiting"}
        assert set(spent["node_share"]) == {"replay", "bookkeeping", "idle"}
    text = runtime.format_actor_sweep(sweep)
    assert text.startswith("DQN MinAtar/Breakout-v1 over shm, placement server")
    assert "dqn's minatar preset, overridden for a short run: " in text and "buffer_size 1,200" in text
    rows = [line for line in text.splitlines() if line.startswith(("     1 ", "     2 "))]
    assert len(rows) == 4  # the rates' and the time's, per actor count
    assert sum(line.startswith(("1 actor(s), ", "2 actor(s), ")) for line in text.splitlines()) == 2  # the machine
    # the knee: where one more actor adds less than 5 % (here: made so by a flat second rate)
    sweep["rows"][1]["env_steps_per_s"] = sweep["rows"][0]["env_steps_per_s"] * 1.02
    assert "knee: 1 actor(s)" in runtime.format_actor_sweep(sweep)
    sweep["rows"][1]["env_steps_per_s"] = sweep["rows"][0]["env_steps_per_s"] * 1.5
    assert "knee: none, still growing at 2 actors" in runtime.format_actor_sweep(sweep)
    assert "knee: not measured" in runtime.format_actor_sweep({**sweep, "rows": sweep["rows"][:1]})
    # what a core for each role would give (issue #41 item 10: no 16 cores here), estimated and said so
    cpu = sweep["rows"][-1]["cpu_per_step"]
    assert cpu["actor"] > 0 and cpu["replay"] > 0 and cpu["learner"] > 0
    rate, binding = runtime.core_each_estimate(cpu, 8)
    assert rate == pytest.approx(min(8 / cpu["actor"], 1 / cpu["replay"], 1 / cpu["learner"]))
    assert "estimated, not measured: with a core for each role" in text and f"8 actor(s) {rate:,.0f}/s ({binding})" in text
    assert runtime.core_each_estimate({"actor": 1e-3, "replay": 1e-4, "learner": 2e-4}, 2) == (2000.0, "actors")
    assert runtime.core_each_estimate({"actor": 1e-3, "replay": 1e-4, "learner": 2e-4}, 16) == (5000.0, "learner")
    # CartPole's sweep opens as it always did: no preset to override, the run's default replay unnamed
    classic = runtime.format_actor_sweep({**sweep, "env": "CartPole-v1", "preset_overridden": False})
    assert classic.splitlines()[:2] == [
        "DQN CartPole-v1 over shm, placement server; learner rate-limited to 0.0625 samples/insert, weights "
        "published every 8 updates",
        "env steps/s: steady state, between the first and the last INSERT the replay node received (process "
        "start-up excluded; with start-up in the last column)"]
