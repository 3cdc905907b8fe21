"""The CPU compute backend: torch on the CPU for learners, numpy for actor inference and C for tables.

Actors run their policy through `NumpyMLP` and `NumpyConvNet`, not torch: a forward pass of a small
MLP for one observation costs a few microseconds in numpy against tens in torch, and one of the
Nature CNN on an 84x84x4 frame stack ~370 us against ~550 (one thread; `rlbench bench compute`
prints both), and an actor process then never imports torch. From about 4 observations a call
torch's oneDNN convolutions are the faster (32: ~7.6 ms against ~12), which an actor meets only in
its initial priorities of a prioritized run's INSERT chunk.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided

from rlbench.builtin import capabilities as caps
from rlbench.errors import RlbenchError
from rlbench.kit.compute import check_activation, check_mlp_weights
from rlbench.kit.networks import ConvNetSpec, check_cnn_weights, check_observation_batch

class NumpyMLP:
    """InferenceEngine: float32 MLP forward in numpy. `load` copies, so the publisher may keep
    training its own arrays in place."""

    def __init__(self, layer_sizes: Sequence[int], *, hidden_activation: str = "relu",
                 output_activation: str = "identity") -> None:
        if len(layer_sizes) < 2 or any(int(n) < 1 for n in layer_sizes):
            raise RlbenchError(f"layer sizes must be at least two positive ints, got {list(layer_sizes)}")
        self.layer_sizes = tuple(int(n) for n in layer_sizes)
        self.hidden_activation = check_activation(hidden_activation)
        self.output_activation = check_activation(output_activation)
        self._layers: list[tuple[np.ndarray, np.ndarray]] = []
        self._version = -1

    @property
    def version(self) -> int:
        return self._version

    def load(self, weights: Sequence[np.ndarray], version: int) -> None:
        check_mlp_weights(self.layer_sizes, weights)
        self._layers = [(np.array(weights[i], dtype=np.float32, order="K"),  # a copy in the order given: matmul reads either
                         np.array(weights[i + 1], dtype=np.float32))
                        for i in range(0, len(weights), 2)]
        self._version = int(version)

    def __call__(self, observations: np.ndarray) -> np.ndarray:
        if not self._layers:
            raise RlbenchError("the inference engine has no weights yet: call load() first")
        x = np.asarray(observations, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != self.layer_sizes[0]:
            raise RlbenchError(f"observations must have shape (batch, {self.layer_sizes[0]}), got {x.shape}")
        last = len(self._layers) - 1
        for i, (w, b) in enumerate(self._layers):
            x = x @ w
            x += b  # in place: x is a fresh array from the matmul
            activation = self.output_activation if i == last else self.hidden_activation
            if activation == "relu":
                np.maximum(x, 0.0, out=x)
            elif activation == "tanh":
                np.tanh(x, out=x)
        return x


class NumpyConvNet:
    """InferenceEngine: a ConvNetSpec's forward in numpy (im2col and one BLAS matmul per convolution), on
    (batch, C, H, W) observations of any numeric dtype (uint8 frames are cast once), float32 Q-values out.

    Frames are turned channels-last once, so each im2col row is a run of contiguous channels and each
    convolution's output is the next one's input without a transpose. A convolution whose kernel is a
    multiple of its stride (Nature's 8/4 and 4/2) runs as a stride-1 one on the space-to-depth input
    (s x s blocks folded into channels): its im2col copies runs of s*s*C floats instead of C (~15 % of a
    Nature forward). `load` rearranges the published weights to match, once: the input scale folded
    into the first kernel. The last convolution's output goes back to torch's (C, H, W) order before the
    dense layers (a few KB per observation) so that their weights load as published: permuting the
    first dense layer's 6.4 MB of rows on every load cost more than the forward pass.
    """

    def __init__(self, network: ConvNetSpec) -> None:
        if not isinstance(network, ConvNetSpec):
            raise RlbenchError(f"cnn_inference takes a rlbench.kit.networks.ConvNetSpec, got {type(network).__name__}")
        self.network = network
        self._convs: list[tuple[np.ndarray, np.ndarray, int, int, bool]] = []  # (W, b, kernel, stride, space-to-depth)
        self._dense: list[tuple[np.ndarray, np.ndarray]] = []
        self._version = -1

    @property
    def version(self) -> int:
        return self._version

    def load(self, weights: Sequence[np.ndarray], version: int) -> None:
        network = self.network
        check_cnn_weights(network, weights)
        convs = []
        for i, (out, kernel, stride) in enumerate(network.convs):
            w = np.asarray(weights[2 * i], dtype=np.float32)
            if i == 0 and network.scale != 1.0:
                w = w * np.float32(network.scale)
            space_to_depth = stride > 1 and kernel % stride == 0
            if space_to_depth:  # rows in the order of a window of blocks: (block i, block j, di, dj, channel)
                q = kernel // stride
                w = w.reshape(out, -1, q, stride, q, stride).transpose(2, 4, 3, 5, 1, 0)
            else:  # rows in the order of a window: (i, j, channel)
                w = w.transpose(2, 3, 1, 0)
            convs.append((np.array(w.reshape(-1, out), dtype=np.float32, order="C"),
                          np.array(weights[2 * i + 1], dtype=np.float32), kernel, stride, space_to_depth))
        # dense layers as published (a copy in the order given: matmul reads either)
        dense = [(np.array(weights[i], dtype=np.float32, order="K"), np.array(weights[i + 1], dtype=np.float32))
                 for i in range(2 * len(network.convs), len(weights), 2)]
        self._convs, self._dense = convs, dense
        self._version = int(version)

    def __call__(self, observations: np.ndarray) -> np.ndarray:
        if not self._convs:
            raise RlbenchError("the inference engine has no weights yet: call load() first")
        x = np.asarray(observations)
        check_observation_batch(self.network, x.shape)
        batch = x.shape[0]
        # channels last, float32: one copy
        x = x.reshape(batch, *self.network.input_shape).transpose(0, 2, 3, 1).astype(np.float32)
        for w, b, kernel, stride, space_to_depth in self._convs:
            height, width, channels = x.shape[1:]
            out_h, out_w = (height - kernel) // stride + 1, (width - kernel) // stride + 1
            if space_to_depth:
                q = kernel // stride
                used_h, used_w = (out_h - 1 + q) * stride, (out_w - 1 + q) * stride  # what the windows read
                x = (x[:, :used_h, :used_w].reshape(batch, used_h // stride, stride, used_w // stride, stride, channels)
                     .transpose(0, 1, 3, 2, 4, 5).reshape(batch, used_h // stride, used_w // stride, -1))
                kernel, stride, channels = q, 1, x.shape[3]
            sb, sh, sw, sc = x.strides
            windows = as_strided(x, (batch, out_h, out_w, kernel, kernel, channels),
                                 (sb, sh * stride, sw * stride, sh, sw, sc), writeable=False)
            y = windows.reshape(batch * out_h * out_w, -1) @ w
            y += b
            np.maximum(y, 0.0, out=y)
            x = y.reshape(batch, out_h, out_w, -1)
        x = x.transpose(0, 3, 1, 2).reshape(batch, -1)  # torch's (C, H, W) flatten order, as the dense weights are
        last = len(self._dense) - 1
        for i, (w, b) in enumerate(self._dense):
            x = x @ w
            x += b
            if i != last:
                np.maximum(x, 0.0, out=x)
        return x


class CpuCompute:
    """ComputeBackend "cpu". `threads` pins torch's intra-op threads (the learner's update); torch is
    imported only when a learner asks for its device, so an actor process never loads it."""

    def __init__(self, threads: int = 1) -> None:
        if int(threads) < 1:
            raise RlbenchError(f"threads must be >= 1, got {threads}")
        self.threads = int(threads)

    capabilities = caps.CPU

    def torch_device(self) -> Any:
        import torch

        torch.set_num_threads(self.threads)
        return torch.device("cpu")

    def mlp_inference(self, layer_sizes: Sequence[int], *, hidden_activation: str = "relu",
                      output_activation: str = "identity") -> NumpyMLP:
        return NumpyMLP(layer_sizes, hidden_activation=hidden_activation, output_activation=output_activation)

    def cnn_inference(self, network: ConvNetSpec) -> NumpyConvNet:
        import threadpoolctl

        # its convolutions are BLAS matmuls: on `threads` threads, as the learner's torch, in every loop (a
        # local run's process is not a launched role, whose pools the launcher sizes): at a thread per core
        # on a busy 2-core host a Nature forward took 40-100 ms instead of 1-3
        threadpoolctl.threadpool_limits(limits=self.threads, user_api="blas")
        return NumpyConvNet(network)

    def tabular(self, n_states: int, n_actions: int) -> Any:
        from rlbench.builtin.tabular_cpu import CpuTabularEngine

        return CpuTabularEngine(n_states, n_actions)

    def fingerprint(self) -> dict[str, Any]:
        import torch

        config = torch.__config__
        return {
            "torch": torch.__version__,
            "numpy": np.__version__,
            "threads": self.threads,  # set in torch when a learner takes the device
            "interop_threads": torch.get_num_interop_threads(),
            "mkl": bool(torch.backends.mkl.is_available()),
            "mkldnn": bool(torch.backends.mkldnn.is_available()),
            "openmp": bool(torch.backends.openmp.is_available()),
            "parallel": _first_line_with(config.parallel_info(), "parallel backend"),
            "cpu_capability": _cpu_capability(),  # e.g. AVX2, AVX512
        }


def _first_line_with(text: str, needle: str) -> str:
    return next((line.strip() for line in text.splitlines() if needle.lower() in line.lower()), "")


def _cpu_capability() -> str:
    import torch

    get: Callable[[], str] | None = getattr(torch.backends.cpu, "get_cpu_capability", None)
    return get() if get else ""
