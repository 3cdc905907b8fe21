"""The asv suites: the fixed component lists cover every in-repo component, the matrix skips what the
CLI's validator refuses, and the quick suite runs for real through scripts/asv_quick.sh (asv, existing
environment), whose published dashboard, served by `rlbench dashboard` as a user opens it, headless
Chromium draws offline (screenshot kept at results/asv-dashboard.png)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import re
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from rlbench.bench import matrix
from rlbench.errors import RlbenchError
from rlbench.plugins import get_registry
from rlbench.validate import validate

ROOT = Path(__file__).resolve().parents[1]
SCREENSHOT = ROOT / "results" / "asv-dashboard.png"
SUITES = ("bench_transport", "bench_replay", "bench_compute", "bench_env", "bench_e2e")
DEBIAN_PACKAGES = "chromium libjs-jquery libjs-jquery-flot libjs-jquery-stupidtable libjs-bootstrap node-blueimp-md5"


def in_repo_plugins() -> set[str]:
    """builtin plus the entry-point names declared by the plugin folders of this repository."""
    names = {"builtin"}
    for pyproject in [*ROOT.glob("plugins/*/pyproject.toml"), *ROOT.glob("examples/*/pyproject.toml")]:
        data = tomllib.loads(pyproject.read_text())
        names |= set(data.get("project", {}).get("entry-points", {}).get("rlbench", {}))
    return names


def test_fixed_lists_name_every_registered_in_repo_component():
    registry = get_registry()
    plugins = in_repo_plugins()
    missing = [f"{c.kind} {c.name!r} (plugin {c.plugin})" for c in registry.components()
               if c.plugin in plugins and c.name not in matrix.COMPONENTS[c.kind]]
    assert not missing, f"add to rlbench/bench/matrix.py's fixed lists: {', '.join(missing)}"


def test_suite_parameters_are_plain_strings_from_the_fixed_lists():
    sys.path.insert(0, str(ROOT))
    try:
        from suites import bench_compute, bench_e2e, bench_env, bench_replay, bench_transport
    finally:
        sys.path.remove(str(ROOT))
    end_to_end = (bench_e2e.ReplayLoop, bench_e2e.Tabular, bench_e2e.Workloads)
    for cls in (bench_transport.Transport, bench_replay.Replay, bench_compute.Inference, bench_compute.LearnerUpdate,
                bench_compute.TabularUpdate, bench_env.Step, *end_to_end):
        assert len(cls.params) == len(cls.param_names)
        assert all(isinstance(value, str) for values in cls.params for value in values), cls.__name__
    assert bench_transport.Transport.params[0] == list(matrix.TRANSPORTS)
    assert bench_replay.Replay.params[0] == list(matrix.REPLAYS)
    assert bench_env.Step.params[0] == list(matrix.ENVIRONMENTS)
    assert set(matrix.QUICK_ENVIRONMENTS) <= set(matrix.ENVIRONMENTS)
    grid = {cell.label for cell in matrix.grid()}
    assert len(grid) == sum(math.prod(map(len, cls.params)) for cls in end_to_end)
    assert {cell.label for cell in matrix.QUICK} <= grid
    # the dashboard's existing series keep their keys: the classic rows are named by their algorithm
    assert bench_e2e.ReplayLoop.params[0] == ["dqn", "ddpg"] and bench_e2e.ReplayLoop.param_names[0] == "algo"
    assert matrix.Cell("dqn", "local", "inproc", "prioritized", "cpu").label == "dqn/local/inproc/prioritized/cpu"


def test_matrix_skips_with_the_validators_own_message():
    registry = get_registry()
    invalid = matrix.Cell("dqn", "server", "inproc", "uniform", "cpu")  # inproc cannot cross processes
    with pytest.raises(RlbenchError) as refused:
        validate(invalid.run_config(), registry)
    assert matrix.skip_reason(invalid, registry) == str(refused.value)
    tabular_remote = matrix.Cell("qlearning", "in-network", "inproc", matrix.NO_REPLAY, "cpu")
    assert "placement local only" in matrix.skip_reason(tabular_remote, registry)
    assert "uses no transport" in matrix.skip_reason(matrix.Cell("dqn", "local", "tcp", "uniform", "cpu"), registry)
    assert matrix.skip_reason(matrix.Cell("dqn", "local", "inproc", "uniform", "cpu"), registry) is None


def test_quick_cells_are_never_refused_as_invalid_combinations():
    """A quick cell may lack its hardware here, but the validator must accept the combination."""
    registry = get_registry()
    for cell in matrix.QUICK:
        reason = matrix.skip_reason(cell, registry)
        assert reason is None or "unavailable" in reason or "not registered" in reason, (cell.label, reason)


def test_the_real_workloads_are_rows_whose_invalid_cells_skip_with_the_validators_reason():
    """Atari, MinAtar and MuJoCo in the grid: their cells run where the CLI would run them, and the
    others (a backend without convolutions under frames, an in-process transport across processes) are
    skipped with the validator's own message. No run needed."""
    registry = get_registry()
    families = {name: registry.get("environment", matrix.WORKLOADS[name].env).capabilities.family
                for name in matrix.REAL_WORKLOADS}
    assert families == {"dqn-minatar-breakout": "minatar", "dqn-atari-breakout": "atari",
                        "ddpg-mujoco-halfcheetah": "mujoco"}
    runnable: dict[str, int] = {}
    for cell in matrix.replay_loop_cells(matrix.REAL_WORKLOADS):
        reason = matrix.skip_reason(cell, registry)
        if reason is None:
            validate(cell.run_config(), registry)  # what the matrix runs, the CLI accepts
            runnable[cell.workload] = runnable.get(cell.workload, 0) + 1
        elif "not registered" not in reason and "uses no transport" not in reason:
            with pytest.raises(RlbenchError) as refused:
                validate(cell.run_config(), registry)
            assert reason == str(refused.value), cell.label
        image = families[cell.workload] != "mujoco"
        measured = cell.placement != "local" or cell.transport == matrix.LOCAL_TRANSPORT
        if image and measured and cell.compute in ("fpga", "upmem") and cell.compute in registry.names("compute"):
            assert reason is not None and "convolutional network" in reason, (cell.label, reason)
    for name in matrix.REAL_WORKLOADS:
        local_cpu = matrix.Cell(name, "local", "inproc", "prioritized", "cpu")
        reason = matrix.skip_reason(local_cpu, registry)
        assert reason is None or "unavailable" in reason, (local_cpu.label, reason)
        if reason is None:  # its package is installed: the job runs under every placement here
            assert runnable[name] >= 1 + 2 * 2, (name, runnable)  # local, server and in-network over shm and tcp
        workload = matrix.WORKLOADS[name]
        assert workload.threshold is None and workload.no_threshold  # said in the table, NaN in the results
        assert workload.hyperparameters["learning_starts"] < workload.steps
        assert workload.hyperparameters["buffer_size"] <= workload.steps  # not the preset's 1 M frames
        assert workload.env in matrix.QUICK_ENVIRONMENTS


