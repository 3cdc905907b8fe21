"""The JIT-compiled peer of `rlbench upmem bench`: one Q-table, the whole dataset swept in order,
compiled by numba. It computes in the emulator's FP32 arithmetic (float32 table, reward, alpha and
gamma; no fused multiply-add), so its table equals the emulator's on one DPU.

Imports numba, an optional extra (`pip install -e 'plugins/upmem[bench]'`): only the benchmark
imports this module, never `import rlbench_upmem` nor `rlbench list`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numba
import numpy as np

VERSION = numba.__version__


@numba.njit(cache=False, nogil=True)
def _sweep(obs, action, reward, next_obs, next_action, done, q, alpha, gamma, epochs, sarsa):  # pragma: no cover
    n_actions = q.shape[1]
    for _ in range(epochs):
        for t in range(obs.shape[0]):
            bootstrap = np.float32(0.0)
            if done[t] == 0:
                row = next_obs[t]
                if sarsa:
                    bootstrap = q[row, next_action[t]]
                else:
                    bootstrap = q[row, 0]
                    for a in range(1, n_actions):
                        if q[row, a] > bootstrap:  # noqa: PLR1730 (strictly greater, as the emulator scans)
                            bootstrap = q[row, a]
            s, a = obs[t], action[t]
            target = reward[t] + gamma * bootstrap
            q[s, a] = q[s, a] + alpha * (target - q[s, a])


def single_table_sweep(arrays: Mapping[str, np.ndarray], n_states: int, n_actions: int, *, rule: str, alpha: float,
                       gamma: float, epochs: int) -> tuple[Callable[[], None], np.ndarray]:
    """(run, q): run() zeroes q and sweeps the dataset `epochs` times into it. Compiled here, by one
    call on the first transition, so that timing run() measures the loop, not the compiler."""
    zeros = np.zeros(len(arrays["obs"]), dtype=np.int32)  # Q-learning data may lack next_action
    columns = [np.ascontiguousarray(arrays.get(name, zeros), dtype=dtype) for name, dtype in (
        ("obs", np.int32), ("action", np.int32), ("reward", np.float32), ("next_obs", np.int32),
        ("next_action", np.int32), ("done", np.uint8))]
    q = np.zeros((n_states, n_actions), dtype=np.float32)
    step = (np.float32(alpha), np.float32(gamma))
    _sweep(*[c[:1] for c in columns], q, *step, 1, rule == "sarsa")

    def run() -> None:
        q.fill(0.0)
        _sweep(*columns, q, *step, epochs, rule == "sarsa")

    return run, q
