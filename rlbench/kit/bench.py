"""For plugin benchmarks: the peers and helpers rlbench's own `bench` commands use, so a plugin's
figure is printed beside the same baseline, measured the same way.

- `pin_one_thread()`: torch and numpy's OpenBLAS on one thread (compare single-thread peers fairly).
- `interleaved_medians(subjects, rounds, seconds)`: subjects take turns; medians over rounds.
- `cartpole_batch(rng, n)`: n CartPole-sized transitions.
- `AtariStream(seed)`: one env's stream of Atari-sized transitions (4 stacked 84x84 uint8 frames,
  episodes that start with a reset stack), as DQN's replay receives it.
- Peers: `CpprbPrioritized` (cpprb's C++ prioritized buffer), `numpy_sumtree_replay_class()` (the
  textbook numpy sum tree), `torch_forward(weights, ...)` (the same MLP as a torch nn.Sequential);
  for frames, `CpprbFrames` (cpprb's buffer with next_of and stack_compress) and `Sb3Frames` (SB3's
  ReplayBuffer with optimize_memory_usage, as CleanRL's dqn_atari uses it).
- `resident_bytes()`: this process's resident memory (VmRSS).
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
    """`n` random transitions with CartPole's fields and dtypes (obs of 4 float32, a 0/1 action)."""
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
        """Add a batch of transitions, with `priorities` when given."""
        if priorities is None:
            self._buffer.add(**transitions)
        else:
            self._buffer.add(priorities=priorities, **transitions)

    def sample(self, batch_size: int, beta: float) -> Any:
        """Sample `batch_size` transitions with importance weights for `beta`, as a Sample."""
        from rlbench.protocols import Sample

        batch = self._buffer.sample(batch_size, beta)
        indices, weights = batch.pop("indexes"), batch.pop("weights")
        return Sample(indices, batch, weights)

    def update_priorities(self, indices: Any, priorities: Any) -> None:
        """Set the priorities of the sampled `indices`."""
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


# -- frames: the Atari workload ----------------------------------------------------------------------------
ATARI_FRAME = (84, 84)
ATARI_STACK = 4
ATARI_ACTIONS = 18


def resident_bytes() -> int:
    """This process's resident memory (VmRSS of /proc/self/status), in bytes; 0 where there is none."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def available_bytes() -> int | None:
    """What the kernel says can still be made resident (MemAvailable), in bytes; None where unknown."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class AtariStream:
    """One env's transitions as DQN's replay receives them from Atari's standard wrappers (CleanRL's
    dqn_atari: one env, 4 frames of 84x84 uint8 stacked on axis 0): each step brings one new frame;
    an episode (geometric length, mean `mean_episode` steps) starts with a reset stack (its first
    frame four times), and its last transition is done with the terminal stack as next_obs. Every
    frame is distinct (its step number is written into its first 8 bytes of a random frame), so a
    memory can share only what a real stream lets it share. `take(n)` -> the next n transitions."""

    def __init__(self, seed: int = 0, mean_episode: int = 400, bank: int = 64) -> None:
        import numpy as np

        self._rng = np.random.default_rng(seed)
        self._bank = self._rng.integers(0, 256, (bank, *ATARI_FRAME), dtype=np.uint8)
        self._mean_episode = mean_episode
        self._next_frame = 0  # the frame number the current episode's next frame gets
        self._episode_first = 0  # the current episode's reset frame
        self._position = 0  # steps taken in the current episode
        self._length = self._episode_length()

    def _episode_length(self) -> int:
        return int(max(10, self._rng.geometric(1.0 / self._mean_episode)))

    def take(self, n: int) -> dict[str, Any]:
        """The stream's next `n` transitions (obs, action, reward, next_obs, done)."""
        import numpy as np

        stack = np.arange(ATARI_STACK)
        obs_ids = np.empty((n, ATARI_STACK), dtype=np.int64)
        next_ids = np.empty((n, ATARI_STACK), dtype=np.int64)
        done = np.zeros(n, dtype=np.float32)
        for row in range(n):  # frame numbers per row (cheap); the frames themselves are built at once below
            if self._position == 0:
                self._episode_first = self._next_frame
                self._next_frame += 1
            first, position = self._episode_first, self._position
            obs_ids[row] = first + np.maximum(position + stack - (ATARI_STACK - 1), 0)
            next_ids[row] = first + np.maximum(position + 1 + stack - (ATARI_STACK - 1), 0)
            self._next_frame += 1
            self._position += 1
            if self._position == self._length:
                done[row] = 1.0
                self._position, self._length = 0, self._episode_length()
        return {"obs": self._frames(obs_ids), "action": self._rng.integers(0, ATARI_ACTIONS, n, dtype=np.int64),
                "reward": self._rng.choice(np.array([0.0, 1.0], dtype=np.float32), n, p=[0.9, 0.1]),
                "next_obs": self._frames(next_ids), "done": done}

    def _frames(self, numbers: Any) -> Any:
        import numpy as np

        frames = self._bank[numbers % len(self._bank)]  # a copy: (n, 4, 84, 84)
        frames.reshape(-1, frames[0, 0].size)[:, :8] = numbers.reshape(-1, 1).astype("<i8").view(np.uint8)
        return frames


