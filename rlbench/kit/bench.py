"""For plugin benchmarks: the peers and helpers rlbench's own `bench` commands use, so a plugin's
figure is printed beside the same baseline, measured the same way.

- `pin_one_thread()`: torch and numpy's OpenBLAS on one thread (compare single-thread peers fairly).
- `interleaved_medians(subjects, rounds, seconds)`: subjects take turns; medians over rounds.
- `cartpole_batch(rng, n)`: n CartPole-sized transitions.
- Peers: `CpprbPrioritized` (cpprb's C++ prioritized buffer), `numpy_sumtree_replay_class()` (the
  textbook numpy sum tree), `torch_forward(weights, ...)` (the same MLP as a torch nn.Sequential).
- `parse_sizes`: click callback for comma-separated byte counts.

Only the standard library and click are imported here; each helper imports what it needs.
"""

from __future__ import annotations

import ctypes
import functools
import time
from typing import Any, Callable

import click


def pin_one_thread() -> dict[str, object]:
    """torch.set_num_threads(1) and OpenBLAS's set_num_threads(1) on the copy numpy loaded (found in
    /proc/self/maps, as threadpoolctl does). Returns what was pinned, for the benchmark's output."""
    import numpy  # noqa: F401  (its BLAS must be loaded to be found)
    import torch

    torch.set_num_threads(1)
    pinned: dict[str, object] = {"torch_threads": torch.get_num_threads(), "numpy_blas_threads": "not pinned"}
    try:
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split()[-1] for line in maps if "openblas" in line.lower() and "/" in line})
    except OSError:
        return pinned
    for path in paths:
        library = ctypes.CDLL(path)
        for prefix in ("scipy_openblas_", "openblas_"):
            for suffix in ("64_", ""):
                setter = getattr(library, f"{prefix}set_num_threads{suffix}", None)
                if setter is not None:
                    setter(1)
                    pinned["numpy_blas_threads"] = 1
                    return pinned
    return pinned


def interleaved_medians(subjects: dict[str, Callable[[int], Any]], rounds: int, seconds: float) -> dict[str, float]:
    """Microseconds per call of each subject: the median over rounds, subjects taking turns."""
    import numpy as np

    samples: dict[str, list[float]] = {name: [] for name in subjects}
    for _ in range(rounds):
        for name, call in subjects.items():
            calls, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                for k in range(calls, calls + 8):
                    call(k)
                calls += 8
            samples[name].append((time.perf_counter() - start) / calls * 1e6)
    return {name: float(np.median(values)) for name, values in samples.items()}


def cartpole_batch(rng: Any, n: int) -> dict[str, Any]:
    import numpy as np

    return {
        "obs": rng.standard_normal((n, 4), dtype=np.float32),
        "action": rng.integers(0, 2, n, dtype=np.int64),
        "reward": np.ones(n, dtype=np.float32),
        "next_obs": rng.standard_normal((n, 4), dtype=np.float32),
        "done": (rng.random(n) < 0.05).astype(np.float32),
    }


def torch_forward(weights: list[Any], hidden: str, output: str) -> Callable[[Any], Any]:
    """The peer: the same MLP as an nn.Sequential on the CPU, numpy in and out as an actor needs."""
    import torch

    from rlbench.algorithms.networks import mlp

    sizes = [weights[0].shape[0]] + [w.shape[1] for w in weights[0::2]]
    network = mlp(sizes, hidden_activation=hidden, output_activation=output)
    linears = [m for m in network if isinstance(m, torch.nn.Linear)]
    with torch.no_grad():
        for layer, w, b in zip(linears, weights[0::2], weights[1::2]):
            layer.weight.copy_(torch.from_numpy(w.T))
            layer.bias.copy_(torch.from_numpy(b))

    def forward(x: Any) -> Any:
        with torch.no_grad():
            return network(torch.from_numpy(x)).numpy()

    return forward


def parse_sizes(_ctx: Any, _param: Any, value: str) -> tuple[int, ...]:
    """click callback for comma-separated byte counts (also used by plugins' benchmarks)."""
    try:
        sizes = tuple(int(part) for part in value.split(",") if part.strip())
    except ValueError:
        raise click.BadParameter(f"expected comma-separated byte counts like 64,4096, got {value!r}") from None
    if not sizes or min(sizes) < 1:
        raise click.BadParameter("sizes must be positive byte counts")
    return sizes


