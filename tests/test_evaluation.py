"""--eval-every: greedy evaluation during training, in the single-process loops; refused before the
run starts where it has no hook (distributed placements, offline runs)."""

from __future__ import annotations

import json

import pytest

from support import run_cli

TINY = ["--steps", "600", "--eval-episodes", "2", "--hp", "learning_starts=200", "--hp", "batch_size=32",
        "--hp", "hidden_sizes=16,16"]


def _run(tmp_path, name, *args):
    path = tmp_path / f"{name}.json"
    done = run_cli("run", *args, "--out", str(path), env_extra={"OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    return json.loads(path.read_text())


def test_evaluation_points_every_n_steps_and_training_untouched(tmp_path):
    plain = _run(tmp_path, "plain", *TINY)
    evaluated = _run(tmp_path, "evaluated", *TINY, "--eval-every", "250")
    curve = evaluated["evaluation_curve"]
    points = curve["points"]
    assert [p["step"] for p in points] == [250, 500, 600]  # every 250 env steps, then the final evaluation
    assert curve["every"] == 250 and curve["episodes"] == 2 and all(p["episodes"] == 2 for p in points)
    assert points[-1]["return"] == evaluated["evaluation"]["mean_return"]
    assert points[-1]["updates"] == evaluated["throughput"]["updates"]
    assert [p["updates"] for p in points] == sorted(p["updates"] for p in points) and points[0]["updates"] > 0
    for key in ("time_s", "cpu_s"):
        assert 0 < points[0][key] < points[1][key] <= points[2][key]
    assert evaluated["timing"]["evaluating_s"] > 0 and evaluated["timing"]["evaluating_s"] == curve["seconds"]
    # a second actor on its own environment evaluates: the training run is the same episode for episode
    assert [p["return"] for p in evaluated["learning_curve"]] == [p["return"] for p in plain["learning_curve"]]
    assert plain["evaluation"]["mean_return"] == evaluated["evaluation"]["mean_return"]
    assert plain.get("evaluation_curve") is None


def test_tabular_online_loop_evaluates_too(tmp_path):
    result = _run(tmp_path, "tabular", "--algo", "qlearning", "--env", "FrozenLake-v1", "--steps", "3000",
                  "--eval-every", "1000", "--eval-episodes", "3")
    assert [p["step"] for p in result["evaluation_curve"]["points"]] == [1000, 2000, 3000]
    assert result["evaluation_curve"]["points"][0]["updates"] == 1000  # one TD update per transition


@pytest.mark.parametrize("args, message", [
    (["--placement", "server", "--transport", "shm"],
     "--eval-every is supported with --placement local only, not server"),
    (["--algo", "qlearning", "--env", "FrozenLake-v1", "--dataset", "1000"],
     "an offline run (--dataset) takes none"),
    (["--eval-episodes", "0"], "--eval-every needs --eval-episodes of at least 1"),
])
def test_eval_every_is_refused_before_the_run_where_it_has_no_hook(tmp_path, args, message):
    done = run_cli("run", "--eval-every", "100", "--steps", "400", *args, "--out", str(tmp_path))
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not list(tmp_path.glob("*.json"))
