"""Issue #26's targets on studies with known values: a 2-environment x 2-replay x 5-seed study whose
results are fabricated from one real run's result (so every figure has data, and every number is
known): its report shows every figure and renders in headless Chromium without a console error;
when wall clock favours one replay and env steps the other, the default verdict follows env steps
and the wall-clock table says it is wall clock; the report's aggregates equal rliable's on the
normalised scores; `compare STUDY --a --b`; `sweep --until-ci` and `--rerun-contended` on real
cells; `show` prints the curves."""

from __future__ import annotations

import base64
import copy
import itertools
import json
import math
import re
import struct

import numpy as np
import pytest

from support import run_cli
from rlbench.builtin.reference_scores import REFERENCE_SCORES
from rlbench.report import browser

TINY = ["--steps", "600", "--eval-episodes", "1", "--hp", "learning_starts=200", "--hp", "batch_size=32"]
ENVS = ("CartPole-v1", "Acrobot-v1")
REPLAYS = ("prioritized", "uniform")
TARGETS = {"CartPole-v1": 200.0, "Acrobot-v1": -300.0}
SEEDS = range(5)


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """One real result (a tiny run with --eval-every), the model every fabricated result is made from."""
    path = tmp_path_factory.mktemp("template") / "run.json"
    done = run_cli("run", *TINY, "--eval-every", "200", "--out", str(path), env_extra={"OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    return json.loads(path.read_text())


def _final(env: str, replay: str, seed: int) -> float:
    """Known final greedy returns: uniform ahead on CartPole, prioritized on Acrobot."""
    if env == "CartPole-v1":
        return (420.0 if replay == "uniform" else 300.0) + 10.0 * seed
    return (-150.0 if replay == "prioritized" else -260.0) + 8.0 * seed


def _reach_step(replay: str, seed: int) -> int:
    """Prioritized reaches the target in fewer env steps..."""
    return (3000 if replay == "prioritized" else 6000) + 250 * seed


def _seconds_per_step(replay: str) -> float:
    """...but on a loaded machine, so in more wall time."""
    return 0.010 if replay == "prioritized" else 0.002


def fabricate(template: dict, folder, env: str, replay: str, seed: int, *, name: str = "envs-replay",
              contended: bool = False) -> dict:
    data = copy.deepcopy(template)
    per_step, reach, final = _seconds_per_step(replay), _reach_step(replay, seed), _final(env, replay, seed)
    random = REFERENCE_SCORES[env].random
    data["config"].update(env=env, replay=replay, seed=seed, steps=10000)
    data["status"], data["status_reason"] = "complete", None
    data["evaluation"] = {"episodes": 5, "mean_return": final, "std_return": 1.0, "min_return": final,
                          "max_return": final, "success_rate": None}
    steps = range(1000, 10001, 1000)
    data["evaluation_curve"] = {"every": 1000, "episodes": 5, "seconds": 0.5, "cpu_s": 0.4, "points": [
        {"step": s, "updates": s - 500, "time_s": s * per_step, "cpu_s": s * per_step * 0.9, "episodes": 5,
         "return": random if s < reach else final, "std_return": 1.0} for s in steps]}
    data["learning_curve"] = [{"step": s, "time_s": s * per_step, "return": random if s < reach + 1000 else final,
                               "length": 50} for s in range(50, 10001, 50)]
    wall = 10000 * per_step + 2.0
    data["timing"].update(wall_s=wall, cpu_s=wall * 0.9, evaluating_s=0.5, evaluating_cpu_s=0.4, started_unix=1e9 + seed)
    data["throughput"].update(env_steps=10000, env_steps_per_s=10000 / wall, updates_per_s=9500 / wall)
    data["machine_state"] = dict(data.get("machine_state") or {}, contended=contended,
                                 warning="measured on a contended machine: other processes used 1.20 core(s) meanwhile"
                                 if contended else "")
    cell = f"env-{env}_replay-{replay}_seed-{seed}".replace("/", "-")
    data["study"] = {"name": name, "cell": cell, "combination": {"env": env, "replay": replay}, "seed": seed,
                     "axes": ["env", "replay"], "target_return": TARGETS, "target_window": 5,
                     "reference_scores": {}, "requested": {}, "concurrent_cells": 1}
    (folder / "runs").mkdir(parents=True, exist_ok=True)
    (folder / "runs" / f"{cell}.json").write_text(json.dumps(data))
    return data


@pytest.fixture(scope="module")
def envs_study(template, tmp_path_factory):
    folder = tmp_path_factory.mktemp("envs") / "envs-replay"
    for seed in SEEDS:
        for env in ENVS:
            for replay in REPLAYS:
                fabricate(template, folder, env, replay, seed, contended=(replay, seed) in {("prioritized", 1),
                                                                                           ("uniform", 3)})
    return folder


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_report_of_a_two_environment_study_shows_every_figure_and_renders_clean(envs_study, tmp_path):
    if browser.chromium() is None:
        pytest.fail("chromium not installed (scripts/setup.sh installs it: apt-get install chromium)")
    page, shot = tmp_path / "report.html", tmp_path / "report.png"
    made = run_cli("report", str(envs_study), "--out", str(page), "--price", "cpu=0.05", "--screenshot", str(shot),
                   "--screenshot-size", "1300x3000", timeout=300)
    assert made.returncode == 0, made.stderr
    assert "warning: the page printed" not in made.stderr
    html = page.read_text()
    titles = re.findall(r"<b>([^<]+)\.</b>", html)
    for figure in ("Learning curves", "Evaluation curves", "Aggregates over environments", "Performance profile",
                   "Where the time goes", "Latency CDFs"):
        assert figure in titles, (figure, titles)
    for text in ("Verdict — clock: env steps", "env steps to target", "updates to target", "wall time to target (s)",
                 "CPU-seconds to target", "USD to target", "Cost to the target", "optimality gap",
                 "P(row beats column) over environments: normalised final score", "(clock: wall clock)",
                 "4 of 20 run(s) of &#x27;envs-replay&#x27; were measured on a contended machine",
                 "energy (rapl): absent", "normalised final score exceeds each threshold τ, every environment&#x27;s runs pooled"):
        assert text in html, text
    assert html.count("class='warn contended'") == 1  # one box for the study, every contended run in it
    images = re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", html)
    assert all(w >= 400 and h >= 200 for w, h in (_png_size(base64.b64decode(i)) for i in images))
    dom = browser.dump_dom(page.as_uri())
    assert dom.returncode == 0 and dom.output.count("<img") == len(images)
    assert not dom.console, dom.console
    from matplotlib.image import imread

    pixels = (imread(shot)[..., :3] * 255).round().astype(int)
    for colour in ((31, 119, 180), (255, 127, 14)):  # the first two lines' colours: figures decoded and drawn
        assert (np.abs(pixels - colour).sum(axis=-1) < 30).sum() > 200, colour


def test_default_verdict_follows_env_steps_and_the_wall_clock_table_says_wall_clock(envs_study):
    """Issue #26's case: on a loaded machine wall clock favours uniform replay, while counted in env
    steps prioritized reaches the target first."""
    from rlbench.report.collect import group, load_inputs
    from rlbench.report.html import improvement_table, verdict_box
    from rlbench.report.measures import measures

    (study,) = group(load_inputs([str(envs_study)]))
    found = measures(study)
    box = verdict_box(study, found)
    assert "clock: env steps" in box and "Best IQM: replay=prioritized" in box
    assert "replay=prioritized vs replay=uniform: P = 1.00" in box and "<b>replay=prioritized better</b>" in box
    wall = improvement_table(study, next(m for m in found if m.key == "time_to_target_s"))
    assert "wall time to target (s) <span class='clock'>(clock: wall clock)</span>" in wall
    rows = dict(re.findall(r"<tr><td class='name'>(replay=\w+)</td>(.*?)</tr>", wall))
    assert "<td class='worse'>0.00" in rows["replay=prioritized"] and "<td class='better'>1.00" in rows["replay=uniform"]

    compared = run_cli("compare", str(envs_study), "--a", "replay=prioritized", "--b", "replay=uniform")
    assert compared.returncode == 0, compared.stderr
    verdict = next(line for line in compared.stdout.splitlines() if "verdict" in line)
    assert "verdict (clock: env steps; env steps to target): A better, P(A beats B) = 1.00" in verdict
    wall_line = next(line for line in compared.stdout.splitlines() if line.strip().startswith("wall time to target"))
    assert wall_line.endswith("B better (intervals apart)")
    assert "4 of 20 run(s)" in compared.stdout and "env-Acrobot-v1_replay-prioritized_seed-1" in compared.stdout


def test_report_aggregates_equal_rliable_on_the_normalised_scores(envs_study):
    from rliable import metrics

    from rlbench.report.aggregate import aggregate_estimates, improvement, methods
    from rlbench.report.collect import group, load_inputs

    (study,) = group(load_inputs([str(envs_study)]))
    matrices = {}
    for replay in REPLAYS:  # runs x tasks, normalised by hand from the shipped scores
        matrices[replay] = np.array([[(_final(env, replay, seed) - REFERENCE_SCORES[env].random)
                                      / (REFERENCE_SCORES[env].reference - REFERENCE_SCORES[env].random)
                                      for env in ENVS] for seed in SEEDS])
    reference = {"median": metrics.aggregate_median, "IQM": metrics.aggregate_iqm, "mean": metrics.aggregate_mean,
                 "optimality gap": metrics.aggregate_optimality_gap}
    rows = aggregate_estimates(study)
    assert [m.label for m, _ in rows] == ["replay=prioritized", "replay=uniform"]
    for method, estimates in rows:
        matrix = matrices[method.label.removeprefix("replay=")]
        for name, function in reference.items():
            assert estimates[name].value == pytest.approx(function(matrix)), (method.label, name)
            assert estimates[name].kind == "ci" and estimates[name].low <= estimates[name].value <= estimates[name].high
    prioritized, uniform = methods(study)
    # the tasks disagree (uniform wins CartPole, prioritized Acrobot): the probability averages them
    assert improvement(study, prioritized, uniform).value == pytest.approx(
        metrics.probability_of_improvement(matrices["prioritized"], matrices["uniform"])) == pytest.approx(0.5)


def test_study_file_scores_override_the_shipped_ones(template, tmp_path):
    from rlbench.report.collect import group, load_inputs
    from rlbench.report.measures import normalised_score

    folder = tmp_path / "override"
    for seed in range(2):
        data = fabricate(template, folder, "CartPole-v1", "uniform", seed, name="override")
        data["study"]["reference_scores"] = {"CartPole-v1": {"random": 20.0, "reference": 500.0}}
        (folder / "runs" / f"{data['study']['cell']}.json").write_text(json.dumps(data))
    (study,) = group(load_inputs([str(folder)]))
    run = study.runs()[0]
    assert normalised_score(run, study) == pytest.approx((run.data["evaluation"]["mean_return"] - 20.0) / 480.0)


def test_an_atari_study_is_human_normalised_by_the_shipped_scores(template, envs_study, tmp_path):
    """Agarwal et al.'s Atari aggregates: 0 is random's score, 1 human's, and the report says so; a study
    whose scores are not the published ones for every game (or not Atari) says "normalised" and "reference"."""
    from rlbench.report.collect import group, load_inputs
    from rlbench.report.html import aggregate_section
    from rlbench.report.measures import measures, normalisation, normalised_score

    games = ("ALE/Pong-v5", "ALE/Breakout-v5")
    for name, override in (("atari", {}), ("atari-own-scores", {"ALE/Pong-v5": {"random": -21.0, "reference": 21.0}})):
        for seed, env, replay in itertools.product(range(2), games, REPLAYS):
            data = fabricate(template, tmp_path / name, env, replay, seed, name=name)
            data["study"]["reference_scores"] = override
            (tmp_path / name / "runs" / f"{data['study']['cell']}.json").write_text(json.dumps(data))
    (atari,) = group(load_inputs([str(tmp_path / "atari")]))
    assert normalisation(atari) == ("human-normalised", "human")
    pong = next(run for run in atari.runs() if run.env == "ALE/Pong-v5")
    assert normalised_score(pong, atari) == pytest.approx((pong.data["evaluation"]["mean_return"] + 20.7) / 35.3)
    assert "human-normalised final score" in [m.label for m in measures(atari)]
    section = aggregate_section(atari, {})
    assert "Human-normalised final greedy score (score − random) / (human − random)" in section
    assert "Badia et al. 2020" in section and "P(row beats column) over environments: human-normalised" in section
    (own,) = group(load_inputs([str(tmp_path / "atari-own-scores")]))
    (classic,) = group(load_inputs([str(envs_study)]))
    assert normalisation(own) == normalisation(classic) == ("normalised", "reference")


def test_compare_within_a_study_refuses_what_it_cannot_select(envs_study):
    cases = [
        (["--a", "replya=uniform", "--b", "replay=prioritized"], "'replya' is not an axis of study 'envs-replay'; did you mean 'replay'?"),
        (["--a", "replay=unifrom", "--b", "replay=prioritized"], "the study has no replay 'unifrom'; did you mean 'uniform'?"),
        (["--a", "replay=uniform", "--b", "replay=uniform"], "select the same runs"),
        (["--a", "replay=uniform"], "give both --a and --b"),
    ]
    for args, message in cases:
        done = run_cli("compare", str(envs_study), *args)
        assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    priced = run_cli("report", str(envs_study), "--price", "cpus=0.05", "--out", "/dev/null")
    assert priced.returncode == 2 and "no run used 'cpus'; did you mean 'cpu'?" in priced.stderr


def test_show_prints_the_learning_and_evaluation_curves(envs_study):
    path = next((envs_study / "runs").glob("env-CartPole-v1_replay-uniform_seed-0.json"))
    shown = run_cli("show", str(path))
    assert shown.returncode == 0, shown.stderr
    learning = next(line for line in shown.stdout.splitlines() if "learning curve (mean of the last" in line)
    evaluation = next(line for line in shown.stdout.splitlines() if "evaluation curve (greedy, 5 episodes every 1,000" in line)
    # the fabricated curves jump from the random score to 420 at 6,000 (evaluation) and 7,000 (training)
    marks = re.search(r": ([▁-█]+)  22\.2 -> 420\.0", evaluation).group(1)
    assert marks == "▁" * 5 + "█" * 5
    assert re.search(r"([▁-█]+)  22\.2 -> 420\.0 \(min 22\.2, max 420\.0; steps 50\.\.10,000\)", learning)
    assert re.search(r"env steps +1,000 +2,000 .* 10,000", shown.stdout)


# -- small samples -------------------------------------------------------------------------------------
def test_three_seeds_show_ranges_and_bold_only_what_is_apart(template, tmp_path):
    from rlbench.report.collect import group, load_inputs
    from rlbench.report.html import comparison_table
    from rlbench.report.measures import measures

    folder = tmp_path / "three"
    for seed in range(3):
        for replay in REPLAYS:
            data = fabricate(template, folder, "CartPole-v1", replay, seed, name="three")
            # env steps/s: ranges apart (prioritized is the slow one); final return: ranges overlap
            data["throughput"]["env_steps_per_s"] = (100.0 if replay == "prioritized" else 300.0) + seed
            data["evaluation"]["mean_return"] = 200.0 + 50.0 * seed + (10.0 if replay == "uniform" else 0.0)
            (folder / "runs" / f"{data['study']['cell']}.json").write_text(json.dumps(data))
    (study,) = group(load_inputs([str(folder)]))
    found = measures(study)
    table = comparison_table(study, found)
    assert "the IQM of 3 runs trims 0 runs at each end (it is the mean)" in table and "range [" in table
    assert "95 % stratified bootstrap interval" not in table
    rows = dict(re.findall(r"<tr><td class='name'>env=CartPole-v1 (replay=\w+)</td>(.*?)</tr>", table))
    cells = {label: re.findall(r"<td class='(\w*)'>", row) for label, row in rows.items()}  # one per measure
    keys = [m.key for m in found]
    rate, final = keys.index("env_steps_per_s"), keys.index("final_return")
    assert cells["replay=uniform"][rate] == "best" and cells["replay=prioritized"][rate] == ""
    assert cells["replay=uniform"][final] == "" == cells["replay=prioritized"][final]  # best IQM, ranges overlap

    compared = run_cli("compare", str(folder), "--a", "replay=uniform", "--b", "replay=prioritized")
    assert compared.returncode == 0, compared.stderr
    lines = {line.strip().split("  ")[0]: line for line in compared.stdout.splitlines()}
    assert lines["env steps/s"].endswith("A better (ranges apart)")
    assert lines["final greedy return"].endswith("within the ranges")
    assert "apart" not in lines["final greedy return"] and "intervals apart" not in compared.stdout
    assert "undecided (no interval: fewer than 5 runs on a side)" in compared.stdout
    assert "the IQM of 3 runs trims 0 at each end (it is the mean)" in compared.stdout


# -- sweep --until-ci and --rerun-contended, on real cells ----------------------------------------------
SWEEP_TINY = ["steps=600", "eval_episodes=1", "hp.learning_starts=200", "hp.batch_size=32"]


def _finished_cell(template: dict, folder, study, cell, final: float, contended: bool = False) -> None:
    """A cell as a sweep would have left it finished (its settings, its study block)."""
    data = copy.deepcopy(template)
    data["status"] = "complete"
    data["config"].update(seed=cell.seed, **cell.combination)
    data["evaluation"]["mean_return"] = final
    data["machine_state"] = dict(data.get("machine_state") or {}, contended=contended,
                                 warning="measured on a contended machine: other processes used 1.50 core(s)"
                                 if contended else "")
    data["study"] = study.block(cell, 1)
    (folder / "runs").mkdir(parents=True, exist_ok=True)
    (folder / "runs" / f"{cell.stem}.json").write_text(json.dumps(data))


def test_until_ci_adds_seeds_while_the_interval_is_wide(template, tmp_path):
    from rlbench.report.sweep import Precision, add_seeds, load_study, parse_grid, parse_sets

    study = load_study(None, sets=parse_sets(SWEEP_TINY), grid=parse_grid(["replay=uniform"]), seeds=5, name="ci")
    folder = tmp_path / "ci"
    for cell, final in zip(study.cells(), (0.0, 100.0, 200.0, 300.0, 400.0)):
        _finished_cell(template, folder, study, cell, final)
    said = []
    assert add_seeds(study, folder, Precision.parse("1e9", "final_return", 20), echo=said.append) == []  # narrow enough
    rounds = add_seeds(study, folder, Precision.parse("5", "final_return", 6), echo=said.append)
    assert [o.status for r in rounds for o in r.outcomes] == ["complete"] and len(rounds) == 1  # then the cap: 6 seeds
    added = json.loads((folder / "runs" / "replay-uniform_seed-5.json").read_text())
    assert added["status"] == "complete" and added["config"]["seed"] == 5
    assert any("final greedy return interval" in line and "adding seed 5" in line for line in said), said
    with pytest.raises(Exception, match="--ci-measure 'final_retrun' is not a measure of this study; did you mean 'final_return'"):
        add_seeds(study, folder, Precision.parse("5", "final_retrun", 9), echo=said.append)
    from rlbench.report.stats import Estimate

    assert not Precision.parse("1e9", None, 5).narrow(Estimate(1.0, 0.0, 2.0, 3, "range"))  # a range is no interval
    assert Precision.parse("10%", None, 5).narrow(Estimate(100.0, 96.0, 105.0, 6, "ci"))
    assert not Precision.parse("10%", None, 5).narrow(Estimate(100.0, 90.0, 105.0, 6, "ci"))


def test_rerun_contended_keeps_both_runs_and_the_report_uses_the_rerun(template, tmp_path):
    from rlbench.report.collect import group, load_inputs
    from rlbench.report.sweep import load_study, parse_grid, parse_sets, rerun_contended

    study = load_study(None, sets=parse_sets(SWEEP_TINY), grid=parse_grid(["replay=uniform"]), seeds=2, name="rerun")
    folder = tmp_path / "rerun"
    quiet, loaded = study.cells()
    _finished_cell(template, folder, study, quiet, 100.0)
    _finished_cell(template, folder, study, loaded, 50.0, contended=True)
    rounds = rerun_contended(study, folder, 1, echo=lambda text: None)
    assert [o.cell.stem for r in rounds for o in r.outcomes] == ["replay-uniform_seed-1.rerun-1"]  # the limit: one
    assert (folder / "runs" / "replay-uniform_seed-1.json").exists()  # the contended run is kept
    rerun = json.loads((folder / "runs" / "replay-uniform_seed-1.rerun-1.json").read_text())
    assert rerun["study"]["cell"] == "replay-uniform_seed-1" and rerun["config"]["seed"] == 1
    (found,) = group(load_inputs([str(folder)]))
    (combination,) = found.combinations
    assert sorted(run.path.rsplit("/", 1)[-1] for run in combination.runs) == [
        "replay-uniform_seed-0.json", "replay-uniform_seed-1.rerun-1.json"]
    assert [run.path.rsplit("/", 1)[-1] for run in combination.superseded] == ["replay-uniform_seed-1.json"]
    assert rerun_contended(study, folder, 0, echo=lambda text: None) == []


# -- issue #42 items 7-9, on synthetic results (no run: a dict per seed, built here) ------------------------
def synthetic_result(env: str, combination: dict, seed: int, final: float, *, name: str = "synthetic",
                     axes: list | None = None, evaluations: list[float] | None = None, rate: float = 1000.0,
                     started: float = 0.0, contended: bool = False, cell: str | None = None,
                     target=None, axis_values: dict | None = None) -> dict:
    """A complete result with a study block, holding only what the report reads: the final greedy
    return, env steps/s, and (when given) an evaluation curve one point per 1,000 env steps, each
    point 1 s of wall time and 1 CPU-second."""
    axes = list(combination) if axes is None else axes
    cell = cell or "_".join(f"{k}-{v}" for k, v in combination.items()) + f"_seed-{seed}"
    points = [{"step": 1000 * (i + 1), "updates": 900 * (i + 1), "time_s": 1.0 * (i + 1), "cpu_s": 1.0 * (i + 1),
               "return": value} for i, value in enumerate(evaluations or [])]
    study = {"name": name, "cell": cell, "combination": combination, "seed": seed, "axes": axes,
             "target_return": target, "target_window": 5, "reference_scores": {}, "requested": {},
             "concurrent_cells": 1}
    if axis_values is not None:
        study["axis_values"] = axis_values
    return {"schema": "rlbench.result/1", "status": "complete", "status_reason": None,
            "config": {"algo": "dqn", "env": env, "seed": seed, **combination}, "fingerprint": {"hostname": "here"},
            "throughput": {"env_steps": 10000, "env_steps_per_s": rate}, "latency": {}, "learning_curve": [],
            "timing": {"wall_s": 10.0, "cpu_s": 10.0, "started_unix": 1e9 + started}, "energy": {}, "accounting": {},
            "evaluation": {"episodes": 5, "mean_return": final},
            "evaluation_curve": {"every": 1000, "episodes": 5, "points": points} if points else None,
            "machine_state": {"contended": contended, "warning": "measured on a contended machine: other processes "
                              "used 1.20 core(s) meanwhile" if contended else ""},
            "study": study}


def synthetic_group(results: list[dict], **kwargs):
    """The study of `results`, as the report groups it (files named as a sweep names them)."""
    from rlbench.report.collect import Inputs, Run, group

    runs = [Run(f"/nowhere/runs/{data['study']['cell']}.json", data) for data in results]
    (study,) = group(Inputs(runs=runs), **kwargs)
    return study


def _row_classes(table: str) -> dict[str, list[str]]:
    rows = dict(re.findall(r"<tr><td class='name'>([^<]+)</td><td>\d+</td>(.*?)</tr>", table))
    return {label: re.findall(r"<td class='(\w*)'>", row) for label, row in rows.items()}


def test_one_or_two_runs_a_side_are_too_few_to_compare_or_bold():
    """A one-run range is a point: two runs far apart on each side are no evidence of a difference."""
    from rlbench.report.html import comparison_table
    from rlbench.report.measures import measures

    for seeds in (1, 2):
        study = synthetic_group([synthetic_result("CartPole-v1", {"replay": replay}, seed, 100.0 + seed,
                                                  rate=(100.0 if replay == "uniform" else 900.0) + seed)
                                 for seed in range(seeds) for replay in REPLAYS])
        table = comparison_table(study, measures(study))
        assert "class='best'" not in table and "too few runs to compare" in table, table
        lines = _compare(study)
        rate = next(line for line in lines if line.strip().startswith("env steps/s"))
        assert rate.endswith(f"too few runs to compare ({seeds} on a side; 3 at least)"), rate
        assert not re.search(r"\b[AB] better", "\n".join(lines)), lines


def _compare(study, a=("replay=prioritized",), b=("replay=uniform",)) -> list[str]:
    from rlbench.report.collect import Inputs
    from rlbench.report.compare import compare_within

    return compare_within(Inputs(runs=study.runs()), [study], a, b, "here")


def test_bold_and_compare_stay_within_one_environment():
    """Taxi's returns (about 8) and FrozenLake's (0 to 1) are not on one scale: each environment gets
    its own best, and `compare` with env open compares environment by environment under a header
    that says its brackets are ranges (3 seeds)."""
    from rlbench.report.html import comparison_table
    from rlbench.report.measures import measures

    finals = {("Taxi-v3", "uniform"): 7.9, ("Taxi-v3", "prioritized"): 7.1,
              ("FrozenLake-v1", "uniform"): 0.7, ("FrozenLake-v1", "prioritized"): 0.2}
    study = synthetic_group([synthetic_result(env, {"env": env, "replay": replay}, seed, final + 0.01 * seed)
                             for seed in range(3) for (env, replay), final in finals.items()])
    found = measures(study)
    final = [m.key for m in found].index("final_return")
    classes = _row_classes(comparison_table(study, found))
    assert classes["env=Taxi-v3 replay=uniform"][final] == "best"
    assert classes["env=FrozenLake-v1 replay=uniform"][final] == "best"  # before: outshone by Taxi's 7.9
    assert classes["env=FrozenLake-v1 replay=prioritized"][final] == classes["env=Taxi-v3 replay=prioritized"][final] == ""

    lines = _compare(study, ("replay=uniform",), ("replay=prioritized",))
    text = "\n".join(lines)
    assert "IQM [95 % CI]" not in text and "95% CI" not in text  # 3 seeds: ranges, and the header says so
    assert "  Taxi-v3 (A 3 runs, B 3 runs):" in lines and "  FrozenLake-v1 (A 3 runs, B 3 runs):" in lines
    for env, a, b in (("Taxi-v3", "7.9", "7.1"), ("FrozenLake-v1", "0.70", "0.20")):
        section = lines[lines.index(f"  {env} (A 3 runs, B 3 runs):"):]
        assert section[1].strip().startswith("measure (IQM [range])")
        row = next(line for line in section if line.strip().startswith("final greedy return"))
        assert f"{a}" in row and f"{b}" in row and row.endswith("A better (ranges apart)"), row
    assert "P(A beats B) = 1.00 n=12, averaged over 2 environments" in text


def test_superseded_by_a_quiet_rerun_only_when_the_rerun_was_quiet():
    from rlbench.report.compare import contention_lines

    results = []
    for seed, rerun_contended in ((0, False), (1, True)):
        cell = f"replay-uniform_seed-{seed}"
        first = synthetic_result("CartPole-v1", {"replay": "uniform"}, seed, 100.0, contended=True, cell=cell,
                                 started=2 * seed)
        rerun = synthetic_result("CartPole-v1", {"replay": "uniform"}, seed, 100.0, contended=rerun_contended,
                                 cell=cell, started=2 * seed + 1)
        results += [first, rerun]
    from rlbench.report.collect import Inputs, Run, group

    runs = []
    for index, data in enumerate(results):
        stem = data["study"]["cell"] + (".rerun-1" if index % 2 else "")
        runs.append(Run(f"/nowhere/runs/{stem}.json", data))
    (study,) = group(Inputs(runs=runs))
    lines = {line.split(":")[0].strip(): line for line in contention_lines([study])[1:]}
    assert lines["replay-uniform_seed-0"].endswith("(superseded by a quiet rerun, replay-uniform_seed-0.rerun-1)")
    assert "quiet" not in lines["replay-uniform_seed-1"]
    assert lines["replay-uniform_seed-1"].endswith(
        "(rerun, but the rerun was contended too: the statistics use replay-uniform_seed-1.rerun-1)")


def test_dollars_print_their_digits_and_equal_prints_are_never_better():
    """Cents' fractions: USD to the target was 0.0000 in every cell, yet bolded and called better."""
    from rlbench.report.compare import pairwise
    from rlbench.report.html import comparison_table
    from rlbench.report.measures import measures
    from rlbench.report.stats import Estimate

    # each reaches the target (10) at its 3rd..4th evaluation, 1 CPU-second per evaluation: 3-4 CPU-seconds,
    # about a hundred-thousandth of a dollar at 0.04 USD per CPU-hour
    results = [synthetic_result("CartPole-v1", {"replay": replay}, seed, 10.0,
                                evaluations=[0.0] * (2 + (replay == "uniform")) + [10.0] * 4)
               for seed in range(5) for replay in REPLAYS]
    study = synthetic_group(results, target_return=10.0, prices={"cpu": 0.04})
    dollars = next(m for m in measures(study) if m.key == "dollars_to_target")
    table = comparison_table(study, [dollars])
    assert "0.0000<" not in table and ">0.000033<" in table and ">0.000044<" in table, table
    assert _row_classes(table)["replay=prioritized"] == ["best"]  # 3 CPU-seconds against 4: apart, and printed apart
    lines = _compare(study)
    row = next(line for line in lines if line.strip().startswith("USD to return 10"))
    assert "0.000033 [0.000033, 0.000033] n=5" in row and row.endswith("A better (intervals apart)"), row
    # apart, yet the same number as printed: neither called better
    close = Estimate(0.0000331, 0.0000331, 0.0000331, 5), Estimate(0.0000333, 0.0000333, 0.0000333, 5)
    assert pairwise(dollars, *close) == "intervals apart, but equal as printed"


def test_rows_follow_the_study_files_order_not_the_file_names(tmp_path):
    from rlbench.report.collect import group, load_inputs

    # the study lists uniform first; its file names sort prioritized first, and its first cell started first
    written = {"study.toml": {"name": "order", "replay": ["uniform", "prioritized"]}, "block": None}
    for source in written:
        folder = tmp_path / source / "order"
        (folder / "runs").mkdir(parents=True)
        if source == "study.toml":  # results of a sweep before the block carried the order: its study.toml says it
            (folder / "study.toml").write_text('[sweep]\nname = "order"\nreplay = ["uniform", "prioritized"]\n')
        for seed in range(2):
            for replay in ("prioritized", "uniform"):
                data = synthetic_result("CartPole-v1", {"replay": replay}, seed, 100.0, name="order",
                                        started=seed * 2 + (replay == "uniform"),
                                        axis_values={"replay": ["uniform", "prioritized"]} if source == "block" else None)
                (folder / "runs" / f"{data['study']['cell']}.json").write_text(json.dumps(data))
        (study,) = group(load_inputs([str(folder)]))
        assert [c.label for c in study.combinations] == ["replay=uniform", "replay=prioritized"], source


# -- item 8: a sustained target, one aggregate where two are the same, the coverage of small intervals ----------
def test_reaching_the_target_is_sustained_and_the_rule_is_said():
    from rlbench.report.html import study_section
    from rlbench.report.measures import TARGET_EVALUATIONS, reach

    assert TARGET_EVALUATIONS == 3
    curves = {0: [0.0, 0.75, 0.0, 0.0, 0.0, 0.0],  # one lucky evaluation: never reached
              1: [0.0, 0.75, 0.0, 0.8, 0.8, 0.8],  # reached at the 4th, where it stays
              2: [0.0, 0.0, 0.0, 0.0, 0.8, 0.8]}   # still above at the end, but for two points only
    study = synthetic_group([synthetic_result("FrozenLake-v1", {"replay": "uniform"}, seed, 0.5, evaluations=curve)
                             for seed, curve in curves.items()], target_return=0.7)
    steps = {run.data["config"]["seed"]: reach(run, study).step for run in study.runs()}
    assert steps == {0: math.inf, 1: 4000.0, 2: math.inf}
    rule = "reached at the first of 3 consecutive evaluation points (--eval-every) whose greedy return each reaches it"
    assert rule in study_section(study)
    other = synthetic_group([synthetic_result("FrozenLake-v1", {"replay": replay}, seed, 0.5, evaluations=curves[1])
                             for seed in range(3) for replay in REPLAYS], target_return=0.7)
    assert f"  target: {rule}" in "\n".join(_compare(other))


def test_two_environments_show_median_and_mean_once():
    """The median of two per-environment means is their mean: one column, said so; three get both."""
    from rlbench.report.html import aggregate_section

    envs = ["CartPole-v1", "Acrobot-v1", "MountainCar-v0"]
    for count in (2, 3):
        study = synthetic_group([synthetic_result(env, {"env": env, "replay": replay}, seed,
                                                  REFERENCE_SCORES[env].random + 10.0 * (seed + 1))
                                 for seed in range(5) for env in envs[:count] for replay in REPLAYS])
        section = aggregate_section(study, {})
        heads = re.findall(r"<th>([^<]+?) [↑↓]</th>", section)
        if count == 2:
            assert heads == ["median = mean", "IQM", "optimality gap"], heads
            assert "Over two environments the median of the per-environment means is their mean" in section
        else:
            assert heads == ["median", "IQM", "mean", "optimality gap"], heads


def test_a_small_sample_interval_says_what_it_covers():
    from rlbench.report.html import comparison_table
    from rlbench.report.measures import measures

    for seeds, coverage in ((5, "90 %"), (8, "93 %"), (20, None)):
        study = synthetic_group([synthetic_result("CartPole-v1", {"replay": replay}, seed, 100.0 + seed)
                                 for seed in range(seeds) for replay in REPLAYS])
        table, lines = comparison_table(study, measures(study)), "\n".join(_compare(study))
        assert "measure (IQM [95 % CI])" in lines
        if coverage is None:
            assert "covers the true value" not in table + lines
        else:
            words = f"at {seeds} runs per environment a 95 % percentile bootstrap interval covers the true value " \
                    f"about {coverage} of the time"
            assert words in table and words in lines, lines


# -- item 9: figures ------------------------------------------------------------------------------------
def _two_environment_study(seeds: int = 3):
    return synthetic_group([synthetic_result(env, {"env": env, "replay": replay}, seed,
                                             TARGETS[env] + 10.0 * seed,
                                             evaluations=[REFERENCE_SCORES[env].random, TARGETS[env] + seed,
                                                          TARGETS[env] + 2 * seed, TARGETS[env] + 10.0 * seed])
                            for seed in range(seeds) for env in ENVS for replay in REPLAYS], target_return=TARGETS)


def test_curves_get_a_panel_per_environment_and_labelled_targets():
    """CartPole's returns (0..500) and Acrobot's (-500..0) on one y-axis flatten each other."""
    from rlbench.report.figures import evaluation_curves

    figure = evaluation_curves(_two_environment_study())
    axes = [ax for ax in figure.source.axes if ax.get_visible()]
    assert len(axes) == 4  # per environment: against env steps, against wall time
    assert [ax.get_title(loc="left") for ax in axes[::2]] == list(ENVS)
    for ax, env in zip(axes, [e for e in ENVS for _ in range(2)]):
        low, high = ax.get_ylim()
        assert low <= TARGETS[env] <= high and high - low < 700, (env, low, high)  # its own scale
        assert f"target {TARGETS[env]:g}" in [text.get_text() for text in ax.texts], env
    assert "one row of panels per environment (2)" in figure.caption and "CartPole-v1 200" in figure.caption


def test_latency_legend_fits_inside_the_figure():
    from rlbench.metrics import Histogram
    from rlbench.report.figures import latency_cdfs

    histogram = Histogram()
    for value in (1000, 2000, 5000, 20000):
        histogram.record(value)
    labels = [f"hp.hidden_sizes=256,256 replay=prioritized-with-a-long-name transport=tcp-{i}" for i in range(5)]
    results = []
    for index, label in enumerate(labels):
        data = synthetic_result("CartPole-v1", {"variant": label}, 0, 1.0)
        data["latency_histograms"] = {"replay.sample": histogram.to_dict(), "transport.send": histogram.to_dict()}
        results.append(data)
    figure = latency_cdfs(synthetic_group(results)).source
    figure.canvas.draw()
    (legend,) = figure.legends
    box, width = legend.get_window_extent(), figure.get_figwidth() * figure.dpi
    assert 0 <= box.x0 and box.x1 <= width, (box, width)
    assert len(legend.get_texts()) == len(labels)


def test_wide_tables_scroll_in_their_own_box():
    from rlbench.report.html import STYLE, aggregate_section, comparison_table, improvement_table
    from rlbench.report.measures import measures

    study = _two_environment_study()
    found = measures(study)
    assert re.search(r"\.wide \{[^}]*overflow-x: auto", STYLE)
    for html_text in (comparison_table(study, found), improvement_table(study, found[0]), aggregate_section(study, {})):
        tables = html_text.count("<table>")
        assert tables and html_text.count("<div class='wide'><table>") == tables


def test_the_aggregates_figure_shows_ranges_below_five_seeds():
    from rlbench.report.aggregate import aggregate_estimates
    from rlbench.report.figures import aggregate_intervals

    study = _two_environment_study(seeds=3)
    for _, estimates in aggregate_estimates(study):
        for name, e in estimates.items():
            assert e.kind == "range" and e.low <= e.value <= e.high and e.low < e.high, (name, e)
    figure = aggregate_intervals(study)
    panels = [ax for ax in figure.source.axes if ax.get_visible()]
    assert [ax.get_title() for ax in panels] == ["median = mean ↑", "IQM ↑", "optimality gap ↓"]
    assert all(len(ax.patches) == 2 for ax in panels)  # a bar per method, not a tick alone
    assert "hatched bar, with fewer than 5 runs in an environment (no interval): its range" in figure.caption