class CpprbFrames:
    """cpprb's PrioritizedReplayBuffer for stacked frames as its documentation shows it: next_of="obs"
    (next_obs not stored) and stack_compress="obs" (a stack's frames shared with its neighbours';
    cpprb stacks on the LAST axis, so observations are (84, 84, 4)), `on_episode_end()` after each
    episode's last step (which cpprb needs to keep the stacks around episode ends). `prepare(batch)`
    turns a batch of this package's (n, 4, 84, 84) transitions into its own layout (untimed);
    `add_prepared` adds it."""

    def __init__(self, capacity: int, *, alpha: float, prioritized: bool = True) -> None:
        import numpy as np
        from cpprb import PrioritizedReplayBuffer, ReplayBuffer

        fields = {"obs": {"shape": (*ATARI_FRAME, ATARI_STACK), "dtype": np.ubyte}, "act": {"shape": 1, "dtype": np.int64},
                  "rew": {"dtype": np.float32}, "done": {"dtype": np.float32}}
        options = {"next_of": "obs", "stack_compress": "obs"}
        self._buffer = (PrioritizedReplayBuffer(capacity, fields, alpha=alpha, **options) if prioritized
                        else ReplayBuffer(capacity, fields, **options))
        self._prioritized = prioritized

    def __len__(self) -> int:
        return self._buffer.get_stored_size()

    @staticmethod
    def prepare(batch: dict[str, Any]) -> list[tuple[dict[str, Any], bool]]:
        """Segments that end at an episode's end (cpprb adds a segment in one call, then on_episode_end)."""
        import numpy as np

        channels_last = {name: np.ascontiguousarray(np.moveaxis(batch[name], 1, -1)) for name in ("obs", "next_obs")}
        ends = np.flatnonzero(batch["done"]) + 1
        segments, start = [], 0
        for end in [*ends.tolist(), len(batch["done"])]:
            if end > start:
                segments.append(({"obs": channels_last["obs"][start:end], "act": batch["action"][start:end],
                                  "rew": batch["reward"][start:end], "next_obs": channels_last["next_obs"][start:end],
                                  "done": batch["done"][start:end]}, bool(batch["done"][end - 1])))
            start = end
        return segments

    def add_prepared(self, segments: list[tuple[dict[str, Any], bool]]) -> None:
        """Add what `prepare` made: each segment's rows, ending the episode where it ended."""
        for fields, episode_ends in segments:
            self._buffer.add(**fields)
            if episode_ends:
                self._buffer.on_episode_end()

    def sample(self, batch_size: int, beta: float = 0.4) -> Any:
        """Sample `batch_size` transitions (with weights for `beta` when prioritized), as a Sample."""
        from rlbench.protocols import Sample

        batch = self._buffer.sample(batch_size, beta) if self._prioritized else self._buffer.sample(batch_size)
        indices, weights = batch.pop("indexes", None), batch.pop("weights", None)
        return Sample(indices, batch, weights)


