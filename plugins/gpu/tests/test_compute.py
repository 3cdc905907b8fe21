"""Compute gpu on the CPU device: the conformance kit, tensor pass-through, and DQN/DDPG end to end
through the core's replay loop with every gpu component."""

import numpy as np
import pytest
import torch

import rlbench
from rlbench.errors import RlbenchError
from rlbench.testing import check_compute_backend
from rlbench_gpu.compute import GpuCompute
from rlbench_gpu.envs import BatchedCartPole, BatchedPendulum
from rlbench_gpu.replay import GpuPrioritizedReplay


def test_conformance_kit_on_the_cpu_device():
    report = check_compute_backend(GpuCompute("cpu"))
    assert report.checked == ["fingerprint", "actor: inference engine", "learner: torch device"]


def test_fingerprint_names_device_and_versions():
    fingerprint = GpuCompute("cpu").fingerprint()
    assert fingerprint["device"] == "cpu" and fingerprint["torch"] == torch.__version__
    assert "cuda_build" in fingerprint


def test_tensors_stay_tensors_and_numpy_stays_numpy():
    engine = GpuCompute("cpu").mlp_inference([3, 8, 2], output_activation="tanh")
    rng = np.random.default_rng(0)
    engine.load([rng.standard_normal((3, 8)).astype(np.float32), np.zeros(8, np.float32),
                 rng.standard_normal((8, 2)).astype(np.float32), np.zeros(2, np.float32)], 1)
    x = rng.standard_normal((5, 3)).astype(np.float32)
    from_numpy, from_tensor = engine(x), engine(torch.from_numpy(x))
    assert isinstance(from_numpy, np.ndarray) and isinstance(from_tensor, torch.Tensor)
    assert np.allclose(from_numpy, from_tensor.numpy())
    with pytest.raises(RlbenchError, match=r"shape \(batch, 3\)"):
        engine(torch.zeros(5, 4))


def test_tabular_is_refused_with_the_reason():
    with pytest.raises(RlbenchError, match="no tabular engine"):
        GpuCompute("cpu").tabular(16, 4)


@pytest.mark.parametrize("algorithm_name, env_class", [("dqn", BatchedCartPole), ("ddpg", BatchedPendulum)])
def test_the_core_replay_loop_runs_on_gpu_components_end_to_end(algorithm_name, env_class, core_replay_loop):
    algorithm = rlbench.get_registry().get("algorithm", algorithm_name).create()
    hp = algorithm.Config(learning_starts=256, batch_size=64, train_every=16, buffer_size=4096)
    env = env_class(64, seed=0, device="cpu")
    replay = GpuPrioritizedReplay(hp.buffer_size, alpha=hp.per_alpha, seed=0, device="cpu")
    ctx, stats = core_replay_loop(algorithm, hp, env, replay, GpuCompute("cpu"), 3200)
    assert stats.env_steps == 3200 and stats.updates == (3200 - 256) // 16 + 1
    assert len(replay) == 3200 and replay.stats()["updated_items"] == stats.updates * 64
    assert ctx.accounting.to_dict()["balanced"]
    if env_class is BatchedPendulum:  # every 200 steps all 64 episodes end at once
        assert len(ctx.curve.points) == 64 * (3200 // 64 // 200)
