"""The benchmark commands, run as users run them: on the CPU device they label their figures so and
print their peers; `gpu dqn` runs the registered components through rlbench.run, so CUDA only."""

import json
import os
import re
import subprocess
import sys

import pytest
import torch


def rlbench_command(*args, expect=0):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "rlbench", *args], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == expect, done.stderr[-2000:]
    return done.stdout + done.stderr


def test_bench_env_prints_gpu_envs_beside_gymnasium_and_the_core():
    out = rlbench_command("bench", "env", "--device", "cpu", "--num-envs", "32", "--seconds", "0.05")
    assert "NOT a GPU figure" in out
    for row in ("gpu/CartPole-v1   float64 eager", "gpu/Pendulum-v1   float32 eager", "CartPoleVectorEnv",
                "core GymnasiumEnv (reference)"):
        assert row in out


def test_gpu_replay_benchmark_compares_with_the_core_memory():
    out = rlbench_command("gpu", "replay", "--device", "cpu", "--capacity", "2000", "--batch-size", "32",
                          "--seconds", "0.05")
    assert "NOT a GPU figure" in out and "prioritized (core, host)" in out and "gpu / prioritized: x" in out


@pytest.mark.skipif(not torch.cuda.is_available(), reason=f"gpu dqn needs a CUDA device: torch.cuda.is_available() "
                                                          f"is False (torch {torch.__version__})")
def test_gpu_dqn_benchmark_runs_both_sides_through_rlbench_run():
    out = rlbench_command("gpu", "dqn", "--num-envs", "16", "--steps", "640", "--hp", "learning_starts=128",
                          "--hp", "batch_size=32", "--hp", "buffer_size=1000")
    assert "gpu env + gpu replay + gpu compute" in out and "gymnasium env + prioritized + cpu compute" in out
    assert "gpu / cpu env steps/s: x" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path; this machine has CUDA")
@pytest.mark.parametrize("device, reason", [("cuda", "no CUDA device: "), ("cpu", "run on CUDA only; --device cpu")])
def test_gpu_dqn_without_cuda_is_refused_in_one_line(device, reason):
    out = rlbench_command("gpu", "dqn", "--device", device, "--steps", "64", expect=2)
    assert reason in out and len(out.strip().splitlines()) == 1


def test_gpu_bench_prints_every_target_figure_beside_its_peers_labelled_on_the_cpu_device():
    out = rlbench_command("gpu", "bench", "--device", "cpu", "--seconds", "0.05", "--num-envs", "64", "--capacity",
                          "5000", "--dqn-capacity", "5000", "--e2e-steps", "1100")
    assert "NOT a GPU figure" in out and "energy: no NVML reading on the CPU device" in out
    for title in ("DQN updates/s", "replay sample(256) + update cycles/s", "gpu/CartPole-v1 env steps/s",
                  "DQN CartPole end to end", "DDPG Pendulum end to end"):
        assert title in out
    assert out.count("target on an H100") == 5 and out.count("not judged: the targets are an H100's") == 5
    # each peer's own row reads x1.00 (another row may too, where it ties its peer within 0.5 %: once in CI)
    lines = out.splitlines()
    peer_rows = [lines[i + 1] for i, line in enumerate(lines) if line.lstrip().startswith("CPU peer:")]
    assert len(peer_rows) == 5 and all("x1.00 peer" in row for row in peer_rows)
    assert out.count("reference: plain torch") == 6 and out.count("[not run: CUDA graphs need CUDA]") == 3
    assert out.count("rlbench.run builds the registered gpu components, which need CUDA") == 2
    assert len(re.findall(r"x[0-9.]+ peer; [1-9][0-9]* ops", out)) >= 6  # rlbench's and the references' ops per unit
    for line in (line for line in out.splitlines() if line.startswith("      ")):
        assert line.rstrip().endswith("]"), line  # every row says how it was measured, or why not