class Sb3Frames:
    """stable-baselines3's ReplayBuffer as CleanRL's dqn_atari builds it (optimize_memory_usage=True:
    next_obs is read from the next slot's obs; handle_timeout_termination=False; device "cpu"; one
    env) and calls it (`add(obs, next_obs, action, reward, done, infos)` once per step, `sample(32)`
    returning torch tensors). It keeps whole stacks (28 KB per transition): 1 M transitions need 28 GB.
    Its next_obs at an episode's last step is the next episode's first obs (masked by done in DQN's
    target). `prepare(batch)` gives its per-step arguments (untimed)."""

    def __init__(self, capacity: int) -> None:
        import numpy as np
        from gymnasium import spaces
        from stable_baselines3.common.buffers import ReplayBuffer

        observation = spaces.Box(0, 255, (ATARI_STACK, *ATARI_FRAME), np.uint8)
        self._buffer = ReplayBuffer(capacity, observation, spaces.Discrete(ATARI_ACTIONS), device="cpu",
                                    optimize_memory_usage=True, handle_timeout_termination=False)

    def __len__(self) -> int:
        return self._buffer.size()

    @staticmethod
    def prepare(batch: dict[str, Any]) -> list[tuple]:
        """A batch of transitions as the per-step arguments of the buffer's `add` (untimed)."""
        return [(batch["obs"][i:i + 1], batch["next_obs"][i:i + 1], batch["action"][i:i + 1], batch["reward"][i:i + 1],
                 batch["done"][i:i + 1].astype(bool), [{}]) for i in range(len(batch["done"]))]

    def add_prepared(self, steps: list[tuple]) -> None:
        """Add what `prepare` made, one step at a time."""
        for step in steps:
            self._buffer.add(*step)

    def sample(self, batch_size: int, beta: float = 0.4) -> Any:
        """Sample `batch_size` transitions (uniform: no indices or weights), as a Sample."""
        from rlbench.protocols import Sample

        data = self._buffer.sample(batch_size)
        return Sample(None, {"obs": data.observations, "action": data.actions, "reward": data.rewards,
                             "next_obs": data.next_observations, "done": data.dones}, None)


def image_transitions(rows: int, seed: int, *, frame_shape: tuple[int, ...] = (84, 84), stack: int = 4,
                      episode_steps: tuple[int, int] = (20, 200)) -> dict[str, Any]:
    """`rows` consecutive transitions of an image run's actor (one environment): observations of
    `stack` uint8 frames on axis 0 (Atari's 4 x 84 x 84 by default; stack 1: the frame itself), a
    new random frame each step, next_obs its obs shifted by one frame, and an episode ending every
    `episode_steps` steps or so (done = 1), after which a fresh stack of the reset frame begins."""
    import numpy as np

    rng = np.random.default_rng(seed)
    frames = rng.integers(0, 256, (2 * rows + 2, *frame_shape), dtype=np.uint8)  # at most 2 new per row
    obs = np.empty((rows, stack, *frame_shape), dtype=np.uint8)
    next_obs = np.empty_like(obs)
    done = np.zeros(rows, dtype=np.float32)
    used = 0
    window = np.repeat(frames[:1], stack, axis=0)  # the reset frame, stacked
    left = int(rng.integers(*episode_steps))
    for row in range(rows):
        used += 1
        obs[row] = window
        window = np.concatenate([window[1:], frames[used:used + 1]])
        next_obs[row] = window
        left -= 1
        if left == 0:
            done[row] = 1.0
            used += 1
            window = np.repeat(frames[used:used + 1], stack, axis=0)
            left = int(rng.integers(*episode_steps))
    if stack == 1:
        obs, next_obs = obs[:, 0], next_obs[:, 0]
    return {"obs": obs, "action": rng.integers(0, 18, rows, dtype=np.int64),
            "reward": rng.integers(-1, 2, rows).astype(np.float32), "next_obs": next_obs, "done": done}
