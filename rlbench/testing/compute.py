"""check_compute_backend: does a compute backend really do what its capabilities claim?

For each role the capabilities name it checks the real operation, not its signature:
- actor roles: the inference engine against a float64 numpy reference MLP (several layer shapes and
  activations, batch sizes 1..512), version bookkeeping, new weights replacing old ones, load copying
  its input, refusal of weights of the wrong shape (leaving the loaded ones in place);
- learner roles: a torch MLP on `torch_device()` takes an optimiser step that lowers its loss, and
  its exported weights run in the backend's own inference engine give the torch outputs;
- backends whose capabilities list "cnn" in `networks`: `cnn_inference` against a float64 torch forward
  of the same weights (Nature's network on small frames, MinAtar's, one with strides its kernels are not
  multiples of), on uint8 observations of batch sizes 1..32, with the same bookkeeping and refusals as
  the MLP engine; with a learner role, a CNN on `torch_device()` given uint8 frames there, exported,
  gives the same Q-values in the backend's engine;
- tabular roles: `rlbench.testing.tabular.check_tabular_engine` on `backend.tabular`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from rlbench.errors import RlbenchError
from rlbench.kit.networks import ConvNetSpec, minatar_cnn, nature_cnn
from rlbench.protocols import ComputeCapabilities

# (layer sizes, hidden activation, output activation): square layers catch transposed weights,
# a 1-wide output and a 3-hidden-layer net catch off-by-one layer handling.
MLP_CASES: tuple[tuple[tuple[int, ...], str, str], ...] = (
    ((4, 2), "relu", "identity"),
    ((4, 120, 84, 2), "relu", "identity"),
    ((3, 64, 64, 1), "relu", "tanh"),
    ((16, 16, 16), "tanh", "identity"),
    ((8, 32, 32, 32, 5), "relu", "relu"),
    ((6, 48, 3), "identity", "tanh"),
)
BATCH_SIZES = (1, 2, 7, 64, 256, 512)
# Small frames keep the check fast: Nature's layers on 44x44 (both space-to-depth-able strides), MinAtar's
# on 10x10 boards, and strides that do not divide their kernels or the frame on a non-square one.
CNN_CASES: tuple[ConvNetSpec, ...] = (
    nature_cnn((4, 44, 44), 6),
    minatar_cnn((7, 10, 10), 5),
    ConvNetSpec((3, 30, 31), ((8, 6, 3), (4, 3, 2)), (16, 9), 3, name="odd-strides"),
)
CNN_BATCH_SIZES = (1, 2, 7, 32)


@dataclass
class ComputeReport:
    """What was checked, and what was not and why (a check never skips silently)."""

    checked: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def reference_mlp(weights: Sequence[np.ndarray], x: np.ndarray, hidden_activation: str,
                  output_activation: str) -> np.ndarray:
    """The float64 forward pass the engines are held to."""
    functions = {"relu": lambda v: np.maximum(v, 0.0), "tanh": np.tanh, "identity": lambda v: v}
    h = np.asarray(x, dtype=np.float64)
    n_layers = len(weights) // 2
    for i in range(n_layers):
        h = h @ np.asarray(weights[2 * i], np.float64) + np.asarray(weights[2 * i + 1], np.float64)
        h = functions[output_activation if i == n_layers - 1 else hidden_activation](h)
    return h


def random_weights(layer_sizes: Sequence[int], rng: np.random.Generator) -> list[np.ndarray]:
    """Weights that keep activations O(1), with biases big enough that dropping them shows."""
    weights = []
    for n_in, n_out in zip(layer_sizes[:-1], layer_sizes[1:]):
        weights.append((rng.standard_normal((n_in, n_out)) * (1.5 / np.sqrt(n_in))).astype(np.float32))
        weights.append((rng.standard_normal(n_out) * 0.5).astype(np.float32))
    return weights


def _capabilities_of(backend: Any, capabilities: ComputeCapabilities | None) -> ComputeCapabilities:
    found = capabilities if capabilities is not None else getattr(backend, "capabilities", None)
    assert isinstance(found, ComputeCapabilities), (
        f"capabilities must be a ComputeCapabilities (from the backend or the argument), got {type(found).__name__}")
    return found


def _roles(capabilities: ComputeCapabilities, algorithms: Sequence[str] | None) -> set[str]:
    """Role kinds ("actor", "learner", "tabular") claimed for the algorithms of interest."""
    roles = set()
    for entry in capabilities.roles:
        algorithm, _, role = entry.partition(":")
        if algorithms is None or algorithm == "*" or algorithm in algorithms:
            roles.add(role)
    return roles


def check_compute_backend(backend_or_factory: Any, *, capabilities: ComputeCapabilities | None = None,
                          algorithms: Sequence[str] | None = None, rtol: float = 1e-4, atol: float = 1e-4,
                          seed: int = 0) -> ComputeReport:
    """Raise AssertionError on the first behaviour that contradicts the claimed capabilities.

    backend_or_factory: a ComputeBackend, or a zero-argument callable returning one.
    capabilities: what to hold it to; default the backend's own `capabilities`.
    algorithms: only check roles of these algorithms (default: every role claimed).
    rtol, atol: tolerance against the float64 reference (a backend computing in lower precision,
    e.g. TF32, passes a looser one and says so).
    """
    is_backend = hasattr(backend_or_factory, "mlp_inference") and not isinstance(backend_or_factory, type)
    backend = backend_or_factory if is_backend else backend_or_factory()
    caps = _capabilities_of(backend, capabilities)
    assert caps.roles, "the backend claims no roles"
    fingerprint = backend.fingerprint()
    assert isinstance(fingerprint, dict), "fingerprint() must return a dict"
    try:
        json.dumps(fingerprint)
    except (TypeError, ValueError) as exc:
        raise AssertionError(f"fingerprint() must be JSON-serialisable (results are JSON): {exc}") from exc
    report = ComputeReport(checked=["fingerprint"])
    roles = _roles(caps, algorithms)
    rng = np.random.default_rng(seed)
    if "actor" in roles:
        check_inference(backend, rng, rtol=rtol, atol=atol)
        report.checked.append("actor: inference engine")
    if "learner" in roles:
        check_learner_device(backend, rng, rtol=rtol, atol=atol)
        report.checked.append("learner: torch device")
    if "cnn" in caps.networks and roles & {"actor", "learner"}:
        check_cnn_inference(backend, rng, rtol=rtol, atol=atol)
        report.checked.append("cnn: inference engine")
        if "learner" in roles:
            check_cnn_learner_device(backend, rng, rtol=rtol, atol=atol)
            report.checked.append("cnn: learner's network on the torch device")
    if "tabular" in roles:
        try:
            from rlbench.testing.tabular import check_tabular_engine
        except ImportError as exc:
            report.skipped.append(f"tabular: rlbench.testing.tabular is not importable ({exc})")
        else:
            check_tabular_engine(backend.tabular)
            report.checked.append("tabular: engine")
    unknown = roles - {"actor", "learner", "tabular"}
    if unknown:
        report.skipped.append(f"roles this check does not know: {', '.join(sorted(unknown))}")
    return report


def _assert_close(got: Any, expected: np.ndarray, rtol: float, atol: float, what: str) -> None:
    assert isinstance(got, np.ndarray), f"{what}: the engine must return a numpy array, got {type(got).__name__}"
    assert got.shape == expected.shape, f"{what}: output shape {got.shape}, expected {expected.shape}"
    assert np.issubdtype(got.dtype, np.floating), f"{what}: output dtype {got.dtype} is not floating point"
    error = np.abs(got.astype(np.float64) - expected)
    bound = atol + rtol * np.abs(expected)
    worst = int(np.argmax(error - bound))
    assert np.all(error <= bound), (
        f"{what}: output differs from the float64 reference by {error.flat[worst]:.3g} "
        f"(allowed {bound.flat[worst]:.3g})")


def _refuses(load: Callable[[], None], what: str) -> None:
    try:
        load()
    except RlbenchError:
        return
    except Exception as exc:
        raise AssertionError(f"{what}: refused with {type(exc).__name__} instead of an RlbenchError: {exc}") from exc
    raise AssertionError(f"{what}: the engine accepted it")


def check_inference(backend: Any, rng: np.random.Generator, *, rtol: float, atol: float) -> None:
    """`mlp_inference` of `backend` against the float64 reference on every MLP_CASES network and batch
    size, within `rtol`/`atol`; an unknown activation must be refused."""
    for sizes, hidden, output in MLP_CASES:
        what = f"MLP {list(sizes)} {hidden}/{output}"
        try:
            _check_inference_case(backend, rng, sizes, hidden, output, what, rtol=rtol, atol=atol)
        except AssertionError:
            raise
        except Exception as exc:  # an engine that crashes on valid input fails the check, with why
            raise AssertionError(f"{what}: {type(exc).__name__}: {exc}") from exc
    _refuses(lambda: backend.mlp_inference([4, 8, 2], hidden_activation="relux"), "an unknown activation")


def _check_inference_case(backend: Any, rng: np.random.Generator, sizes: tuple[int, ...], hidden: str, output: str,
                          what: str, *, rtol: float, atol: float) -> None:
    engine = backend.mlp_inference(list(sizes), hidden_activation=hidden, output_activation=output)
    weights = random_weights(sizes, rng)
    engine.load(weights, 7)
    assert engine.version == 7, f"{what}: version is {engine.version} after load(..., 7)"
    for batch in BATCH_SIZES:
        x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
        _assert_close(engine(x), reference_mlp(weights, x, hidden, output), rtol, atol, f"{what}, batch {batch}")

    x = rng.standard_normal((33, sizes[0])).astype(np.float32)
    expected = reference_mlp(weights, x, hidden, output)
    for w in weights:  # the publisher keeps training its arrays in place
        w *= -3.0
    _assert_close(engine(x), expected, rtol, atol, f"{what}: after the caller changed its arrays (load must copy)")

    newer = random_weights(sizes, rng)
    engine.load(newer, 8)
    assert engine.version == 8, f"{what}: version is {engine.version} after load(..., 8)"
    _assert_close(engine(x), reference_mlp(newer, x, hidden, output), rtol, atol,
                  f"{what}: after loading new weights (stale weights?)")

    expected = reference_mlp(newer, x, hidden, output)
    wrong_loads = {
        "one array missing": newer[:-1],
        "bias of the wrong length": [*newer[:-1], np.zeros(sizes[-1] + 1, np.float32)],
        "W given as (out, in)": [newer[0].T.copy() if sizes[0] != sizes[1] else
                                 np.zeros((sizes[0] + 1, sizes[1]), np.float32), *newer[1:]],
    }
    for problem, bad in wrong_loads.items():
        _refuses(lambda bad=bad: engine.load(bad, 9), f"{what}: weights with {problem}")
        assert engine.version == 8, f"{what}: a refused load ({problem}) changed the version to {engine.version}"
        _assert_close(engine(x), expected, rtol, atol, f"{what}: after a refused load ({problem})")


def check_learner_device(backend: Any, rng: np.random.Generator, *, rtol: float, atol: float) -> None:
    """A learner's step on torch_device() works, and its weights mean the same in the backend's engine."""
    import torch

    from rlbench.algorithms.networks import export_weights, mlp

    device = backend.torch_device()
    assert isinstance(device, torch.device), f"torch_device() must return a torch.device, got {type(device).__name__}"
    torch.manual_seed(int(rng.integers(1 << 31)))
    sizes = [5, 32, 32, 3]
    network = mlp(sizes, device=device)
    x = torch.as_tensor(rng.standard_normal((128, sizes[0])), dtype=torch.float32, device=device)
    y = torch.as_tensor(rng.standard_normal((128, sizes[-1])), dtype=torch.float32, device=device)
    optimizer = torch.optim.Adam(network.parameters(), lr=1e-2)
    losses = []
    for _ in range(20):
        loss = torch.nn.functional.mse_loss(network(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    assert all(np.isfinite(losses)), f"learner step on {device}: loss became {losses[-1]}"
    assert losses[-1] < 0.9 * losses[0], f"learner step on {device}: loss did not fall ({losses[0]:.4f} -> {losses[-1]:.4f})"

    engine = backend.mlp_inference(sizes, hidden_activation="relu", output_activation="identity")
    engine.load(export_weights(network), 1)
    with torch.no_grad():
        expected = network(x).double().cpu().numpy()
    _assert_close(engine(x.cpu().numpy()), expected, max(rtol, 1e-4), max(atol, 1e-4),
                  f"learner on {device}: exported weights in the backend's inference engine")


def random_cnn_weights(network: ConvNetSpec, rng: np.random.Generator) -> list[np.ndarray]:
    """Weights in network.weight_shapes() order that keep activations O(1) on its scaled input, with
    biases big enough that dropping them shows."""
    weights = []
    for shape in network.weight_shapes():
        if len(shape) == 1:
            weights.append((rng.standard_normal(shape) * 0.5).astype(np.float32))
        else:
            fan_in = int(np.prod(shape[1:])) if len(shape) == 4 else shape[0]
            weights.append((rng.standard_normal(shape) * (1.5 / np.sqrt(fan_in))).astype(np.float32))
    return weights


def random_frames(network: ConvNetSpec, batch: int, rng: np.random.Generator) -> np.ndarray:
    """uint8 observations for it: pixels 0..255 where it scales them, 0/1 boards (MinAtar's) where not."""
    high = 256 if network.scale != 1.0 else 2
    return rng.integers(0, high, size=(batch, *network.input_shape), dtype=np.uint8)


def reference_cnn(network: ConvNetSpec, weights: Sequence[np.ndarray], x: np.ndarray) -> np.ndarray:
    """The float64 torch forward the engines are held to: cast, scale, conv+ReLU..., flatten (C, H, W),
    dense+ReLU..., linear output; dense W given as (in, out)."""
    import torch
    from torch.nn import functional as F

    def tensor(array: Any) -> Any:
        return torch.as_tensor(np.asarray(array, dtype=np.float64))

    with torch.no_grad():
        h = tensor(x) * network.scale
        n_convs = len(network.convs)
        for i, (_, _, stride) in enumerate(network.convs):
            h = torch.relu(F.conv2d(h, tensor(weights[2 * i]), tensor(weights[2 * i + 1]), stride=stride))
        h = h.flatten(1)
        dense = range(2 * n_convs, len(weights), 2)
        for j, i in enumerate(dense):
            h = h @ tensor(weights[i]) + tensor(weights[i + 1])
            if j < len(dense) - 1:
                h = torch.relu(h)
        return h.numpy()


def check_cnn_inference(backend: Any, rng: np.random.Generator, *, rtol: float, atol: float) -> None:
    """`cnn_inference` of `backend` against the float64 reference on every CNN_CASES network and batch
    size, within `rtol`/`atol`."""
    assert hasattr(backend, "cnn_inference"), "the capabilities list \"cnn\" in networks, but there is no cnn_inference"
    for network in CNN_CASES:
        what = f"{network.name} on {network.input_shape}"
        try:
            _check_cnn_case(backend, rng, network, what, rtol=rtol, atol=atol)
        except AssertionError:
            raise
        except Exception as exc:  # an engine that crashes on valid input fails the check, with why
            raise AssertionError(f"{what}: {type(exc).__name__}: {exc}") from exc


def _check_cnn_case(backend: Any, rng: np.random.Generator, network: ConvNetSpec, what: str, *,
                    rtol: float, atol: float) -> None:
    engine = backend.cnn_inference(network)
    weights = random_cnn_weights(network, rng)
    engine.load(weights, 7)
    assert engine.version == 7, f"{what}: version is {engine.version} after load(..., 7)"
    for batch in CNN_BATCH_SIZES:
        x = random_frames(network, batch, rng)
        _assert_close(engine(x), reference_cnn(network, weights, x), rtol, atol, f"{what}, uint8 batch {batch}")

    x = random_frames(network, 9, rng)
    expected = reference_cnn(network, weights, x)
    for w in weights:  # the publisher keeps training its arrays in place
        w *= -3.0
    _assert_close(engine(x), expected, rtol, atol, f"{what}: after the caller changed its arrays (load must copy)")

    newer = random_cnn_weights(network, rng)
    engine.load(newer, 8)
    assert engine.version == 8, f"{what}: version is {engine.version} after load(..., 8)"
    expected = reference_cnn(network, newer, x)
    _assert_close(engine(x), expected, rtol, atol, f"{what}: after loading new weights (stale weights?)")

    first_dense = 2 * len(network.convs)
    wrong_loads = {
        "one array missing": newer[:-1],
        "a conv kernel as (in, out, kh, kw)": [newer[0].transpose(1, 0, 2, 3).copy(), *newer[1:]],
        "the first dense W as (out, in)": [*newer[:first_dense], newer[first_dense].T.copy(), *newer[first_dense + 1:]],
    }
    for problem, bad in wrong_loads.items():
        _refuses(lambda bad=bad: engine.load(bad, 9), f"{what}: weights with {problem}")
        assert engine.version == 8, f"{what}: a refused load ({problem}) changed the version to {engine.version}"
        _assert_close(engine(x), expected, rtol, atol, f"{what}: after a refused load ({problem})")


def check_cnn_learner_device(backend: Any, rng: np.random.Generator, *, rtol: float, atol: float) -> None:
    """A learner's CNN on torch_device() takes uint8 frames there, and its exported weights mean the same
    in the backend's engine."""
    import torch

    from rlbench.algorithms.networks import conv_net, export_weights

    device = backend.torch_device()
    torch.manual_seed(int(rng.integers(1 << 31)))
    network = CNN_CASES[0]
    learner_network = conv_net(network, device)
    x = random_frames(network, 8, rng)
    with torch.no_grad():
        expected = learner_network(torch.as_tensor(x, device=device)).double().cpu().numpy()
    engine = backend.cnn_inference(network)
    engine.load(export_weights(learner_network), 1)
    _assert_close(engine(x), expected, max(rtol, 1e-4), max(atol, 1e-4),
                  f"learner on {device}: a CNN's exported weights in the backend's inference engine")
