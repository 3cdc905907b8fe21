"""The benchmark commands, run as users run them: on the CPU device they label their figures so and
print their peers; `gpu dqn` runs the registered components through rlbench.run, so CUDA only."""

import os
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