def test_a_short_image_cell_runs_through_the_matrix(monkeypatch):
    """MinAtar DQN through the matrix's own path (run_cells, measure, the table), on a budget of a few
    hundred steps instead of the workload's: the CNN learns from frames the memory stores once."""
    registry = get_registry()
    cell = matrix.Cell("dqn-minatar-breakout", "local", "inproc", "prioritized", "cpu")
    reason = matrix.skip_reason(cell, registry)
    if reason is not None:
        pytest.skip(reason)
    workload = matrix.WORKLOADS[cell.workload]
    short = dataclasses.replace(workload, steps=400, hyperparameters={
        **workload.hyperparameters, "learning_starts": 100, "buffer_size": 400, "exploration_steps": 200})
    monkeypatch.setitem(matrix.WORKLOADS, cell.workload, short)
    outcomes = matrix.run_cells([cell], lambda c: True)
    metrics = outcomes[cell.label]["metrics"]
    assert metrics["env_steps_per_s"] > 0 and metrics["updates_per_s"] > 0  # (400 - 100) / 4 updates
    assert math.isnan(metrics["time_to_threshold_s"])  # no threshold: NaN, never a number
    table = matrix.format_table([cell], outcomes, matrix.SEED)
    assert "dqn-minatar-breakout: dqn on MinAtar/Breakout-v1, 400 steps; no threshold: " in table
    row = next(line for line in table.splitlines() if line.startswith("dqn-minatar-breakout "))
    assert row.split()[-1] == "-" and row.split()[6] == "1.00", row  # its own local-cpu baseline


def test_time_to_threshold_uses_the_moving_window():
    curve = [{"return": r, "time_s": float(t)} for t, r in enumerate([10, 30, 50, 70, 90], start=1)]
    assert matrix.time_to_threshold(curve, 60.0, 2) == 4.0  # (50 + 70) / 2 = 60 at the 4th episode
    assert math.isnan(matrix.time_to_threshold(curve, 85.0, 2))