def test_targets_are_judged_only_on_cuda_and_against_the_best_rlbench_row():
    from types import SimpleNamespace

    from rlbench_gpu.suite import Figure, Row, judge

    def figure(key, target, ours, peer, **extra):
        return Figure(key, "t", target, rows=[Row("rlbench: a", "cuda:0", ours, extra=dict(extra)),
                                              Row("rlbench: b", "cuda:0", ours / 2),
                                              Row("CPU peer: c", "host", peer)], peer="CPU peer")

    on_cuda, on_cpu = SimpleNamespace(on_cuda=True), SimpleNamespace(on_cuda=False)
    rate = figure("dqn_updates", 25_000, 30_000, 400)
    judge(rate, on_cuda)
    assert rate.judged.startswith("met: 30,000.0") and rate.rows[0].extra["x_peer"] == 75
    short = figure("dqn_updates", 25_000, 5_000, 400)
    judge(short, on_cuda)
    assert short.judged.startswith("NOT met: 5,000.0") and "x5.0 short" in short.judged
    e2e = figure("dqn_e2e", 20, 9_000, 500, greedy_return=480.0, wall_s=70.0)
    judge(e2e, on_cuda)
    assert e2e.judged.startswith("NOT met: 18.0 against 20") and "greedy return 480.0 in 70.0 s: NOT met" in e2e.judged
    cpu = figure("dqn_updates", 25_000, 30_000, 400)
    judge(cpu, on_cpu)
    assert cpu.judged.startswith("not judged") and cpu.rows[0].extra["x_peer"] == 75


def test_profile_counts_the_ops_of_a_launch_and_names_the_costliest():
    from rlbench_gpu.suite import Bench

    bench = Bench(torch.device("cpu"), 0.05, "graph", "cpu device", profiling=True)
    x, big = torch.ones(8), torch.ones(512, 512)

    def launch():  # 2 units per call: per unit one add, one mul and half a matmul
        for _ in range(2):
            torch.add(x, 1)
            torch.mul(x, 2)
        torch.mm(big, big)

    profile = bench.profile(launch, 2, "unit", calls=5)
    assert profile["unit"] == "unit" and profile["what"] == "host ops (outermost)"
    assert profile["per_unit"] == 2.5
    assert profile["top"][0]["name"] == "aten::mm" and profile["top"][0]["per_unit"] == 0.5
    assert {k["name"] for k in profile["top"]} == {"aten::mm", "aten::add", "aten::mul"}
    assert 0 < profile["busy_us_per_unit"] <= profile["wall_us_per_unit"] and 0 < profile["busy_share"] <= 1


def test_gpu_bench_profile_prints_where_each_captured_launch_spends_its_time():
    out = rlbench_command("gpu", "bench", "--device", "cpu", "--seconds", "0.05", "--dqn-capacity", "5000",
                          "--figure", "dqn_updates", "--profile")
    lines = [line for line in out.splitlines() if line.strip().startswith("profile per update:")]
    assert len(lines) == 1 and "host ops (outermost)" in lines[0] and "costliest: " in lines[0]
    assert "profile per" not in rlbench_command("gpu", "bench", "--device", "cpu", "--seconds", "0.05",
                                                "--dqn-capacity", "5000", "--figure", "dqn_updates")


def test_a_replay_cycle_counts_its_draw_once():
    """The replay figure's ops per cycle: a draw and a set_priorities, not a cycle plus another draw
    (118 where a cycle is 79 on CUDA)."""
    import numpy as np

    from rlbench.kit.bench import cartpole_batch
    from rlbench_gpu.replay import GpuPrioritizedReplay
    from rlbench_gpu.suite import ops_per_unit, replay_cycle, replay_cycle_ops

    rng = np.random.default_rng(0)
    replay = GpuPrioritizedReplay(2000, seed=0, device="cpu")
    replay.add(cartpole_batch(rng, 2000), rng.exponential(1.0, 2000) + 1e-3)
    beta = torch.full((), 0.4, dtype=torch.float64)
    draw = ops_per_unit(lambda: replay.draw(256, beta), 1)
    sample = replay.draw(256, beta)
    set_priorities = ops_per_unit(lambda: replay.set_priorities(sample.indices, sample.weights + 0.01), 1)
    cycle = replay_cycle_ops(replay, beta)
    assert draw > 0 and set_priorities > 0
    assert cycle == draw + set_priorities
    assert cycle == ops_per_unit(lambda: [replay_cycle(replay, beta) for _ in range(4)], 4)


