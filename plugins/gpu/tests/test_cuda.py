"""The same checks on a CUDA device; skipped with the reason where there is none."""

import numpy as np
import pytest
import torch

from rlbench.testing import check_compute_backend, check_replay_memory
from rlbench_gpu.compute import GpuCompute
from rlbench_gpu.energy import NvmlMeter
from rlbench_gpu.envs import BatchedCartPole
from rlbench_gpu.replay import GpuPrioritizedReplay

# Defined here, not imported from conftest: the plugin's tests run beside the core's in one session.
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason=f"no CUDA device: torch.cuda.is_available() "
                                                                      f"is False (torch {torch.__version__})")

pytestmark = needs_cuda


def test_replay_conformance_on_cuda():
    report = check_replay_memory(lambda capacity, **options: GpuPrioritizedReplay(capacity, alpha=0.6, seed=0,
                                                                                  device="cuda", **options))
    assert set(report["frames"]) == {"frames=4", "frames=1"}


def test_replay_frames_live_on_the_device_as_uint8():
    memory = GpuPrioritizedReplay(100, seed=0, device="cuda", frames=4)
    frames = torch.randint(0, 256, (41, 84, 84), dtype=torch.uint8, device="cuda")
    stacks = frames.unfold(0, 4, 1).permute(0, 3, 1, 2)  # (38, 4, 84, 84): step t's stack is frames t..t+3
    memory.add({"obs": stacks[:-1].contiguous(), "action": torch.arange(37, device="cuda"),
                "next_obs": stacks[1:].contiguous()})
    assert memory._device_frames.is_cuda and memory._device_frames.dtype == torch.uint8
    assert memory.stats()["frames"]["frames_held"] == 41  # the first stack's 4, then one per step: not 8 per step
    sample = memory.sample(32)
    assert sample.transitions["obs"].is_cuda and sample.transitions["obs"].dtype == torch.uint8
    assert torch.equal(sample.transitions["obs"], stacks[sample.indices])
    assert torch.equal(sample.transitions["next_obs"], stacks[sample.indices + 1])


def test_replay_samples_stay_on_the_device():
    memory = GpuPrioritizedReplay(1000, seed=0, device="cuda")
    memory.add({"obs": torch.zeros((100, 4), device="cuda")}, torch.rand(100, device="cuda"))
    sample = memory.sample(32)
    assert sample.indices.is_cuda and sample.transitions["obs"].is_cuda and sample.weights.is_cuda
    memory.update_priorities(sample.indices, torch.rand(32, device="cuda"))


def test_compute_conformance_on_cuda():
    # TF32 is off by default, so the default tolerance holds.
    check_compute_backend(GpuCompute(0))


def test_cuda_env_matches_the_cpu_env_and_the_graph_matches_eager():
    states = np.random.default_rng(0).uniform(-0.05, 0.05, (512, 4))
    actions = np.random.default_rng(1).integers(0, 2, (60, 512))
    finals, ends = [], []
    for device, graph in (("cpu", False), ("cuda", False), ("cuda", True)):
        env = BatchedCartPole(512, seed=0, device=device, graph=graph)
        env.reset()
        env.set_state(states)
        steps = [env.step(a) for a in actions]
        finals.append(np.stack([step.final_observations for step in steps]))
        ends.append(np.stack([np.logical_or(step.terminated, step.truncated) for step in steps]))
    # An ended env restarts from the generator's draw, and the CPU generator, the CUDA one and the
    # CUDA one inside a graph (its offsets advance per replay) draw different streams (seen on an
    # H100): the runs are compared over each env's steps up to its first end.
    first_episode = np.cumsum(ends[0], axis=0) - ends[0] == 0
    assert ends[0][first_episode].sum() > 400 and first_episode.sum() > 512 * 10  # most envs ended once, ~20 steps in
    for other in ends[1:]:
        assert np.array_equal(ends[0][first_episode], other[first_episode])
    assert np.allclose(finals[0][first_episode], finals[1][first_episode], atol=1e-5)
    assert np.array_equal(finals[1][first_episode], finals[2][first_episode])  # the graph replays eager's kernels