class CpprbPrioritized:
    """cpprb's C++ PrioritizedReplayBuffer behind the calls the benchmark makes."""

    def __init__(self, capacity: int, *, alpha: float) -> None:
        import numpy as np
        from cpprb import PrioritizedReplayBuffer

        fields = {"obs": {"shape": 4, "dtype": np.float32}, "action": {"shape": 1, "dtype": np.int64},
                  "reward": {"dtype": np.float32}, "next_obs": {"shape": 4, "dtype": np.float32},
                  "done": {"dtype": np.float32}}
        self._buffer = PrioritizedReplayBuffer(capacity, fields, alpha=alpha)

    def __len__(self) -> int:
        return self._buffer.get_stored_size()

    def add(self, transitions: dict[str, Any], priorities: Any = None) -> None:
        if priorities is None:
            self._buffer.add(**transitions)
        else:
            self._buffer.add(priorities=priorities, **transitions)

    def sample(self, batch_size: int, beta: float) -> dict[str, Any]:
        return self._buffer.sample(batch_size, beta)

    def update_priorities(self, indices: Any, priorities: Any) -> None:
        self._buffer.update_priorities(indices, priorities)


@functools.cache
def numpy_sumtree_replay_class() -> type:
    """The textbook baseline: a binary sum tree and min tree in numpy arrays, vectorised level by
    level. It reuses the built-in storage (UniformReplay), so against `prioritized` it differs only
    in the tree. Built on first use because this module imports only click."""
    import numpy as np

    from rlbench.builtin.replay import UniformReplay
    from rlbench.kit.replay import ReplayError, validated_update
    from rlbench.protocols import ReplayCapabilities, Sample

    class NumpySumTreeReplay(UniformReplay):
        capabilities = ReplayCapabilities(prioritized=True)

        def __init__(self, capacity: int, *, alpha: float = 0.6, seed: int | None = None, **ignored: Any) -> None:
            super().__init__(capacity, alpha=alpha, seed=seed)
            self._leaf0 = 1 << max(0, (self.capacity - 1).bit_length())  # leaves at [leaf0, 2 leaf0), root at 1
            self._sum = np.zeros(2 * self._leaf0)
            self._min = np.full(2 * self._leaf0, np.inf)
            self._max_priority = 1.0

        def _set_new_priorities(self, indices: np.ndarray, priorities: Any, new_size: int) -> None:
            if priorities is None:
                priorities = np.full(len(indices), self._max_priority)
            self._write(indices, priorities, new_size)

        def update_priorities(self, indices: np.ndarray, priorities: np.ndarray) -> None:
            self._updated_items += self._write(indices, priorities, self._size)
            self._updates += 1

        def _write(self, indices: Any, priorities: Any, size: int) -> int:
            indices, priorities = validated_update(indices, priorities, size)
            count = len(indices)
            if count:
                self._max_priority = max(self._max_priority, float(priorities.max()))
            # numpy does not promise which value a repeated index gets: keep each index's last one.
            _, from_end = np.unique(indices[::-1], return_index=True)
            last = len(indices) - 1 - from_end
            indices, priorities = indices[last], priorities[last]
            scaled = priorities ** self.alpha
            nodes = indices + self._leaf0
            self._sum[nodes] = scaled
            self._min[nodes] = np.where(scaled > 0, scaled, np.inf)
            while nodes.size and nodes[0] > 1:
                nodes = nodes >> 1
                self._sum[nodes] = self._sum[2 * nodes] + self._sum[2 * nodes + 1]
                self._min[nodes] = np.minimum(self._min[2 * nodes], self._min[2 * nodes + 1])
            return count

        def sample(self, batch_size: int, beta: float = 0.4) -> Sample:
            batch_size, beta = self._check_sample(batch_size, beta)
            total = self._sum[1]
            if not total > 0:
                raise ReplayError("cannot sample: every stored priority is zero")
            mass = (np.arange(batch_size) + self._rng.random(batch_size)) * (total / batch_size)
            nodes = np.ones(batch_size, dtype=np.int64)
            while nodes[0] < self._leaf0:
                left = 2 * nodes
                left_mass = self._sum[left]
                go_right = mass >= left_mass
                mass -= np.where(go_right, left_mass, 0.0)
                nodes = left + go_right
            indices = nodes - self._leaf0
            weights = ((self._sum[nodes] / self._min[1]) ** -beta).astype(np.float32)
            return Sample(indices, self._gather(indices), weights)

    return NumpySumTreeReplay
