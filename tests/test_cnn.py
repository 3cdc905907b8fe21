"""Networks for image observations: the Nature and MinAtar CNNs built from their ConvNetSpec, published in
its weight_shapes() order to the CPU backend's numpy engine, DQN on uint8 frames (learner, actor,
checkpoints, the wire's shapes), and the hyperparameter presets per environment family. Small frames,
except where the Nature network's own 84x84 is the point; each test takes seconds."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from rlbench import plugins
from rlbench.algorithms.ddpg import DDPG, MUJOCO
from rlbench.algorithms.dqn import ATARI, DQN, MINATAR, q_network
from rlbench.algorithms.networks import conv_net, export_weights
from rlbench.builtin.compute_cpu import CpuCompute
from rlbench.config import RunConfig, run_hyperparameters
from rlbench.errors import RlbenchError
from rlbench.hookspecs import hookimpl
from rlbench.kit.networks import image_network, minatar_cnn, nature_cnn
from rlbench.protocols import EnvironmentCapabilities, EnvSpec, Sample
from rlbench.runtime import checkpoint

ATARI_SPEC = EnvSpec("ALE/Breakout-v5", 1, (4, 84, 84), "uint8", "discrete", n_actions=4, frame_stack=4)
SMALL_ATARI = EnvSpec("small-frames", 1, (4, 44, 44), "uint8", "discrete", n_actions=6, frame_stack=4)  # Nature's net
BOARDS = EnvSpec("MinAtar/Breakout-v0", 1, (4, 10, 10), "uint8", "discrete", n_actions=3)  # MinAtar's net


@pytest.fixture(scope="module")
def compute():
    return CpuCompute(threads=1)


def frames_batch(spec: EnvSpec, size: int, seed: int = 0) -> Sample:
    rng = np.random.default_rng(seed)
    high = 2 if spec is BOARDS else 256

    def frames():
        return rng.integers(0, high, (size, *spec.observation_shape), dtype=np.uint8)

    return Sample(np.arange(size), {"obs": frames(), "action": rng.integers(spec.n_actions, size=size),
                                    "reward": rng.standard_normal(size).astype(np.float32), "next_obs": frames(),
                                    "done": (rng.random(size) < 0.1).astype(np.float32)}, np.ones(size, np.float32))


# ------------------------------------------------------------------------------ the networks
def test_the_spec_picks_the_network_and_its_weights_come_out_in_weight_shapes_order():
    assert q_network(ATARI_SPEC, DQN.Config()) == nature_cnn((4, 84, 84), 4)
    assert q_network(BOARDS, DQN.Config()) == minatar_cnn((4, 10, 10), 3)
    cartpole = EnvSpec("CartPole-v1", 1, (4,), "float32", "discrete", n_actions=2)
    assert q_network(cartpole, DQN.Config(hidden_sizes=(8,))) == [4, 8, 2]
    for network in (nature_cnn((4, 84, 84), 4), minatar_cnn((4, 10, 10), 3)):
        module = conv_net(network)
        weights = export_weights(module)
        assert [w.shape for w in weights] == network.weight_shapes()
        parameters = [p.detach().numpy() for p in module.parameters()]
        for w, p in zip(weights, parameters):  # copies (the learner trains its own in place), dense W as (in, out)
            assert w.dtype == np.float32 and not np.shares_memory(w, p)
            assert np.array_equal(w, p.T if w.ndim == 2 else p)
        assert sum(w.size for w in weights) == network.parameters()
    nature = nature_cnn((4, 84, 84), 4)
    assert nature.flat_features == 3136 and nature.parameters() == 1_686_180  # CleanRL's QNetwork, Breakout's 4 actions


@pytest.mark.parametrize("network", [nature_cnn((4, 44, 44), 6), minatar_cnn((4, 10, 10), 3),
                                     image_network((12, 12), "uint8", 2)], ids=lambda n: f"{n.name}{n.input_shape}")
def test_exported_weights_in_the_cpu_engine_give_the_learners_outputs(network, compute):
    torch.manual_seed(0)
    learner_network = conv_net(network)
    engine = compute.cnn_inference(network)
    engine.load(export_weights(learner_network), 3)
    rng = np.random.default_rng(1)
    shape = network.input_shape if network.input_shape[0] > 1 else network.input_shape[1:]  # (H, W) boards too
    for batch in (1, 5):
        frames = rng.integers(0, 256, (batch, *shape), dtype=np.uint8)
        with torch.no_grad():
            expected = learner_network(torch.from_numpy(frames)).numpy()
        got = engine(frames)
        assert got.dtype == np.float32 and got.shape == (batch, network.n_outputs)
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_the_engine_refuses_what_does_not_fit(compute):
    network = nature_cnn((4, 44, 44), 6)
    engine = compute.cnn_inference(network)
    with pytest.raises(RlbenchError, match="no weights yet"):
        engine(np.zeros((1, 4, 44, 44), np.uint8))
    weights = export_weights(conv_net(network))
    with pytest.raises(RlbenchError, match=r"weight 0 should have shape \(32, 4, 8, 8\)"):
        engine.load([weights[0].transpose(1, 0, 2, 3), *weights[1:]], 1)
    engine.load(weights, 1)
    with pytest.raises(RlbenchError, match=r"shape \(batch, 4, 44, 44\), got \(2, 44, 44, 4\)"):
        engine(np.zeros((2, 44, 44, 4), np.uint8))  # channels last
    with pytest.raises(RlbenchError, match="ConvNetSpec"):
        compute.cnn_inference([4, 8, 2])


def test_float_observations_of_several_dimensions_are_refused_with_what_dqn_takes():
    spec = EnvSpec("float-frames", 1, (4, 10, 10), "float32", "discrete", n_actions=3)
    with pytest.raises(RlbenchError, match="dqn needs flat observations or uint8 images; float-frames has float32"):
        DQN().policy_shapes(spec, DQN.Config())


# ------------------------------------------------------------------------------ DQN on frames
def test_the_learner_keeps_frames_uint8_to_the_network_and_its_loss_falls(compute):
    config = DQN.Config(**{**ATARI, "learning_rate": 1e-4, "target_update_every": 10**9})
    learner = DQN().make_learner(ATARI_SPEC, compute, config, seed=0)
    inputs = []
    learner.q_network.register_forward_pre_hook(lambda _, args: inputs.append(args[0].dtype))
    sample = frames_batch(ATARI_SPEC, 32)
    losses = [float(learner.update(sample)[1]["loss"]) for _ in range(50)]
    assert set(inputs) == {torch.uint8}  # cast inside the network, on its device, never before
    assert learner.updates == 50 and losses[-1] < 0.3 * losses[0], losses[::10]


def test_the_actor_acts_on_uint8_frames_greedily_with_the_learners_q_values(compute):
    config = DQN.Config(epsilon_end=0.0, exploration_steps=10)
    learner = DQN().make_learner(SMALL_ATARI, compute, config, seed=0)
    actor = DQN().make_actor(SMALL_ATARI, compute, config, seed=0)
    actor.load_weights(learner.weights(), 1)
    frames = frames_batch(SMALL_ATARI, 16).transitions["obs"]
    with torch.no_grad():
        greedy = learner.q_network(torch.from_numpy(frames)).argmax(dim=1).numpy()
    np.testing.assert_array_equal(actor.act(frames, step=10), greedy)
    exploring = actor.act(frames, step=0)
    assert exploring.shape == (16,) and 0 <= exploring.min() and exploring.max() < SMALL_ATARI.n_actions


def test_actor_initial_priorities_are_its_abs_td_error_on_frames(compute):
    config = DQN.Config(per_eps=0.01, gamma=0.9)
    learner = DQN().make_learner(BOARDS, compute, config, seed=0)
    actor = DQN().make_actor(BOARDS, compute, config, seed=0)
    actor.load_weights(learner.weights(), 1)
    t = frames_batch(BOARDS, 20).transitions
    with torch.no_grad():
        q = learner.q_network(torch.from_numpy(t["obs"])).numpy()[np.arange(20), t["action"]]
        next_q = learner.q_network(torch.from_numpy(t["next_obs"])).numpy().max(axis=1)
    expected = np.abs(t["reward"] + 0.9 * (1 - t["done"]) * next_q - q) + 0.01
    np.testing.assert_allclose(actor.initial_priorities(t), expected, rtol=1e-4, atol=1e-5)


def test_an_image_actor_on_the_cpu_backend_never_imports_torch():
    script = """
