"""The command line: listings, fingerprint, one-line errors with exit code 2, no tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from support import REPO, run_cli


def test_list_shows_every_builtin_with_availability():
    result = run_cli("list", "--json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)["components"]
    names = {(r["kind"], r["name"]) for r in rows}
    for expected in [("transport", "shm"), ("transport", "udp"), ("replay", "prioritized"), ("compute", "cpu"),
                     ("environment", "Taxi-v3"), ("algorithm", "sarsa")]:
        assert expected in names
    assert all(r["available"] or r["reason"] for r in rows), "an unavailable component must say why"
    table = run_cli("list", "--kind", "algorithm")
    assert table.returncode == 0 and "dqn" in table.stdout and "Pendulum" not in table.stdout


def test_info_is_a_fingerprint():
    result = run_cli("info")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["cores"] >= 1 and data["memory_bytes"] > 0 and data["cpu"]
    assert data["packages"]["numpy"] and "plugins" in data


@pytest.mark.parametrize("args, message", [
    (["run", "--algo", "dqm"], "did you mean 'dqn'?"),
    (["run", "--env", "Pendulum-v1"], "dqn needs a discrete action space"),
    (["run", "--steps", "many"], "'many' is not a valid integer"),
    (["run", "--placement", "cloud"], "'cloud' is not one of"),
    (["run", "--transport", "udp", "--placement", "local"], "--transport udp has no effect with --placement local"),
    (["run", "--transport", "udp", "--bind", "10.0.0.5"], "udp trusts the network path: its datagrams carry no MAC"),
    (["run", "--hp", "lr"], "'lr' is not KEY=VALUE"),
    (["run", "--hp", "learning_rat=0.1"], "unknown hyperparameter 'learning_rat'"),
    (["run", "--hp", "learning_starts=60000"], "learning_starts (60,000) exceeds buffer_size (50,000)"),
    (["run", "--hp", "hidden_sizes=a,b"], "hidden_sizes takes a list of int, got 'a'"),
    (["run", "--hp", "hidden_sizes=64,2.5"], "hidden_sizes takes a list of int, got 2.5"),
    (["run", "--config", "no-such-run.toml"], "no such file: no-such-run.toml"),
    (["run", "--out", "/proc/rlbench/result.json"], "--out /proc/rlbench/result.json: cannot write a result there"),
    (["run", "--out", "README.md/results"], "--out README.md/results: cannot write a result there"),
    (["run", "--config", "a.toml", "--plan", "b.toml"], "give --config or --plan, not both"),
    (["run", "--algo", "sarsa", "--env", "Taxi-v3", "--replay", "uniform"], "drop --replay uniform"),
    (["run", "--transport", "tcp", "--placement-strategy", "spread"], "it is for --launcher ray, not --launcher local"),
    (["run", "--launcher", "ray", "--transport", "tcp", "--placement-strategy", "sprad"], "did you mean 'spread'?"),
    (["show", "no-such-result.json"], "no such result file"),
    (["lst"], "did you mean 'list'?"),
    (["bench", "nothing"], "No such command 'nothing'"),
])
def test_bad_input_is_one_line_exit_2(args, message):
    result = run_cli(*args, *(["--no-out"] if args[0] == "run" and "--out" not in args else []))
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_naming_a_transport_runs_the_roles_over_it():
    result = run_cli("run", "--transport", "shm", "--steps", "600", "--eval-episodes", "0", "--no-out", "--json",
                     "--hp", "learning_starts=200", "--hp", "batch_size=32")
    assert result.returncode == 0, result.stderr
    config = json.loads(result.stdout)["config"]
    assert config["placement"] == "server" and config["transport"] == "shm"


def test_show_refuses_a_file_that_is_not_a_result(tmp_path):
    bogus = tmp_path / "x.json"
    bogus.write_text(json.dumps({"hello": 1}))
    result = run_cli("show", str(bogus))
    assert result.returncode == 2 and "is not an rlbench result" in result.stderr


def test_import_and_list_do_not_import_heavy_modules():
    probe = ("import sys, rlbench, rlbench.cli; from rlbench.plugins import get_registry; "
             "r = get_registry(); [c.probe() for c in r.components()]; "
             "heavy = [m for m in ('torch', 'pyopencl', 'rlbench_dpdk._native', 'ray', 'numba', 'matplotlib', 'scipy') if m in sys.modules]; print(heavy)")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_a_run_file_holds_the_run_and_flags_override_it(tmp_path):
    run_file = tmp_path / "run.toml"
    run_file.write_text('algo = "qlearning"\nenv = "FrozenLake-v1"\nsteps = 800\nseed = 1\neval_episodes = 1\n'
                        '[hyperparameters]\nalpha = 0.2\n')
    result = run_cli("run", "--config", str(run_file), "--seed", "3", "--hp", "gamma=0.9", "--no-out", "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["config"]["algo"] == "qlearning" and document["config"]["total_steps"] == 800
    assert document["config"]["seed"] == 3  # the flag wins over the file
    assert document["hyperparameters"]["alpha"] == 0.2 and document["hyperparameters"]["gamma"] == 0.9


def test_a_run_file_with_an_unknown_key_is_refused_with_the_close_match(tmp_path):
    run_file = tmp_path / "run.toml"
    run_file.write_text('algo = "dqn"\nstep = 800\n')
    result = run_cli("run", "--config", str(run_file), "--no-out")
    assert result.returncode == 2 and "unknown key 'step'; did you mean 'steps'?" in result.stderr
