"""The CPU compute backend, and check_compute_backend catching real defects in broken backends."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from rlbench.builtin.compute_cpu import CpuCompute, NumpyMLP
from rlbench.errors import RlbenchError
from rlbench.protocols import ComputeCapabilities
from rlbench.testing.compute import check_compute_backend, random_weights, reference_mlp

ACTOR_AND_LEARNER = ComputeCapabilities(roles=frozenset({"dqn:actor", "dqn:learner"}))


def test_cpu_backend_passes_its_conformance_check():
    report = check_compute_backend(CpuCompute)
    assert "actor: inference engine" in report.checked
    assert "learner: torch device" in report.checked
    # The registration claims tabular roles: they are checked, or the report says why not.
    assert "tabular: engine" in report.checked or any(s.startswith("tabular") for s in report.skipped)


def test_check_holds_the_backend_only_to_the_roles_given():
    report = check_compute_backend(CpuCompute(), capabilities=ComputeCapabilities(roles=frozenset({"dqn:actor"})))
    assert report.checked == ["fingerprint", "actor: inference engine"]


def test_numpy_engine_matches_float64_reference_and_keeps_version():
    rng = np.random.default_rng(3)
    sizes = (5, 40, 30, 4)
    engine = CpuCompute().mlp_inference(sizes, hidden_activation="tanh", output_activation="tanh")
    assert engine.version == -1
    weights = random_weights(sizes, rng)
    engine.load(weights, 12)
    x = rng.standard_normal((9, 5)).astype(np.float32)
    out = engine(x)
    assert out.dtype == np.float32 and engine.version == 12
    np.testing.assert_allclose(out, reference_mlp(weights, x, "tanh", "tanh"), rtol=1e-5, atol=1e-5)


def test_engine_refuses_bad_input_with_one_clear_line():
    engine = CpuCompute().mlp_inference([4, 8, 2])
    with pytest.raises(RlbenchError, match="call load"):
        engine(np.zeros((1, 4), np.float32))
    engine.load(random_weights((4, 8, 2), np.random.default_rng(0)), 0)
    with pytest.raises(RlbenchError, match=r"shape \(batch, 4\)"):
        engine(np.zeros((1, 5), np.float32))
    with pytest.raises(RlbenchError, match="did you mean 'tanh'"):
        CpuCompute().mlp_inference([4, 2], output_activation="tahn")
    with pytest.raises(RlbenchError, match="threads"):
        CpuCompute(threads=0)


def test_fingerprint_names_torch_and_threads():
    import torch

    fingerprint = CpuCompute(threads=1).fingerprint()
    assert fingerprint["torch"] == torch.__version__
    assert fingerprint["threads"] == 1
    json.dumps(fingerprint)


# ---------------------------------------------------------------------------- broken backends
class WrongActivationMLP(NumpyMLP):
    """Applies tanh where relu was asked for."""

    def __init__(self, sizes, *, hidden_activation="relu", output_activation="identity"):
        super().__init__(sizes, hidden_activation="tanh" if hidden_activation == "relu" else hidden_activation,
                         output_activation=output_activation)


class TransposedWeightsMLP(NumpyMLP):
    """Reads square weight matrices in the wrong layout (shape checks cannot see it)."""

    def load(self, weights, version):
        super().load(weights, version)
        self._layers = [(w.T.copy() if w.shape[0] == w.shape[1] else w, b) for w, b in self._layers]


class StaleWeightsMLP(NumpyMLP):
    """Bumps the version but keeps the weights it loaded first."""

    def load(self, weights, version):
        if self._layers:
            self._version = int(version)
            return
        super().load(weights, version)


class AliasingMLP(NumpyMLP):
    """Keeps the caller's arrays instead of copying them."""

    def load(self, weights, version):
        super().load(weights, version)
        self._layers = [(weights[i], weights[i + 1]) for i in range(0, len(weights), 2)]


class UncheckedShapesMLP(NumpyMLP):
    """Loads whatever it is given."""

    def load(self, weights, version):
        self._layers = [(np.array(w, np.float32), np.array(b, np.float32)) for w, b in zip(weights[0::2], weights[1::2])]
        self._version = int(version)


class HalfPrecisionMLP(NumpyMLP):
    def __call__(self, observations):
        x = np.asarray(observations, np.float16)
        for i, (w, b) in enumerate(self._layers):
            x = x @ w.astype(np.float16) + b.astype(np.float16)
            if i < len(self._layers) - 1:
                x = np.maximum(x, 0) if self.hidden_activation == "relu" else np.tanh(x)
            elif self.output_activation == "tanh":
                x = np.tanh(x)
        return x.astype(np.float32)


def backend_with(engine_cls):
    class BrokenCompute(CpuCompute):
        capabilities = ACTOR_AND_LEARNER

        def mlp_inference(self, layer_sizes, *, hidden_activation="relu", output_activation="identity"):
            return engine_cls(layer_sizes, hidden_activation=hidden_activation, output_activation=output_activation)

    return BrokenCompute()


@pytest.mark.parametrize("engine_cls, complaint", [
    (WrongActivationMLP, "differs from the float64 reference"),
    (TransposedWeightsMLP, "differs from the float64 reference"),
    (StaleWeightsMLP, "stale weights"),
    (AliasingMLP, "load must copy"),
    (UncheckedShapesMLP, "accepted it"),
    (HalfPrecisionMLP, "differs from the float64 reference"),
])
def test_check_catches_broken_inference_engines(engine_cls, complaint):
    with pytest.raises(AssertionError, match=complaint):
        check_compute_backend(backend_with(engine_cls))


def test_check_catches_a_learner_device_that_is_not_a_torch_device():
    class StringDevice(CpuCompute):
        capabilities = ACTOR_AND_LEARNER

        def torch_device(self):
            return "cpu"

    with pytest.raises(AssertionError, match="torch.device"):
        check_compute_backend(StringDevice())


def test_check_catches_an_unserialisable_fingerprint():
    class OpaqueFingerprint(CpuCompute):
        capabilities = ACTOR_AND_LEARNER

        def fingerprint(self):
            return {"device": object()}

    with pytest.raises(AssertionError, match="JSON-serialisable"):
        check_compute_backend(OpaqueFingerprint())


def test_bench_compute_prints_engine_beside_torch_json():
    from rlbench.bench.compute import command

    result = CliRunner().invoke(command, ["--iterations", "100", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output[result.output.index("{"):])
    assert data["threads"]["torch_threads"] == 1
    cpu_rows = [row for row in data["inference"] if row["backend"] == "cpu"]
    assert {row["batch"] for row in cpu_rows if "cnn" not in row["network"]} == {1, 256}
    assert {row["batch"] for row in cpu_rows if row["network"] == "nature-cnn 4x84x84"} == {1, 32}
    assert all(row["engine"]["p50_us"] > 0 and row["torch_cpu"]["p50_us"] > 0 for row in cpu_rows)
    learners = [row for row in data["learner"] if row["backend"] == "cpu"]
    assert {row["algorithm"] for row in learners} == {"dqn", "ddpg"}
    assert [row["batch"] for row in learners if row.get("network") == "nature-cnn 4x84x84"] == [32]
