"""The CPU compute backend: torch on the CPU for learners, numpy for actor inference and C for tables.

Actors run their policy through `NumpyMLP`, not torch: a forward pass of a small MLP for one
observation costs a few microseconds in numpy against tens in torch (`rlbench bench compute` prints
both), and an actor process then never imports torch.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from rlbench.builtin import capabilities as caps
from rlbench.errors import RlbenchError
from rlbench.kit.compute import check_activation, check_mlp_weights

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
        self._layers = [(np.array(weights[i], dtype=np.float32, order="C"),
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