import sys
import numpy as np
from rlbench.algorithms.dqn import DQN
from rlbench.builtin.compute_cpu import CpuCompute
from rlbench.protocols import EnvSpec
spec = EnvSpec("MinAtar/Breakout-v0", 2, (4, 10, 10), "uint8", "discrete", n_actions=3)
actor = DQN().make_actor(spec, CpuCompute(), DQN.Config(epsilon_end=0.0, exploration_steps=1), seed=0)
shapes = DQN().policy_shapes(spec, DQN.Config())
actor.load_weights([np.full(shape, 0.01, np.float32) for shape in shapes], 1)
assert actor.act(np.ones((2, 4, 10, 10), np.uint8), 10).shape == (2,)
assert "torch" not in sys.modules, "the actor imported torch"
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_policy_shapes_are_the_published_weights_and_say_their_size(compute):
    for spec in (ATARI_SPEC, BOARDS):
        weights = DQN().make_learner(spec, compute, DQN.Config(), seed=0).weights()
        assert DQN().policy_shapes(spec, DQN.Config()) == [w.shape for w in weights]
    nature_bytes = sum(4 * int(np.prod(shape)) for shape in DQN().policy_shapes(ATARI_SPEC, DQN.Config()))
    assert 6.7e6 < nature_bytes < 6.8e6  # what a PARAMS message carries in an Atari run


