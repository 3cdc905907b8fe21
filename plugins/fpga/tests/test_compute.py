"""The fpga compute backend against the core's conformance checks, for real on the OpenCL device."""

import numpy as np
import pytest

from rlbench import plugins
from rlbench.config import RunConfig
from rlbench.errors import InvalidCombinationError
from rlbench.hookspecs import hookimpl
from rlbench.protocols import EnvironmentCapabilities
from rlbench.testing import check_compute_backend
from rlbench.validate import validate
from rlbench.testing.tabular import random_batch, reference_td_update
from rlbench_fpga.compute import FpgaCompute
from rlbench_fpga.mlp import kernel_source, plan_layers


@pytest.fixture(scope="module")
def backend():
    return FpgaCompute()


def test_conformance_kit(backend):
    report = check_compute_backend(backend)
    assert report.checked == ["fingerprint", "actor: inference engine", "learner: torch device", "tabular: engine"]


def test_capabilities_and_fingerprint_say_the_learner_is_torch_cpu(backend):
    assert "learner runs on torch CPU" in backend.capabilities.does_not
    fingerprint = backend.fingerprint()
    assert fingerprint["learner"] == "learner runs on torch CPU"
    assert {"platform", "device", "type", "emulation"} <= set(fingerprint)
    assert str(backend.torch_device()) == "cpu"


def test_layer_plan_pads_outputs_to_whole_vectors():
    plans, total = plan_layers((4, 64, 64, 2))
    assert [(p.width, p.blocks) for p in plans] == [(16, 4), (16, 4), (2, 1)]
    assert total == 4 * 64 + 64 + 64 * 64 + 64 + 64 * 2 + 2
    assert "vload16" in kernel_source((4, 64, 64, 2), "relu", "identity")


def test_offline_q_table_matches_float64_reference_and_policy(backend):
    rng = np.random.default_rng(5)
    dataset = random_batch(rng, 20_000, 500, 6)  # Taxi-sized table
    engine = backend.tabular(500, 6)
    measured = engine.fit_offline(dataset, rule="qlearning", alpha=0.1, gamma=0.99, epochs=2)
    expected = np.zeros((500, 6))
    reference_td_update(expected, dataset, rule="qlearning", alpha=0.1, gamma=0.99, epochs=2)
    assert np.max(np.abs(engine.q - expected)) < 1e-12
    assert np.mean(np.argmax(engine.q, axis=1) == np.argmax(expected, axis=1)) == 1.0
    assert measured["timing"] == "measured" and measured["modelled"]["timing"] == "modelled"


class ImageEnvironment:
    """A plugin registering an environment of uint8 frames (never built: validation refuses first)."""

    @hookimpl
    def rlbench_register_environments(self, register):
        register("frames/Frames-v0", "rlbench_test_frames:make", capabilities=EnvironmentCapabilities(
            action_space="discrete", observation_space="image", family="atari"))


@pytest.mark.parametrize("env", ["frames/Frames-v0", "ALE/Breakout-v5"])
def test_an_image_run_is_refused_before_it_starts_with_the_reason(env):
    registry, _ = plugins.build([("frames", ImageEnvironment())])
    if env not in registry.names("environment"):
        pytest.skip(f"{env} is not registered here (ale-py's environments are the core's)")
    with pytest.raises(InvalidCombinationError) as refused:
        validate(RunConfig(algo="dqn", env=env, compute="fpga"), registry)
    message = str(refused.value)
    assert f"{env} has image observations" in message and "compute backend fpga runs mlp only" in message
    assert "no convolution" in message and "compute backends that run a CNN: cpu" in message
    validate(RunConfig(algo="dqn", env=env, compute="cpu"), registry)  # the suggestion works
