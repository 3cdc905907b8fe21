"""An independent float64 reference of SwiftRL's per-DPU sweeps with host averaging, in plain Python,
written from the definition (not from the emulator). The plugin's tests compare the emulator to it;
it lives in the package so any test run can import it."""

from __future__ import annotations

import numpy as np


def chunks_of(n: int, dpus: int, strategy: str, seed: int = 0) -> list[np.ndarray]:
    """Rows each DPU processes, in order, built from the partition's definition."""
    if strategy == "contiguous":
        return np.array_split(np.arange(n), dpus)
    if strategy == "stride":
        return [np.arange(d, n, dpus) for d in range(dpus)]
    return np.array_split(np.random.default_rng(seed).permutation(n), dpus)


def reference(arrays, n_states, n_actions, *, dpus, strategy, rule, alpha, gamma, epochs, sync_every=None, seed=0):
    """float64: each DPU sweeps its rows in order from the host table; the host averages each (s, a)
    over the DPUs that updated it and keeps the rest."""
    rows = chunks_of(len(arrays["obs"]), dpus, strategy, seed)
    cols = [arrays[k].tolist() for k in ("obs", "action", "reward", "next_obs", "next_action", "done")]
    host = np.zeros((n_states, n_actions))
    per_round = epochs if sync_every is None else sync_every
    remaining = epochs
    while remaining > 0:
        sweeps = min(per_round, remaining)
        sums, counts = np.zeros_like(host), np.zeros_like(host)
        for chunk in rows:
            q = host.copy()
            seen = np.zeros(host.shape, dtype=bool)
            for _ in range(sweeps):
                for t in chunk.tolist():
                    s, a, r, s2, a2, done = (c[t] for c in cols)
                    bootstrap = 0.0 if done else (q[s2, a2] if rule == "sarsa" else q[s2].max())
                    q[s, a] += alpha * (r + gamma * bootstrap - q[s, a])
                    seen[s, a] = True
            sums += np.where(seen, q, 0.0)
            counts += seen
        host = np.where(counts > 0, sums / np.maximum(counts, 1), host)
        remaining -= sweeps
    return host
