"""Studies: the [sweep] table and command-line grid, resuming (finished cells skipped), a crashing or
refused cell recorded while the study goes on, and Ctrl-C keeping every finished result."""

from __future__ import annotations

import json
import os
import pty
import re
import signal
import subprocess
import sys

import pytest

from support import REPO, read_terminal, write_plugin_dist
from rlbench.config import read_toml
from rlbench.errors import RlbenchError
from rlbench.report.sweep import FAILURE_SCHEMA, load_study, parse_grid, parse_sets, run_config, run_study

TINY = ["steps=600", "eval_episodes=1", "hp.learning_starts=200", "hp.batch_size=32"]

CRASHING_PLUGIN = """
import os
from rlbench.hookspecs import hookimpl
from rlbench.protocols import Probe, ReplayCapabilities

class CrashingReplay:
    def __init__(self, capacity, **options):
        pass
    def add(self, transitions, priorities=None):
        os.abort()  # a native crash, as a faulty driver would cause

@hookimpl
def rlbench_register_replay_memories(register):
    register("crashing", CrashingReplay, capabilities=ReplayCapabilities(prioritized=False))
    register("absent", CrashingReplay, capabilities=ReplayCapabilities(prioritized=False),
             probe=lambda: Probe.missing("needs the absent board"))
"""


def test_study_file_is_a_run_file_plus_a_sweep_table(tmp_path):
    path = tmp_path / "replay.toml"
    path.write_text("""
algo = "dqn"
steps = 1000

[hyperparameters]
batch_size = 32

[sweep]
seeds = [3, 4]
target_return = 100
replay = ["prioritized", "uniform"]
"hp.learning_rate" = [1e-3, 3e-4]
""")
    study = load_study(str(path), grid=parse_grid(["placement=local,server"]), sets=parse_sets(["eval_episodes=2"]))
    assert study.name == "replay" and study.seeds == [3, 4] and study.target_return == 100.0
    assert list(study.axes) == ["replay", "hp.learning_rate", "placement"]
    cells = study.cells()
    assert len(cells) == 2 * 2 * 2 * 2
    assert [c.seed for c in cells[:8]] == [3] * 8  # seeds outermost: every combination at the first seed first
    first = cells[0]
    assert first.document == {"algo": "dqn", "steps": 1000, "eval_episodes": 2, "seed": 3, "replay": "prioritized",
                               "placement": "local", "hyperparameters": {"batch_size": 32, "learning_rate": 1e-3}}
    assert len({c.id for c in cells}) == len(cells)
    assert first.label == "replay=prioritized hp.learning_rate=0.001 placement=local seed=3"
    # the study as written into its folder reads back to the same cells
    again = tmp_path / "study.toml"
    from rlbench.config import to_toml

    again.write_text(to_toml(study.document()))
    assert [c.document for c in load_study(str(again)).cells()] == [c.document for c in cells]


@pytest.mark.parametrize("table, message", [
    ('[sweep]\nrepaly = ["uniform"]', "unknown key 'repaly'; did you mean 'replay'?"),
    ('[sweep]\nseed = [1, 2]', "seeds are given by 'seeds'"),
    ('[sweep]\nseeds = 0', "seeds must be at least 1"),
    ('[sweep]\nseeds = [1, 1]', "seeds repeat"),
    ('[sweep]\nreplay = "uniform"', "axis 'replay' takes a non-empty list"),
    ('stepz = 5', "unknown key 'stepz'; did you mean 'steps'?"),
    ('sweep = 3', "[sweep] must be a table"),
    ('[sweep]\ntarget_return = "high"', "target_return is a number or a table of one number per environment"),
    ('[sweep.target_return]\n"CartPole-v1" = "x"', "target_return is a number or a table of one number per environment"),
    ('[sweep.reference_scores]\nchain = {random = 1}', "reference_scores.chain takes two numbers, {random = R, reference = S}"),
    ('[sweep.reference_scores]\nchain = {random = 1, reference = 1}', "random and reference are both 1: nothing to normalise by"),
])
def test_bad_study_files_are_one_line_errors(tmp_path, table, message):
    path = tmp_path / "bad.toml"
    path.write_text(table + "\n")
    with pytest.raises(RlbenchError) as error:
        load_study(str(path))
    assert message in str(error.value)


def test_plugin_options_are_named_by_flag_and_reach_only_their_component():
    from rlbench.plugins import get_registry

    registry = get_registry()
    option = next(o for o in registry.run_options if o.flag == "--chain-length")  # the example environment's
    config = run_config({"algo": "qlearning", "env": "chain", "options": {"chain-length": 7}}, registry)
    assert config.options == {option.kind: {option.param: 7}}
    with pytest.raises(RlbenchError, match="--chain-length applies to environment chain, which this run does not use"):
        run_config({"options": {"chain-length": 7}}, registry)
    with pytest.raises(RlbenchError, match="unknown run option --no-such-flag"):
        run_config({"options": {"no-such-flag": 1}}, registry)