def test_a_restored_image_learner_makes_the_same_next_updates(compute, tmp_path):
    config = DQN.Config(batch_size=16, target_update_every=3)
    first = DQN().make_learner(BOARDS, compute, config, seed=1)
    for seed in range(4):
        first.update(frames_batch(BOARDS, 16, seed))
    checkpoint.save_learner(tmp_path, 1, first)
    second = DQN().make_learner(BOARDS, compute, config, seed=2)  # other initial weights: all come from the file
    checkpoint.load_learner(checkpoint.folder(tmp_path, 1), second)
    assert second.updates == first.updates == 4
    for seed in range(10, 14):  # Adam's moments, the target network and the update count all matter here
        sample = frames_batch(BOARDS, 16, seed)
        np.testing.assert_array_equal(np.asarray(first.update(sample)[0]), np.asarray(second.update(sample)[0]))
    for w1, w2 in zip(first.weights(), second.weights()):
        np.testing.assert_array_equal(w1, w2)


# ------------------------------------------------------------------------------ presets
class Families:
    """A plugin registering one environment per family (never built: only their capabilities are read)."""

    @hookimpl
    def rlbench_register_environments(self, register):
        for family, space, actions in (("atari", "image", "discrete"), ("minatar", "image", "discrete"),
                                       ("mujoco", "continuous", "continuous")):
            register(f"families/{family}", "families:make", capabilities=EnvironmentCapabilities(
                action_space=actions, observation_space=space, family=family))


@pytest.fixture(scope="module")
def registry():
    registry, _ = plugins.build([("families", Families())], load_entry_points=False)
    assert not registry.broken, registry.broken
    return registry


def test_presets_apply_by_family_under_the_runs_overrides(registry):
    dqn = registry.get("algorithm", "dqn").create()
    atari = run_hyperparameters(dqn, RunConfig(algo="dqn", env="families/atari"), registry)
    assert {key: getattr(atari, key) for key in ATARI} == ATARI
    # CleanRL's target_network_frequency (1000 env steps) over train_frequency 4, and 10 % of 10M steps
    assert (atari.target_update_every, atari.train_every, atari.exploration_steps) == (250, 4, 1_000_000)
    assert (atari.loss, atari.double_dqn, atari.max_grad_norm) == ("mse", False, 0.0)
    overridden = RunConfig(algo="dqn", env="families/minatar", hyperparameters={"batch_size": 64})
    minatar = run_hyperparameters(dqn, overridden, registry)
    assert minatar.batch_size == 64 and minatar.buffer_size == MINATAR["buffer_size"] == 100_000
    cartpole = run_hyperparameters(dqn, RunConfig(algo="dqn", env="CartPole-v1"), registry)
    assert cartpole == DQN.Config()  # no family preset: the defaults
    mujoco = run_hyperparameters(DDPG(), RunConfig(algo="ddpg", env="families/mujoco"), registry)
    assert {key: getattr(mujoco, key) for key in MUJOCO} == MUJOCO
    assert (mujoco.batch_size, mujoco.learning_starts, mujoco.hidden_sizes) == (256, 25_000, (256, 256))


def test_every_preset_names_config_fields_and_passes_validation():
    from rlbench.config import apply_overrides
    from rlbench.validate import validate_hyperparameters

    for algorithm in (DQN(), DDPG()):
        for family, preset in algorithm.presets.items():
            validate_hyperparameters(apply_overrides(algorithm.Config, preset))  # unknown keys raise too
