"""The two baselines the emulator's speed is shown beside, both running the same per-DPU algorithm:

- numpy lock-step: all DPUs advance together, step i updating every DPU's i-th transition in one
  vectorised operation over the DPU axis (each DPU has its own table, so the vectorisation is exact);
- plain Python: one DPU's chunk after another, a Python loop per update over lists.
The numpy one computes in float32 like the emulator, so the benchmark can check their tables agree.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from rlbench_upmem.emulator import partition


def numpy_lockstep(dataset: Mapping[str, np.ndarray], n_states: int, n_actions: int, *, dpus: int, rule: str,
                   alpha: float, gamma: float, epochs: int, strategy: str = "contiguous", seed: int = 0) -> np.ndarray:
    """Per-DPU tables (dpus, S, A) float32 and seen flags folded into the host mean, as the emulator."""
    order, offsets = partition(len(dataset["obs"]), dpus, strategy, seed)
    rows = np.arange(len(dataset["obs"])) if order is None else order
    sizes = np.diff(offsets)
    q = np.zeros((dpus, n_states, n_actions), dtype=np.float32)
    seen = np.zeros((dpus, n_states, n_actions), dtype=bool)
    fields = {k: dataset[k] for k in ("obs", "action", "reward", "next_obs", "next_action", "done")}
    alpha32, gamma32 = np.float32(alpha), np.float32(gamma)
    for _ in range(epochs):
        for i in range(int(sizes.max())):
            active = np.flatnonzero(sizes > i)
            idx = rows[offsets[active] + i]
            s, a, r = fields["obs"][idx], fields["action"][idx], fields["reward"][idx]
            s2, a2, done = fields["next_obs"][idx], fields["next_action"][idx], fields["done"][idx]
            bootstrap = q[active, s2, a2] if rule == "sarsa" else q[active, s2].max(axis=1)
            target = r + gamma32 * np.where(done != 0, np.float32(0), bootstrap)
            old = q[active, s, a]
            q[active, s, a] = old + alpha32 * (target - old)
            seen[active, s, a] = True
    counts = seen.sum(axis=0)
    mean = np.where(counts > 0, (q * seen).sum(axis=0, dtype=np.float64) / np.maximum(counts, 1), 0.0)
    return mean


def python_loop(dataset: Mapping[str, np.ndarray], n_states: int, n_actions: int, *, dpus: int, rule: str,
                alpha: float, gamma: float, epochs: int, max_updates: int | None = None) -> int:
    """Contiguous chunks, one DPU after another, plain Python; stops after max_updates. Returns updates done."""
    _, offsets = partition(len(dataset["obs"]), dpus, "contiguous")
    cols = [dataset[k].tolist() for k in ("obs", "action", "reward", "next_obs", "next_action", "done")]
    done_updates = 0
    for d in range(dpus):
        q = [[0.0] * n_actions for _ in range(n_states)]
        lo, hi = int(offsets[d]), int(offsets[d + 1])
        for _ in range(epochs):
            for t in range(lo, hi):
                s, a, r, s2, a2, done = cols[0][t], cols[1][t], cols[2][t], cols[3][t], cols[4][t], cols[5][t]
                bootstrap = 0.0 if done else (q[s2][a2] if rule == "sarsa" else max(q[s2]))
                q[s][a] += alpha * (r + gamma * bootstrap - q[s][a])
            done_updates += hi - lo
            if max_updates is not None and done_updates >= max_updates:
                return done_updates
    return done_updates