# -- the quick suite, for real ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """scripts/asv_quick.sh, as CI runs it, with results and dashboard in a temp dir."""
    if importlib.util.find_spec("asv") is None:
        pytest.skip("asv not installed: pip install asv")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("not a git checkout: asv records results under a commit")
    work = tmp_path_factory.mktemp("asv")
    conf = json.loads(re.sub(r"^\s*//.*$", "", (ROOT / "asv.conf.json").read_text(), flags=re.M))
    conf.update(repo=str(ROOT), benchmark_dir=str(ROOT / "suites"), results_dir=str(work / "results"),
                html_dir=str(work / "html"), env_dir=str(work / "env"))
    (work / "asv.conf.json").write_text(json.dumps(conf))
    # asv's machine file lives in $HOME: use a private one, keeping the real cache (PoCL's compiled kernels).
    env = dict(os.environ, HOME=str(work), XDG_CACHE_HOME=os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache")),
               OMP_NUM_THREADS="1", RLBENCH_ASV_MATRIX="quick", RLBENCH_ASV_MACHINE="rlbench-test",
               RLBENCH_ASV_CONFIG=str(work / "asv.conf.json"), RLBENCH_VENV=str(Path(sys.executable).parents[1]))
    run = subprocess.run(["bash", str(ROOT / "scripts" / "asv_quick.sh")], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=1500)
    return {"run": run, "work": work, "env": env, "commit": head.stdout.strip()}


def _results(quick_run) -> dict:
    (path,) = [p for p in (quick_run["work"] / "results" / "rlbench-test").glob("*.json") if p.name != "machine.json"]
    return json.loads(path.read_text())


def test_quick_suite_runs_every_benchmark_without_failure(quick_run):
    run = quick_run["run"]
    failures = [line for line in run.stdout.splitlines()
                if re.search(r"failed\s*$", line) or ("Error" in line and "NotImplementedError" not in line)]
    assert run.returncode == 0, "asv run failed:\n" + "\n".join(failures) + "\n" + run.stderr[-3000:]
    result = _results(quick_run)
    names = set(result["results"])
    for suite in SUITES:
        assert any(name.startswith(suite + ".") for name in names), f"{suite} did not run"
    # Every quick cell that can run here was measured: a number, not a skip.
    columns = result["result_columns"]
    steps = dict(zip(columns, result["results"]["bench_e2e.ReplayLoop.track_env_steps_per_s"]))
    params = [list(p) for p in steps["params"]]
    registry = get_registry()
    import itertools

    index = {cell: i for i, cell in enumerate(itertools.product(*params))}
    for cell in matrix.QUICK:
        if cell.algo in matrix.REPLAY_LOOP_ALGORITHMS and matrix.skip_reason(cell, registry) is None:
            key = tuple(repr(v) for v in (cell.algo, cell.placement, cell.transport, cell.replay, cell.compute))
            value = steps["result"][index[key]]
            assert value is not None and value > 0, (cell.label, value)


def test_results_carry_the_hardware_fingerprint_beside_the_machine_name(quick_run):
    params = _results(quick_run)["params"]
    assert params["machine"] == "rlbench-test"
    for plugin in ("dpdk", "fpga", "upmem", "gpu"):
        assert params.get(f"rlbench_{plugin}"), f"no {plugin} fingerprint in {sorted(params)}"


def test_dashboard_lists_the_suites_and_draws_a_graph_offline(quick_run):
    """What a user opens: the dashboard the script published, served by `rlbench dashboard`."""
    from rlbench.report import browser

    if browser.chromium() is None:
        pytest.skip("chromium not installed: apt-get install chromium")
    from rlbench.report.dashboard import LOCAL_COPIES

    missing = [str(path) for path in LOCAL_COPIES.values() if not path.exists()]
    if missing:
        pytest.skip(f"dashboard libraries missing ({', '.join(missing)}): apt-get install {DEBIAN_PACKAGES}")
    assert "asv_quick: dashboard published" in quick_run["run"].stdout, quick_run["run"].stderr[-3000:]
    index = (quick_run["work"] / "html" / "index.html").read_text()
    remote = re.findall(r'<(?:script|link)[^>]*(?:src|href)="(https?://[^"]+)"', index)
    assert not remote, f"the published page still loads from the internet: {remote}"
    server = subprocess.Popen([sys.executable, "-m", "rlbench", "dashboard", "--no-publish", "--port", "0",
                               "--config", str(quick_run["work"] / "asv.conf.json")],
                              cwd=ROOT, env=quick_run["env"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        announced = server.stdout.readline()
        match = re.search(r"dashboard at (http://\S+)", announced)
        assert match, (announced, server.stderr.read() if server.poll() is not None else "")
        base = match.group(1)
        listing = browser.dump_dom(base)
        graph_url = base + "#bench_e2e.ReplayLoop.track_env_steps_per_s"
        graph = browser.dump_dom(graph_url)
        shot = browser.screenshot(graph_url, SCREENSHOT, 1400, 1000)
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
    assert "failed to load" not in listing.output, "the dashboard's scripts did not load"
    assert not listing.errors and not graph.errors, listing.errors + graph.errors
    for suite in SUITES:
        assert suite in listing.output, f"dashboard does not list {suite}"
    assert "flot-base" in graph.output and "<canvas" in graph.output, "no graph drawn"
    assert not shot.errors and SCREENSHOT.stat().st_size > 10_000
