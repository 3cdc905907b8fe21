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
    """cpprb's C++ PrioritizedReplayBuffer used as its documentation shows (`add(**fields)` or with
    `priorities=`, `sample(batch_size, beta)`, `update_priorities(indexes, priorities)`); its sample
    dict is handed back as a protocol `Sample` (indices = its "indexes", uint64 as cpprb returns them,
    which is what a cpprb user passes back to update_priorities)."""

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

    def sample(self, batch_size: int, beta: float) -> Any:
        from rlbench.protocols import Sample

        batch = self._buffer.sample(batch_size, beta)
        indices, weights = batch.pop("indexes"), batch.pop("weights")
        return Sample(indices, batch, weights)

    def update_priorities(self, indices: Any, priorities: Any) -> None:
        self._buffer.update_priorities(indices, priorities)


# Up to this many items, the baseline walks each one to the root in a Python loop; from here on the
# level-by-level numpy path is cheaper (measured: a scalar walk of a 2**20-leaf tree costs about as
# much as ~1/16 of a vectorised update of a few items, whose fixed cost is ~20 levels of numpy calls).
SCALAR_UPDATE_MAX = 16


@functools.cache
def numpy_sumtree_replay_class() -> type:
    """The textbook baseline: the classic array sum tree and min tree (root at 1, children of node i
    at 2i and 2i+1, leaves from the first power of two >= capacity, as OpenAI baselines' SegmentTree)
    in numpy arrays, written the way numpy users write it: one item walks to the root in a scalar
    loop; a batch is updated and sampled level by level with vectorised numpy, where that pays. It
    reuses the built-in storage (UniformReplay), so against `prioritized` it differs only in the tree.
    Built on first use because this module imports only click."""
    import numpy as np

    from rlbench.builtin.replay import UniformReplay
    from rlbench.kit.replay import ReplayError, validated_update
    from rlbench.protocols import ReplayCapabilities, Sample

    class NumpySumTreeReplay(UniformReplay):
        capabilities = ReplayCapabilities(prioritized=True)

        def __init__(self, capacity: int, *, alpha: float = 0.6, seed: int | None = None, **ignored: Any) -> None:
            super().__init__(capacity, alpha=alpha, seed=seed)
            self._leaf0 = 1 << max(0, (self.capacity - 1).bit_length())
            self._sum = np.zeros(2 * self._leaf0)
            self._min = np.full(2 * self._leaf0, np.inf)  # zero priorities and empty slots: +inf
            self._max_priority = 1.0

        def _set_new_priorities(self, indices: np.ndarray, priorities: Any, new_size: int) -> None:
            if priorities is None:  # the largest priority seen so far; indices from add are distinct
                value = self._max_priority ** self.alpha
                if len(indices) <= SCALAR_UPDATE_MAX:
                    for index in indices.tolist():
                        self._set_one(index, value)
                else:
                    self._set_many(indices, np.full(len(indices), value), distinct=len(indices) <= self.capacity)
                return
            self._write(indices, priorities, new_size)

        def update_priorities(self, indices: np.ndarray, priorities: np.ndarray) -> None:
            self._updated_items += self._write(indices, priorities, self._size)
            self._updates += 1

        def _write(self, indices: Any, priorities: Any, size: int) -> int:
            indices, priorities = validated_update(indices, priorities, size)
            count = len(indices)
            if not count:
                return 0
            self._max_priority = max(self._max_priority, float(priorities.max()))
            if count <= SCALAR_UPDATE_MAX:  # in order, so a repeated index keeps its last priority
                for index, priority in zip(indices.tolist(), priorities.tolist()):
                    self._set_one(index, priority ** self.alpha)
            else:
                self._set_many(indices, priorities ** self.alpha, distinct=False)
            return count

        def _set_one(self, index: int, value: float) -> None:
            total, least = self._sum, self._min
            node = index + self._leaf0
            total[node] = value
            least[node] = value if value > 0 else np.inf
            node >>= 1
            while node:
                left = 2 * node
                total[node] = total[left] + total[left + 1]
                least[node] = min(least[left], least[left + 1])
                node >>= 1

        def _set_many(self, indices: np.ndarray, values: np.ndarray, *, distinct: bool) -> None:
            if not distinct:  # numpy does not promise which value a repeated index gets: keep the last
                _, from_end = np.unique(indices[::-1], return_index=True)
                last = len(indices) - 1 - from_end
                indices, values = indices[last], values[last]
            nodes = indices + self._leaf0
            self._sum[nodes] = values
            self._min[nodes] = np.where(values > 0, values, np.inf)
            while nodes[0] > 1:
                nodes = nodes >> 1  # a parent shared by several items gets the same value from each
                left = 2 * nodes
                self._sum[nodes] = self._sum[left] + self._sum[left + 1]
                self._min[nodes] = np.minimum(self._min[left], self._min[left + 1])

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