def test_nvml_measures_energy_on_this_gpu():
    meter = NvmlMeter(0)
    if not meter.available:
        pytest.skip(meter.reason)
    meter.start()
    x = torch.randn(4096, 4096, device="cuda")
    for _ in range(50):
        x = x @ x.T / 4096
    torch.cuda.synchronize()
    energy = meter.stop()
    meter.close()
    assert energy["kind"] == "measured" and energy["joules"] > 0


# -- captured launches (issue #22): these are the only tests that run the CUDA-graph code paths ------
def _dqn_on_cuda(seed=0):
    from rlbench import get_registry

    dqn = get_registry().get("algorithm", "dqn").create()
    config = dqn.Config(batch_size=128, target_update_every=3)
    env = BatchedCartPole(256, seed=seed, device="cuda", output="torch")
    replay = GpuPrioritizedReplay(8192, seed=seed, device="cuda")
    compute = GpuCompute(0, capture="graph")
    learner = dqn.make_learner(env.spec, compute, config, seed)
    learner.prepare_capture(seed)
    env.reset(seed=seed)
    env_step = torch.zeros((), dtype=torch.int64, device="cuda")

    def record(obs, actions, rewards, final_obs, terminated, truncated):
        replay.write({"obs": obs, "action": actions, "reward": rewards, "next_obs": final_obs,
                      "done": terminated.to(torch.float32)})
        env_step.add_(256)

    def chunk():
        env.rollout(4, lambda obs: learner.explore(obs, env_step), record)

    return learner, replay, env, compute, chunk


def test_a_captured_learner_launch_replays_what_eager_launches_do():
    beta = torch.full((), 0.4, dtype=torch.float64, device="cuda")
    runs = []
    for capture in ("graph", "eager"):
        learner, replay, _, compute, chunk = _dqn_on_cuda()
        compute.capture_mode = capture
        chunk()
        replay.count_captured(added=4 * 256)
        launch = compute.capture(lambda: learner.device_updates(replay, 8, beta), [replay.generator, learner.generator])
        for _ in range(5):  # 2 eager warm-ups, the capture (and its replay), 2 replays
            launch()
        replay.check_flags()
        torch.cuda.synchronize()
        assert (launch.graph is not None) == (capture == "graph")
        runs.append({k: v.detach().cpu() for k, v in learner.q_network.state_dict().items()})
        runs[-1]["priorities"] = torch.from_numpy(replay.priorities(np.arange(1024)))
    for key in runs[0]:
        torch.testing.assert_close(runs[0][key], runs[1][key], rtol=1e-4, atol=1e-5, msg=key)


def test_a_captured_env_chunk_replays_what_eager_chunks_do():
    transitions = []
    for capture in ("graph", "eager"):
        learner, replay, env, compute, chunk = _dqn_on_cuda(seed=1)
        compute.capture_mode = capture
        launch = compute.capture(chunk, [env.generator, replay.generator, learner.generator])
        for _ in range(4):
            launch()
        torch.cuda.synchronize()
        transitions.append((env.state.cpu(), replay.stats()["total_priority"]))
    assert torch.allclose(transitions[0][0], transitions[1][0]) and transitions[0][1] == transitions[1][1]


def test_rlbench_run_takes_the_one_device_loop_on_cuda():
    import rlbench

    result = rlbench.run(rlbench.RunConfig(env="gpu/CartPole-v1", replay="gpu", compute="gpu", num_envs=64, steps=4096,
                                           eval_episodes=2, hyperparameters={"learning_starts": 512, "batch_size": 64,
                                                                             "train_every": 8}))
    assert result["loop"]["name"] == "device" and "CUDA graph" in result["loop"]["capture"]
    assert result["accounting"]["balanced"] and result["throughput"]["updates"] == (4096 - 512) // 8 + 1


def test_gpu_bench_judges_the_targets_on_cuda():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "rlbench", "gpu", "bench", "--seconds", "0.2", "--e2e-steps", "2000"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "NOT a GPU figure" not in done.stdout and done.stdout.count("not judged") == 0
    assert done.stdout.count("per CUDA graph") == 3 and "[not run" not in done.stdout
