"""Compute `gpu`: the DQN/DDPG learner on a CUDA device, and actor inference as batched torch matmuls there.

The learner needs nothing from us but `torch_device()`: the core's learners put their networks on
it (an image run's CNN too: it takes the uint8 frames and casts them there). `capture(function,
generators)` hands rlbench's one-device loop a launch of many steps at once (a CUDA graph; see
capture.py). Actor inference (`TorchMLP`, and `TorchConvNet` for rlbench.kit.networks.ConvNetSpec)
takes numpy observations (copied in, the result copied out, as the core's actors expect) or torch
tensors (kept on the device, returned as device tensors, so an actor stepping a GPU environment
never leaves the device). Frames cross to the device as uint8, a quarter of float32's bytes, and are
cast and scaled there.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
from torch.nn import functional as F

from rlbench.errors import RlbenchError
from rlbench.kit.compute import check_activation, check_mlp_weights
from rlbench.kit.networks import ConvNetSpec, check_cnn_weights, check_observation_batch
from rlbench_gpu.capabilities import COMPUTE_CAPABILITIES, on_device
from rlbench_gpu.device import device_fingerprint, resolve_device

_ACTIVATIONS = {"relu": torch.relu, "tanh": torch.tanh, "identity": lambda x: x}


class TorchMLP:
    """InferenceEngine: float32 MLP forward on a torch device. `load` copies the weights to the device."""

    accepts_tensors = True  # tensors in, tensors (on the device) out: actors stay on the device

    def __init__(self, layer_sizes: Sequence[int], *, device: torch.device, hidden_activation: str = "relu",
                 output_activation: str = "identity") -> None:
        if len(layer_sizes) < 2 or any(int(n) < 1 for n in layer_sizes):
            raise RlbenchError(f"layer sizes must be at least two positive ints, got {list(layer_sizes)}")
        self.layer_sizes = tuple(int(n) for n in layer_sizes)
        self.device = device
        self._hidden = _ACTIVATIONS[check_activation(hidden_activation)]
        self._output = _ACTIVATIONS[check_activation(output_activation)]
        self._layers: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._version = -1

    @property
    def version(self) -> int:
        return self._version

    def load(self, weights: Sequence[Any], version: int) -> None:
        check_mlp_weights(self.layer_sizes, weights)
        self._layers = [(_on_device(weights[i], self.device), _on_device(weights[i + 1], self.device))
                        for i in range(0, len(weights), 2)]
        self._version = int(version)

    @torch.no_grad()
    def __call__(self, observations: Any) -> Any:
        if not self._layers:
            raise RlbenchError("the inference engine has no weights yet: call load() first")
        is_tensor = isinstance(observations, torch.Tensor)
        x = observations if is_tensor else torch.from_numpy(np.asarray(observations, dtype=np.float32))
        if x.ndim != 2 or x.shape[1] != self.layer_sizes[0]:
            raise RlbenchError(f"observations must have shape (batch, {self.layer_sizes[0]}), got {tuple(x.shape)}")
        x = x.to(self.device, torch.float32, non_blocking=True)
        last = len(self._layers) - 1
        for i, (w, b) in enumerate(self._layers):
            x = torch.addmm(b, x, w)
            x = self._output(x) if i == last else self._hidden(x)
        return x if is_tensor else x.cpu().numpy()


class TorchConvNet:
    """InferenceEngine: a ConvNetSpec's forward on a torch device (conv2d + ReLU, flatten in (C, H, W)
    order, dense layers with W of shape (in, out)). `load` copies the weights to the device."""

    accepts_tensors = True

    def __init__(self, network: ConvNetSpec, *, device: torch.device) -> None:
        if not isinstance(network, ConvNetSpec):
            raise RlbenchError(f"cnn_inference takes a rlbench.kit.networks.ConvNetSpec, got {type(network).__name__}")
        self.network = network
        self.device = device
        self._convs: list[tuple[torch.Tensor, torch.Tensor, int]] = []
        self._dense: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._version = -1

    @property
    def version(self) -> int:
        return self._version

    def load(self, weights: Sequence[Any], version: int) -> None:
        check_cnn_weights(self.network, weights)
        tensors = [_on_device(w, self.device) for w in weights]
        n_convs = len(self.network.convs)
        self._convs = [(tensors[2 * i], tensors[2 * i + 1], stride)
                       for i, (_, _, stride) in enumerate(self.network.convs)]
        self._dense = [(tensors[i], tensors[i + 1]) for i in range(2 * n_convs, len(tensors), 2)]
        self._version = int(version)

    @torch.no_grad()
    def __call__(self, observations: Any) -> Any:
        if not self._convs:
            raise RlbenchError("the inference engine has no weights yet: call load() first")
        is_tensor = isinstance(observations, torch.Tensor)
        x = observations if is_tensor else torch.from_numpy(np.ascontiguousarray(observations))
        check_observation_batch(self.network, tuple(x.shape))
        x = x.to(self.device, non_blocking=True).reshape(-1, *self.network.input_shape).to(torch.float32)
        if self.network.scale != 1.0:
            x = x * self.network.scale
        for w, b, stride in self._convs:
            x = torch.relu(F.conv2d(x, w, b, stride=stride))
        x = x.flatten(1)
        last = len(self._dense) - 1
        for i, (w, b) in enumerate(self._dense):
            x = torch.addmm(b, x, w)
            if i != last:
                x = torch.relu(x)
        return x if is_tensor else x.cpu().numpy()


def _on_device(array: Any, device: torch.device) -> torch.Tensor:
    """A float32 copy on the device (never a view of the caller's array, which it may train in place)."""
    if isinstance(array, torch.Tensor):
        return array.detach().to(device, torch.float32, copy=True).contiguous()
    return torch.tensor(np.asarray(array, dtype=np.float32), device=device)


class GpuCompute:
    """ComputeBackend "gpu". `device`: a CUDA index or "cuda:N" (the registered component); "cpu" runs
    the same code on the host (tests)."""

    def __init__(self, device: Any = "cuda", *, tf32: bool = False, capture: str = "graph") -> None:
        from rlbench_gpu.capture import CAPTURE_MODES

        if capture not in CAPTURE_MODES:
            raise RlbenchError(f"capture must be one of {', '.join(CAPTURE_MODES)}, got {capture!r}")
        self.capture_mode = capture
        self.device = resolve_device(device)
        self.capabilities = on_device(COMPUTE_CAPABILITIES, self.device.type)
        # TF32 trades ~1e-3 relative matmul precision for speed on Ampere+; off unless asked for.
        self.tf32 = bool(tf32)
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = self.tf32
            # The run's replay gpu and gpu/ environments are built next with device "cuda": same GPU.
            torch.cuda.set_device(self.device)

    def torch_device(self) -> torch.device:
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        return self.device

    def mlp_inference(self, layer_sizes: Sequence[int], *, hidden_activation: str = "relu",
                      output_activation: str = "identity") -> TorchMLP:
        return TorchMLP(layer_sizes, device=self.device, hidden_activation=hidden_activation,
                        output_activation=output_activation)

    def cnn_inference(self, network: ConvNetSpec) -> TorchConvNet:
        return TorchConvNet(network, device=self.device)

    def capture(self, function: Any, generators: Sequence[Any] = ()) -> Any:
        """launch() that runs function() as one captured unit (CUDA graph, or torch.compile then a graph;
        eager on the CPU device). `generators`: the device generators the function draws from."""
        from rlbench_gpu.capture import CapturedLaunch

        return CapturedLaunch(function, device=self.device, mode=self.capture_mode, generators=generators)

    def tabular(self, n_states: int, n_actions: int) -> Any:
        raise RlbenchError(f"compute gpu has {COMPUTE_CAPABILITIES.does_not}")

    def fingerprint(self) -> dict[str, Any]:
        return {**device_fingerprint(self.device), "tf32": self.tf32, "capture": self.capture_mode}
