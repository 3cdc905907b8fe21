"""Compute gpu on the CPU device: the conformance kit (MLP and CNN), tensor pass-through, DQN on uint8
frames through the one-device loop's captured calls, and DQN/DDPG end to end through the core's replay
loop with every gpu component."""

import numpy as np
import pytest
import torch

import rlbench
from rlbench.errors import RlbenchError
from rlbench.kit.networks import minatar_cnn, nature_cnn
from rlbench.protocols import EnvSpec
from rlbench.testing import check_compute_backend
from rlbench.testing.compute import random_cnn_weights, reference_cnn
from rlbench_gpu.audit import HostRoundTripAudit
from rlbench_gpu.compute import GpuCompute
from rlbench_gpu.envs import BatchedCartPole, BatchedPendulum
from rlbench_gpu.replay import GpuPrioritizedReplay


def test_conformance_kit_on_the_cpu_device():
    report = check_compute_backend(GpuCompute("cpu"))
    assert report.checked == ["fingerprint", "actor: inference engine", "learner: torch device",
                              "cnn: inference engine", "cnn: learner's network on the torch device"]


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


def test_cnn_engine_takes_uint8_frames_as_numpy_or_tensors():
    network = nature_cnn((4, 44, 44), 6)
    rng = np.random.default_rng(0)
    weights = random_cnn_weights(network, rng)
    engine = GpuCompute("cpu").cnn_inference(network)
    engine.load(weights, 1)
    frames = rng.integers(0, 256, (3, 4, 44, 44), dtype=np.uint8)
    from_numpy, from_tensor = engine(frames), engine(torch.from_numpy(frames))
    assert isinstance(from_numpy, np.ndarray) and from_numpy.dtype == np.float32
    assert isinstance(from_tensor, torch.Tensor) and from_tensor.dtype == torch.float32
    assert np.allclose(from_numpy, reference_cnn(network, weights, frames), rtol=1e-4, atol=1e-4)
    assert np.array_equal(from_numpy, from_tensor.numpy())
    with pytest.raises(RlbenchError, match=r"shape \(batch, 4, 44, 44\)"):
        engine(torch.zeros((3, 4, 40, 40), dtype=torch.uint8))


def test_dqn_on_frames_runs_the_one_device_loops_calls_without_a_host_round_trip():
    """The captured path (prepare_capture, explore, device_updates) with MinAtar's CNN: uint8 boards
    written to and drawn from the device memory, cast only inside the network."""
    spec = EnvSpec("frames", 16, (4, 10, 10), "uint8", "discrete", n_actions=3)
    algorithm = rlbench.get_registry().get("algorithm", "dqn").create()
    learner = algorithm.make_learner(spec, GpuCompute("cpu"), algorithm.Config(batch_size=32, target_update_every=2), 0)
    assert learner.q_network[0].scale == minatar_cnn((4, 10, 10), 3).scale
    learner.prepare_capture(0)
    replay = GpuPrioritizedReplay(256, seed=0, device="cpu")
    generator = torch.Generator().manual_seed(0)
    boards = torch.randint(0, 2, (17, 4, 10, 10), generator=generator, dtype=torch.uint8)
    env_step = torch.zeros((), dtype=torch.int64)
    for step in range(16):
        actions = learner.explore(boards[step:step + 1].expand(16, -1, -1, -1), env_step)
        replay.write({"obs": boards[step:step + 1].expand(16, -1, -1, -1).contiguous(), "action": actions,
                      "reward": torch.rand(16, generator=generator),
                      "next_obs": boards[step + 1:step + 2].expand(16, -1, -1, -1).contiguous(),
                      "done": torch.zeros(16)})
    replay.count_captured(added=256)
    beta = torch.full((), 0.4, dtype=torch.float64)
    before = [p.detach().clone() for p in learner.q_network.parameters()]
    learner.device_updates(replay, 2, beta)  # optimizer state exists, as after a capture's warm-up
    with HostRoundTripAudit() as audit:
        learner.device_updates(replay, 4, beta)
        learner.explore(boards[:16], env_step)
    assert audit.round_trips == []
    assert all(not torch.equal(b, p) for b, p in zip(before, learner.q_network.parameters()))
    assert replay.sample(32).transitions["obs"].dtype == np.uint8
    replay.check_flags()


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
