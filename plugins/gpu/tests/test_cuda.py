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
    check_replay_memory(lambda capacity: GpuPrioritizedReplay(capacity, alpha=0.6, seed=0, device="cuda"))


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
    finals = []
    for device, graph in (("cpu", False), ("cuda", False), ("cuda", True)):
        env = BatchedCartPole(512, seed=0, device=device, graph=graph)
        env.reset()
        env.set_state(states)
        finals.append(np.stack([env.step(a).final_observations for a in actions]))
    assert np.allclose(finals[0], finals[1], atol=1e-5)
    assert np.array_equal(finals[1], finals[2])


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