def _tiny_study(name: str, grid: list[str], seeds):
    return load_study(None, sets=parse_sets(TINY), grid=parse_grid(grid), seeds=seeds, name=name)


def test_crash_and_refusal_are_recorded_and_a_rerun_skips_finished_cells(plugin_dir, tmp_path):
    write_plugin_dist(plugin_dir, "rlbench-crashing", "crashing", "rlbench_crashing", CRASHING_PLUGIN)
    from rlbench.plugins import get_registry

    registry = get_registry(refresh=True)
    study = _tiny_study("crashes", ["replay=uniform,crashing,absent"], [0, 1])
    folder = tmp_path / "study"
    outcome = run_study(study, folder, registry=registry, echo=lambda text: None)
    statuses = {(o.cell.combination["replay"], o.cell.seed): o.status for o in outcome.outcomes}
    assert statuses == {("uniform", 0): "complete", ("uniform", 1): "complete", ("crashing", 0): "failed",
                        ("crashing", 1): "failed", ("absent", 0): "refused", ("absent", 1): "refused"}
    assert not outcome.ok
    crash = json.loads((folder / "runs" / "replay-crashing_seed-0.failed.json").read_text())
    assert crash["schema"] == FAILURE_SCHEMA and "SIGABRT" in crash["reason"] and crash["exit_code"] == -signal.SIGABRT
    refused = json.loads((folder / "runs" / "replay-absent_seed-1.failed.json").read_text())
    assert "needs the absent board" in refused["reason"]
    result = folder / "runs" / "replay-uniform_seed-1.json"
    data = json.loads(result.read_text())
    assert data["status"] == "complete" and data["config"]["seed"] == 1 and data["config"]["replay"] == "uniform"
    assert data["study"]["combination"] == {"replay": "uniform"} and data["study"]["name"] == "crashes"
    assert read_toml(folder / "study.toml")["sweep"]["replay"] == ["uniform", "crashing", "absent"]

    before = result.stat().st_mtime_ns
    again = run_study(study, folder, registry=registry, echo=lambda text: None)
    statuses = {(o.cell.combination["replay"], o.cell.seed): o.status for o in again.outcomes}
    assert statuses[("uniform", 0)] == statuses[("uniform", 1)] == "skipped"
    assert statuses[("crashing", 0)] == "failed"  # failed cells are tried again
    assert result.stat().st_mtime_ns == before

    changed = _tiny_study("crashes", ["replay=uniform"], [0])
    changed.base["steps"] = 700
    with pytest.raises(RlbenchError, match="was run with other settings \\(steps differ\\)"):
        run_study(changed, folder, registry=registry, echo=lambda text: None)


def test_a_study_whose_every_cell_is_refused_does_not_start(tmp_path):
    study = _tiny_study("refused", ["env=Pendulum-v1"], [0])
    with pytest.raises(RlbenchError, match="no cell of study 'refused' can run: dqn needs a discrete action space"):
        run_study(study, tmp_path / "x", echo=lambda text: None)
    assert not (tmp_path / "x").exists()


