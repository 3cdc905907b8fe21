"""The benchmark commands run on the CPU device, label their figures so, and print their peers."""

from click.testing import CliRunner

from rlbench.cli import cli


def invoke(*args):
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_bench_env_prints_gpu_envs_beside_gymnasium_and_the_core():
    out = invoke("bench", "env", "--device", "cpu", "--num-envs", "32", "--seconds", "0.05")
    assert "NOT a GPU figure" in out
    for row in ("gpu/CartPole-v1   float64 eager", "gpu/Pendulum-v1   float32 eager", "CartPoleVectorEnv",
                "core GymnasiumEnv (reference)"):
        assert row in out


def test_gpu_replay_benchmark_compares_with_the_core_memory():
    out = invoke("gpu", "replay", "--device", "cpu", "--capacity", "2000", "--batch-size", "32", "--seconds", "0.05")
    assert "NOT a GPU figure" in out and "prioritized (core, host)" in out and "gpu / prioritized: x" in out


def test_gpu_dqn_benchmark_runs_both_sides():
    out = invoke("gpu", "dqn", "--device", "cpu", "--num-envs", "16", "--steps", "640", "--hp", "learning_starts=128",
                 "--hp", "batch_size=32", "--hp", "buffer_size=1000")
    assert "gpu env + gpu replay + gpu compute" in out and "gpu / cpu env steps/s: x" in out
