"""Reports: a small real study (2 combinations x 3 seeds) -> `rlbench report` -> the page as headless
Chromium draws it; `rlbench compare`; `rlbench show` of every figure a result holds, and of files that
are not results."""

from __future__ import annotations

import base64
import json
import re
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest

from support import REPO, run_cli
from rlbench.report import browser
from rlbench.report.sweep import load_study, parse_grid, parse_sets, run_study

TINY = ["steps=600", "eval_episodes=1", "hp.learning_starts=200", "hp.batch_size=32"]
TAB10 = {"blue": (31, 119, 180), "orange": (255, 127, 14)}  # the first two combinations' colours


def _report(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlbench", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """A real study: prioritized and uniform replay, 3 seeds each, tiny budgets, local placement."""
    folder = tmp_path_factory.mktemp("study") / "replay"
    definition = load_study(None, sets=parse_sets(TINY), grid=parse_grid(["replay=prioritized,uniform"]), seeds=3,
                            name="replay", target_return=20.0, target_window=5)
    outcome = run_study(definition, folder, echo=lambda text: None)
    assert outcome.ok, [(o.cell.label, o.status, o.reason) for o in outcome.outcomes]
    return folder


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_report_page_loads_with_its_figures_in_chromium(study, tmp_path):
    if browser.chromium() is None:
        pytest.skip("chromium not installed: apt-get install chromium")
    page, shot = tmp_path / "report.html", tmp_path / "report.png"
    made = _report("report", str(study), "--out", str(page), "--screenshot", str(shot))
    assert made.returncode == 0, made.stderr
    html = page.read_text()
    assert not re.search(r"""(src|href)=['"]https?://""", html), "the page must not load anything from the network"
    images = re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", html)
    sizes = [_png_size(base64.b64decode(data)) for data in images]
    assert len(sizes) >= 3 and all(w >= 400 and h >= 250 for w, h in sizes), sizes  # curves, profile, CDFs
    for expected in ("replay=prioritized", "replay=uniform", "env steps/s", "final greedy return",
                     "wall time to return 20 (s)", "env steps to return 20", "P(row beats column)", "Machine fingerprint",
                     "measured", "the IQM of 3 runs trims 0 runs at each end (it is the mean)", "range ["):
        assert expected in html, expected

    dom = browser.dump_dom(page.as_uri())
    assert dom.returncode == 0 and dom.output.count("<img") == len(images)
    assert not dom.console, dom.console  # no script, so any console message is a failure to load
    assert shot.stat().st_size > 50_000
    from matplotlib.image import imread

    pixels = (imread(shot)[..., :3] * 255).round().astype(int)
    for name, colour in TAB10.items():  # the figures were decoded and drawn, not just laid out
        assert (np.abs(pixels - colour).sum(axis=-1) < 30).sum() > 200, f"no {name} line in the screenshot"


def test_report_table_holds_interval_estimates_over_the_seeds(study):
    from rlbench.report.collect import group, load_inputs
    from rlbench.report.measures import estimate, measures
    from rlbench.report.stats import iqm

    (only,) = group(load_inputs([str(study)]))
    assert only.name == "replay" and [c.label for c in only.combinations] == ["replay=prioritized", "replay=uniform"]
    assert all(len(c.runs) == 3 for c in only.combinations)
    rate = next(m for m in measures(only) if m.key == "env_steps_per_s")
    for combination in only.combinations:
        values = [run.data["throughput"]["env_steps_per_s"] for run in combination.runs]
        e = estimate(rate, combination, only)
        assert e.value == pytest.approx(iqm(values)) and e.n == 3
        slack = 1e-9 * max(values)  # the bootstrap's arithmetic may land an ulp outside the data
        assert min(values) - slack <= e.low <= e.value <= e.high <= max(values) + slack


def test_compare_two_result_sets(study, tmp_path):
    for replay in ("prioritized", "uniform"):
        (tmp_path / replay).mkdir()
        for path in study.glob(f"runs/replay-{replay}_seed-*.json"):
            shutil.copy(path, tmp_path / replay)
    compared = _report("compare", str(tmp_path / "prioritized"), str(tmp_path / "uniform"))
    assert compared.returncode == 0, compared.stderr
    lines = compared.stdout.splitlines()
    rate = next(line for line in lines if line.strip().startswith("env steps/s"))
    # three seeds: the runs' ranges, never "intervals apart"
    assert rate.count("n=3") == 2 and rate.count("range [") == 2
    assert re.search(r"(A better|B better) \(ranges apart\)|within the ranges", rate)
    assert "intervals apart" not in compared.stdout
    assert any(line.strip().startswith("P(A beats B), final greedy return") for line in lines)
    assert any(line.strip().startswith("verdict (clock: env steps; env steps to return 20)") for line in lines)
    nothing = _report("compare", str(tmp_path / "prioritized"), str(tmp_path / "missing"))
    assert nothing.returncode == 2 and nothing.stderr.strip() == f"error: no such file or folder: {tmp_path / 'missing'}"


def test_report_reads_asv_results_beside_the_study(study, tmp_path):
    commit = "0123456789abcdef"
    asv = tmp_path / "asv" / "machine-a"
    asv.mkdir(parents=True)
    (asv / "machine.json").write_text(json.dumps({"machine": "machine-a", "version": 1}))
    for index, value in enumerate((100.0, 120.0)):
        (asv / f"{index}{commit[1:8]}-existing.json").write_text(json.dumps({
            "commit_hash": f"{index}{commit[1:]}", "date": 1000 + index, "version": 2, "params": {"machine": "machine-a"},
            "result_columns": ["result", "params"],
            "results": {"bench_env.Step.track_steps_per_s": [[value, value * 2], [["'CartPole-v1'"], ["'1'", "'8'"]]],
                        "bench_transport.Transport.track_round_trip_p50": [[10.0, 30.0], [["'shm'"], ["'64'", "'4096'"]]]}}))
    (tmp_path / "asv" / "benchmarks.json").write_text(json.dumps(
        {"bench_env.Step.track_steps_per_s": {"name": "bench_env.Step.track_steps_per_s", "type": "track", "unit": "steps/s"},
         "version": 2}))
    page = tmp_path / "both.html"
    made = _report("report", str(study), str(tmp_path / "asv"), "--out", str(page))
    assert made.returncode == 0, made.stderr
    html = page.read_text()
    assert "Micro-benchmark history" in html and "Transport latency against message size" in html
    assert "replay=prioritized" in html  # the study is on the same page


def test_report_skips_foreign_files_in_a_folder_but_refuses_them_by_name(study, tmp_path):
    folder = tmp_path / "mixed"
    shutil.copytree(study, folder)
    (folder / "junk.json").write_bytes(b"\x00\xff\xfe binary")
    made = _report("report", str(folder), "--out", str(tmp_path / "r.html"))
    assert made.returncode == 0, made.stderr
    assert "skipped" in made.stderr and "junk.json is not a text file" in made.stderr
    named = _report("report", str(folder / "junk.json"), "--out", str(tmp_path / "r.html"))
    assert named.returncode == 2 and len(named.stderr.strip().splitlines()) == 1
    assert "junk.json is not a text file (binary data)" in named.stderr


# -- rlbench show ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def distributed_result(tmp_path_factory):
    path = tmp_path_factory.mktemp("show") / "server.json"
    done = run_cli("run", "--placement", "server", "--transport", "shm", "--actors", "2", "--steps", "800",
                   "--eval-episodes", "1", "--hp", "learning_starts=200", "--hp", "batch_size=32", "--out", str(path),
                   env_extra={"OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    return path


def test_show_prints_the_distributed_figures(distributed_result):
    shown = run_cli("show", str(distributed_result))
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    assert re.search(r"rate limiter: samples per insert target [\d.,]+, achieved [\d.,]+", text)
    for role in ("actor-0", "actor-1", "learner", "replay"):
        assert re.search(rf"^\s+{role}\s", text, re.M), role
    assert "weight staleness" in text and "MB out" in text and "msgs in" in text
    assert re.search(r"actor-0 .* \d+(\.\d)? / \d+", text)  # its staleness p50 / max


def test_show_prints_fields_other_parts_add_and_labels_modelled_ones(distributed_result, tmp_path):
    data = json.loads(distributed_result.read_text())
    data["timing"]["startup_s"] = 1.25
    data["throughput"]["steady_env_steps_per_s"] = 1234.5
    data["loop"]["time_split"] = {"learner": {"env": 0.0, "learner": 3.2, "replay": 0.4, "transport": 0.3,
                                              "bookkeeping": 0.1, "window_s": 4.0, "bookkeeping_share": 0.025}}
    data["machine_state"] = {"load_before": 0.5, "load_after": 2.5, "steal_percent": 3.0, "contended": True,
                             "warning": "load rose above the core count"}
    data["loop"]["roles"]["learner"]["host"] = "node-7"
    data["loop"]["roles"]["replay"]["link"].update(lost=12, sequence_resets=3)  # udp's flag (issue #40)
    data["components"]["replay"] = {"name": "fpga", "plugin": "fpga", "description": "",
                                    "device": {"device": "Stratix 10", "platform": "Intel FPGA", "emulation": True,
                                               "emulation_kind": "Intel FPGA emulator"}}
    data["modelled"] = {"fpga board": {"kind": "modelled", "seconds": 0.0123}}
    path = tmp_path / "extended.json"
    path.write_text(json.dumps(data))
    shown = run_cli("show", str(path))
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    assert "start-up 1.2 s" in text or "start-up 1.3 s" in text
    assert "steady state (first to last env step): 1,234.5 env steps/s" in text
    assert "steady state at the replay node (first to last INSERT)" in text
    assert re.search(r"time split \(s\)\s+env\s+learner\s+replay\s+transport\s+bookkeeping\s+window_s\n", text)
    assert re.search(r"^\s+learner\s+0\.00\s+3\.20\s+0\.40\s+0\.30\s+0\.10\s+4\.00$", text, re.M)
    assert re.search(r"learner\s+node-7", text)
    assert re.search(r"^\s+replay\s.*lost 12 \(\+3 sequence resets, uncounted\)$", text, re.M)
    assert "WARNING: machine was contended: load rose above the core count" in text
    assert "device: replay fpga on Stratix 10 (Intel FPGA) [emulated: Intel FPGA emulator]" in text
    assert "modelled, not measured (fpga board): seconds=0.0123" in text


def test_show_prints_the_replay_nodes_descriptor_limit_and_the_strangers_it_kept_out(distributed_result, tmp_path):
    """Issue #40: the node raises its descriptor limit at start-up and says so; where its listener keeps
    strangers apart, how many it shed, timed out and paused for, on the same line."""
    data = json.loads(distributed_result.read_text())
    limit = data["loop"]["roles"]["replay"]["descriptors"]
    assert limit["soft"] == limit["hard"] >= limit["soft_before"]  # this run's node, as it reported
    data["loop"]["roles"]["replay"]["descriptors"] = {"soft_before": 1024, "soft": 524288, "hard": 524288}
    data["loop"]["roles"]["replay"]["link"].update(strangers_shed=972, handshake_timeouts=128, accept_backoffs=0)
    path = tmp_path / "strangers.json"
    path.write_text(json.dumps(data))
    shown = run_cli("show", str(path))
    assert shown.returncode == 0, shown.stderr
    assert re.search(r"^\s+replay: open descriptors up to 524,288 \(was 1,024, hard limit 524,288\); strangers shed 972, "
                     r"handshake timeouts 128, accept backoffs 0$", shown.stdout, re.M), shown.stdout


@pytest.mark.parametrize("content, message", [
    (b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe", "is not a text file (binary data)"),
    ("wrong type", "field 'throughput.env_steps_per_s' should be a number, got str \"fast\""),
    ("wrong table", "field 'latency' should be an object, got list [1, 2]"),
    ("wrong curve", "field 'learning_curve' should hold objects with a numeric 'return'"),
])
def test_show_refuses_what_is_not_a_readable_result_in_one_line(distributed_result, tmp_path, content, message):
    path = tmp_path / "given.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        data = json.loads(distributed_result.read_text())
        if content == "wrong type":
            data["throughput"]["env_steps_per_s"] = "fast"
        elif content == "wrong table":
            data["latency"] = [1, 2]
        else:
            data["learning_curve"] = [{"step": 1, "return": "high"}]
        path.write_text(json.dumps(data))
    shown = run_cli("show", str(path))
    assert shown.returncode == 2, shown.stdout
    assert len(shown.stderr.strip().splitlines()) == 1 and "Traceback" not in shown.stderr
    assert message in shown.stderr


def test_render_never_raises_anything_but_a_one_line_error(distributed_result):
    """Every field of a real result replaced by values of other types: a rendering or an RlbenchError."""
    _fuzz_render(json.loads(distributed_result.read_text()))


def test_render_of_shards_and_checkpoints_never_raises_anything_but_a_one_line_error(sharded_result):
    data = json.loads(json.dumps(sharded_result))
    data["loop"]["actor_incarnations"] = [{"slot": "actor-0", "died": "actor-0", "why": "killed", "replaced_by": "actor-3"}]
    data["resumed_from"] = {"checkpoint": "ckpt-000001", "directory": "d", "env_steps": 1, "stored": 1, "resumes": 1}
    _fuzz_render(data, within=("loop.replay_shards", "loop.actor_incarnations", "checkpoints", "resumed_from"))


def _fuzz_render(base: dict, within: tuple[str, ...] = ()) -> None:
    """Each field (or each under `within`'s dotted prefixes) replaced by values of other types."""
    import copy

    from rlbench.errors import RlbenchError
    from rlbench.results import check, render

    paths: list[list] = []

    def walk(value, path):
        paths.append(path)
        if isinstance(value, dict):
            for key, item in value.items():
                walk(item, [*path, key])
        elif isinstance(value, list):
            for index, item in enumerate(value[:2]):
                walk(item, [*path, index])

    walk(base, [])
    for path in paths[1:]:
        dotted = ".".join(map(str, path))
        if path[0] == "latency_histograms" or within and not dotted.startswith(within):
            continue  # not rendered (the latency table is its summary), or not what this test is for
        for replacement in ("x", 7, None, [1], {"a": 1}, True):
            data = copy.deepcopy(base)
            parent = data
            for key in path[:-1]:
                parent = parent[key]
            parent[path[-1]] = replacement
            try:
                render(check(data, "given.json"))
            except RlbenchError as error:
                assert "\n" not in str(error)


def test_study_commands_import_nothing_heavy():
    probe = ("import sys, rlbench.cli, rlbench.report.cli, rlbench.report.sweep; "
             "print([m for m in ('matplotlib', 'scipy', 'torch') if m in sys.modules])")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# -- rlbench show prints all the result holds (issue #41 item 2) ---------------------------------------------
@pytest.fixture(scope="module")
def sharded_result(tmp_path_factory):
    """A distributed run over two replay shards that writes checkpoints: the fields a plain run leaves empty."""
    where = tmp_path_factory.mktemp("sharded")
    done = run_cli("run", "--placement", "server", "--transport", "tcp", "--actors", "3", "--replay-shards", "2",
                   "--steps", "2000", "--eval-episodes", "1", "--hp", "learning_starts=200", "--hp", "batch_size=32",
                   "--checkpoint-every", "0.3", "--checkpoint-dir", str(where / "ckpt"), "--out", str(where / "run.json"),
                   env_extra={"OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    return json.loads((where / "run.json").read_text())


def _printed_of(result: dict) -> dict[str, list[str]]:
    """For each top-level field of a result, text `show` prints only where it prints that field's values."""
    config, fingerprint, curve = result["config"], result["fingerprint"], result["learning_curve"]
    shards, written = result["loop"]["replay_shards"], result["checkpoints"]["written"]
    on_header = ("algo", "env", "actor_compute")
    return {
        "schema": [result["schema"]],
        "rlbench_version": [result["rlbench_version"]],
        "status": [result["status"].upper()],
        "status_reason": [str(result["status_reason"])],
        "stop_signal": [str(result["stop_signal"])],
        "notes": [f"note: {note}" for note in result["notes"]],
        "config": [f"{config['algo']} on {config['env']}"]
        + [f"{key}={value}" for key, value in config.items()
           if key not in on_header and value is not None and not isinstance(value, (dict, list))],
        "hyperparameters": [f"{key}={value}" for key, value in result["hyperparameters"].items()
                            if not isinstance(value, (dict, list))],
        "components": [f"{kind}={component['name']}" for kind, component in result["components"].items()],
        "fingerprint": [fingerprint["hostname"], fingerprint["cpu"], f"python {fingerprint['python']}"]
        + [f"{package} {version}" for package, version in fingerprint["packages"].items()],
        "timing": [f"wall {result['timing']['wall_s']:,.1f} s"],
        "throughput": [f"env steps {result['throughput']['env_steps']:,}"],
        "machine_state": [f"busy_processes={result['machine_state']['busy_processes']}"],
        "latency": list(result["latency"]),
        "latency_histograms": list(result["latency_histograms"]),
        "counters": [f"{name}={value:,}" for name, value in result["counters"].items()],
        "learning_curve": [f"training episodes {len(curve)}", f"steps {curve[0]['step']:,}"],
        "evaluation": [f"greedy evaluation over {result['evaluation']['episodes']} episodes"],
        "returns": [f"learning curve {result['returns']['learning_curve']}"],
        "evaluation_curve": ["evaluation curve"],
        "energy": [f"energy ({meter})" for meter in result["energy"]],
        "accounting": [f"transitions produced {result['accounting']['produced']:,}"],
        "loop": [f"{sum(s['size'] for s in shards.values()):,} of "
                 f"{sum(s['memory']['capacity'] for s in shards.values()):,} stored"]
        + [f"shard {name}: {shard['size']:,} of {shard['memory']['capacity']:,} stored" for name, shard in shards.items()],
        "bookkeeping_share": [f"{result['bookkeeping_share']:.1%}"],
        "modelled": [f"modelled, not measured ({label})" for label in result["modelled"]],
        "replay_stats": [f"{result['replay_stats']['capacity']:,}"],
        "checkpoints": [f"checkpoints: {len(written)} written to {result['checkpoints']['directory']}",
                        f"the last at env step {written[-1]['env_steps']:,}"],
        "resumed_from": ["resumed from"],
        "path": [f"result: {result.get('path')}"],
    }


def test_show_prints_every_top_level_field_a_distributed_result_holds(sharded_result):
    from rlbench.results import render

    printed = _printed_of(sharded_result)
    assert set(sharded_result) <= set(printed), f"fields nobody checks show prints: {set(sharded_result) - set(printed)}"
    text = render(sharded_result)
    held = [name for name, value in sharded_result.items() if value not in (None, {}, [], "")]
    missing = {name: [part for part in printed[name] if part not in text] for name in held}
    assert not any(missing.values()), {name: parts for name, parts in missing.items() if parts}


def test_show_prints_each_shard_what_a_resumed_run_continued_and_each_actor_replaced(sharded_result):
    """Shard 0's memory is not the run's: a 2-shard run's `replay memory` line sums the shards, each
    shard has its own; a resumed run's checkpoint and an actor's incarnations, as the driver writes them."""
    from rlbench.results import render

    data = json.loads(json.dumps(sharded_result))
    shards = data["loop"]["replay_shards"]
    assert len(shards) == 2 and data["replay_stats"]["size"] == shards["replay"]["size"] < data["accounting"]["stored"]
    data["resumed_from"] = {"checkpoint": "ckpt-000007", "directory": "/runs/ckpt", "env_steps": 11_136, "stored": 11_000,
                            "learner_updates": 5_432, "written_at": 1.7e9, "stored_by": {"actor-0": 11_000}, "resumes": 2}
    data["loop"]["actor_incarnations"] = [{"slot": "actor-0", "died": "actor-0", "why": "exit code -9 (SIGKILL)",
                                           "replaced_by": "actor-3"}]
    text = render(data)
    stored = sum(shard["size"] for shard in shards.values())
    assert re.search(rf"replay memory \(2 shards\): {stored:,} of [\d,]+ stored", text), text
    for name, shard in shards.items():
        by = ", ".join(f"{actor} {count:,}" for actor, count in shard["stored_by"].items())
        assert f"shard {name}: {shard['size']:,} of {shard['memory']['capacity']:,} stored" in text and by in text
    assert "resumed from ckpt-000007 in /runs/ckpt (resume 2): 11,136 env steps, 11,000 stored, 5,432 learner updates" \
        " before this run" in text, text
    assert "actor restarts: actor-0 died (exit code -9 (SIGKILL)), replaced by actor-3" in text, text