def test_ctrl_c_stops_the_running_cell_and_keeps_finished_results(tmp_path):
    folder = tmp_path / "study"
    command = [sys.executable, "-m", "rlbench", "sweep", "--name", "interrupted", "--seeds", "1",
               "--out", str(folder), "--grid", "steps=600,400000",
               *[arg for item in TINY if not item.startswith("steps=") for arg in ("--set", item)]]
    # stderr on a terminal, so the study draws its progress bar: the signal is sent once the bar shows
    # the second cell's first env steps (an event; a fixed sleep read 0 steps on a loaded machine)
    terminal, its_other_end = pty.openpty()
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=its_other_end, text=True,
                               env=dict(os.environ, OMP_NUM_THREADS="1"))
    os.close(its_other_end)
    first = folder / "runs" / "steps-600_seed-0.json"
    second_stepping = re.compile(r"steps=400000 seed=0 0*[1-9][0-9,]*/400,000 steps")
    err = read_terminal(terminal, until=lambda shown: second_stepping.search(shown) is not None, process=process,
                         cap_s=300)  # a cap for a machine that never gets there, not a speed: the wait ends at the event
    assert second_stepping.search(err), f"the second cell never stepped: {err[-2000:]}"
    process.send_signal(signal.SIGINT)
    try:
        err += read_terminal(terminal, until=lambda shown: False, process=process, cap_s=60)
        process.communicate(timeout=60)
    finally:
        process.kill()
        os.close(terminal)
    assert process.returncode == 130, err
    assert json.loads(first.read_text())["status"] == "complete"
    second = json.loads((folder / "runs" / "steps-400000_seed-0.json").read_text())
    assert second["status"] == "incomplete" and second["status_reason"] == "interrupted (Ctrl-C)"
    assert 0 < second["throughput"]["env_steps"] < 400000
    assert "interrupted: rerun the same command" in err

    dry = subprocess.run([*command, "--dry-run"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    assert "steps=600 seed=0: finished" in dry.stdout and "steps=400000 seed=0: to run" in dry.stdout


# -- issue #42 item 7 (help text) and item 10: progress in a log, --ci-measure checked first, plain widths ------
def test_sweep_help_prints_percent_signs_once():
    from click.testing import CliRunner

    from rlbench.report.cli import sweep_command

    shown = CliRunner().invoke(sweep_command, ["--help"], terminal_width=200)
    assert shown.exit_code == 0, shown.output
    assert "%%" not in shown.output and "95 % interval of --ci-measure" in shown.output


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "run"])
def test_a_misspelt_ci_measure_is_refused_before_any_cell_runs(tmp_path, dry_run):
    """It used to be found after the whole sweep had run, and --dry-run did not look."""
    from click.testing import CliRunner

    from rlbench.report.cli import sweep_command

    out = tmp_path / "study"
    study = ["--name", "misspelt", "--seeds", "1", "--out", str(out), *[a for item in TINY for a in ("--set", item)]]
    dry = ["--dry-run"] if dry_run else []
    done = CliRunner().invoke(sweep_command, [*study, "--until-ci", "5", "--ci-measure", "final_retrun", *dry])
    assert isinstance(done.exception, RlbenchError), done.output
    assert "--ci-measure 'final_retrun' is not a measure; did you mean 'final_return'?" in str(done.exception)
    assert not out.exists() and "seed=0" not in done.output  # nothing listed, nothing run
    no_target = CliRunner().invoke(sweep_command, [*study, "--until-ci", "5", "--ci-measure", "steps_to_target", *dry])
    assert "--ci-measure steps_to_target: a to-target measure, and the study has no target_return" \
        in str(no_target.exception)
    assert not out.exists()


class _Running:
    """A running cell as the progress display sees it."""

    def __init__(self, label: str, step: int, total: int) -> None:
        self.cell = type("Cell", (), {"label": label})()
        self.step, self.total = step, total
        self.fraction = step / total if total else 0.0


def test_progress_without_a_terminal_is_a_line_per_running_cell():
    """In a log (no tty) a long cell was silent for minutes: a plain line every so often instead."""
    from rlbench.report.sweep import _Bar

    said: list[str] = []
    bar = _Bar(4, 1, said.append, tty=False, plain_every_s=0.0)
    bar.draw([_Running("replay=uniform seed=0", 1200, 5000), _Running("replay=uniform seed=1", 0, 0)])
    assert len(said) == 2 and said[0].startswith("[1/4 cells] replay=uniform seed=0: 1,200/5,000 env steps (24%)")
    assert said[1].startswith("[1/4 cells] replay=uniform seed=1: starting") and "\r" not in "".join(said)
    quiet = _Bar(4, 1, said.append, tty=False)  # the default spacing: nothing again within it
    quiet.draw([_Running("replay=uniform seed=0", 1300, 5000)])
    assert len(said) == 2 and _Bar.PLAIN_EVERY_S == 30.0


def test_until_ci_prints_widths_as_plain_numbers(monkeypatch, tmp_path):
    from rlbench.report import sweep
    from rlbench.report.collect import Inputs, Run, group

    study = load_study(None, sets=parse_sets(TINY), grid=parse_grid(["replay=uniform"]), seeds=5, name="ci")
    runs = [Run(f"/nowhere/runs/{cell.stem}.json",
                {"status": "complete", "config": {"env": "CartPole-v1", "seed": cell.seed, "replay": "uniform"},
                 "evaluation": {"mean_return": 10000.0 * index}, "study": study.block(cell, 1)})
            for index, cell in enumerate(study.cells())]
    (found,) = group(Inputs(runs=runs))
    started = []
    monkeypatch.setattr(sweep, "_study_group", lambda study, folder: found)
    monkeypatch.setattr(sweep, "run_study", lambda study, folder, **kwargs: started.append(kwargs["cells"])
                        or sweep.StudyOutcome(study, folder, [], interrupted=True))
    said: list[str] = []
    sweep.add_seeds(study, tmp_path, sweep.Precision.parse("500", "final_return", 20), echo=said.append)
    (line,) = said
    assert re.fullmatch(r"--until-ci: replay=uniform: final greedy return interval [\d,]+ wide \(asked: 500\), "
                        r"adding seed 5", line), line
    assert "e+" not in line and [c.seed for c in started[0]] == [5]
    assert sweep.plain_number(12345.6) == "12,346" and sweep.plain_number(0.004213) == "0.00421"