def _figure_of(key, rate):
    from rlbench_gpu.suite import TARGETS, Figure, Row

    return Figure(key, *TARGETS[key], rows=[Row(f"rlbench: {key}", "cpu", rate, "units/s"),
                                            Row(f"CPU peer: {key}", "host", rate / 2, "units/s")], peer="CPU peer")


def test_the_suite_hands_on_each_figure_as_it_completes_and_keeps_the_others_when_one_fails(monkeypatch):
    import rlbench_gpu.suite as suite

    handed_on = []

    def failing(bench, capacity):
        assert [f["key"] for f in handed_on] == ["dqn_updates"]  # the first figure is out before this one starts
        raise RuntimeError("the device fell over\nsecond line")

    monkeypatch.setattr(suite, "dqn_updates", lambda bench, capacity: _figure_of("dqn_updates", 100.0))
    monkeypatch.setattr(suite, "replay_cycles", failing)
    monkeypatch.setattr(suite, "env_steps", lambda bench, num_envs: _figure_of("env_steps", 300.0))
    report = suite.run_suite(torch.device("cpu"), seconds=0.05, capture="eager", label="cpu device", num_envs=8,
                             capacity=1000, dqn_capacity=1000, e2e_steps=10, e2e_num_envs=1, eval_episodes=0,
                             figures=("dqn_updates", "replay_cycles", "env_steps"), on_figure=handed_on.append)
    assert [f["key"] for f in handed_on] == [f["key"] for f in report["figures"]] == ["dqn_updates", "replay_cycles",
                                                                                    "env_steps"]
    assert report["failed"] == ["replay_cycles"]
    failed = report["figures"][1]
    assert failed["error"].startswith("RuntimeError: the device fell over (at test_bench.py:")
    assert len(failed["rows"]) == 1 and failed["rows"][0]["label"] == f"failed: {failed['error']}"
    assert [f["rows"][0]["extra"]["x_peer"] for f in (report["figures"][0], report["figures"][2])] == [2.0, 2.0]


def test_gpu_bench_prints_a_failed_figure_in_its_row_prints_the_rest_and_exits_1(monkeypatch):
    from click.testing import CliRunner

    import rlbench_gpu.bench as bench
    import rlbench_gpu.suite as suite

    # the cpu device without pinning this test process to one thread
    monkeypatch.setattr(bench, "_setup", lambda device: (torch.device("cpu"), {}, "cpu device: a test"))
    monkeypatch.setattr(suite, "dqn_updates", lambda bench, capacity: _figure_of("dqn_updates", 100.0))
    monkeypatch.setattr(suite, "replay_cycles", lambda bench, capacity: 1 / 0)
    monkeypatch.setattr(suite, "env_steps", lambda bench, num_envs: _figure_of("env_steps", 300.0))
    args = ["bench", "--figure", "replay_cycles", "--figure", "dqn_updates", "--figure", "env_steps"]
    done = CliRunner().invoke(bench.gpu, args)
    assert done.exit_code == 1, done.output
    lines = done.output.splitlines()
    failed_row = next(line for line in lines if "[failed: ZeroDivisionError: division by zero (at test_bench.py:" in line)
    assert lines.index(failed_row) < lines.index("  rlbench: dqn_updates") < lines.index("  rlbench: env_steps")
    assert "1 of 3 figures failed: replay_cycles (each says why in its row)" in done.output
    assert sum("x2.00 peer" in line for line in lines) == 2
    as_json = CliRunner().invoke(bench.gpu, [*args, "--json"])
    assert as_json.exit_code == 1
    report = json.loads(as_json.stdout)
    assert report["failed"] == ["replay_cycles"] and len(report["figures"]) == 3
