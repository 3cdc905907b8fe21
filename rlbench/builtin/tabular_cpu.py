"""The CPU tabular engine: a float64 Q-table and exact, in-order TD updates with the loop in C.

Batches are checked and converted by `rlbench.kit.tabular.prepare_batch`; index ranges are checked
by the C module in a first pass over the batch, before it updates anything (no numpy reductions per
batch on the online hot path).

    python -m rlbench.builtin.tabular_cpu      # C engine vs a pure-Python loop, updates/s
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping

import numpy as np

from rlbench.kit.tabular import RULES, TabularInputError, TdBatch, check_step_sizes, prepare_batch


class CpuTabularEngine:
    """rlbench.protocols.TabularEngine on the host CPU."""

    def __init__(self, n_states: int, n_actions: int) -> None:
        if int(n_states) < 1 or int(n_actions) < 1:
            raise TabularInputError(f"a Q-table needs at least one state and one action, got ({n_states}, {n_actions})")
        self.n_states, self.n_actions = int(n_states), int(n_actions)
        self.q = np.zeros((self.n_states, self.n_actions), dtype=np.float64)

    def update(self, batch: Mapping[str, np.ndarray], *, rule: str, alpha: float, gamma: float) -> None:
        check_step_sizes(alpha, gamma)
        self._apply(prepare_batch(batch, rule), rule, alpha, gamma, sweeps=1)

    def fit_offline(self, dataset: Mapping[str, np.ndarray], *, rule: str, alpha: float, gamma: float,
                    epochs: int) -> dict[str, Any]:
        check_step_sizes(alpha, gamma)
        if int(epochs) < 1:
            raise TabularInputError(f"epochs must be >= 1, got {epochs!r}")
        batch = prepare_batch(dataset, rule)
        t0 = time.perf_counter()
        self._apply(batch, rule, alpha, gamma, sweeps=int(epochs))
        seconds = time.perf_counter() - t0
        updates = len(batch) * int(epochs)
        return {"engine": "cpu", "timing": "measured", "updates": updates, "epochs": int(epochs),
                "seconds": seconds, "updates_per_s": updates / seconds if seconds > 0 else float("inf")}

    def _apply(self, batch: TdBatch, rule: str, alpha: float, gamma: float, sweeps: int) -> None:
        from rlbench import _tabular

        bad = _tabular.td_update(self.q, batch.obs, batch.action, batch.reward, batch.next_obs, batch.next_action,
                                 batch.done, rule == "sarsa", float(alpha), float(gamma), sweeps)
        if bad is not None:  # the C pass found an index out of range before updating anything
            name, row, value = bad
            limit = self.n_states if name.endswith("obs") else self.n_actions
            raise TabularInputError(f"batch[{name!r}][{row}] = {value} is outside [0, {limit}) "
                                    f"for a ({self.n_states}, {self.n_actions}) table")


def _best_seconds(run: Callable[[], None], repeats: int) -> float:
    """The fastest of a few runs: the least disturbed by other processes on the machine."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t0)
    return best


def _benchmark(n_transitions: int = 200_000, n_states: int = 500, n_actions: int = 6) -> None:
    """C engine vs the pure-Python reference loop on the same random batch, same process."""
    from rlbench.testing.tabular import random_batch, reference_td_update

    rng = np.random.default_rng(0)
    batch = random_batch(rng, n_transitions, n_states, n_actions)
    python_rows = n_transitions // 10  # the Python loop is slow; a slice gives a stable rate
    python_batch = {key: value[:python_rows] for key, value in batch.items()}
    print(f"tabular TD updates, {n_states} states x {n_actions} actions, float64, one thread, best of 5 / 3 runs")
    for rule in RULES:
        engine = CpuTabularEngine(n_states, n_actions)
        table = np.zeros((n_states, n_actions))
        c_rate = n_transitions / _best_seconds(lambda: engine.update(batch, rule=rule, alpha=0.1, gamma=0.99), 5)
        python_rate = python_rows / _best_seconds(
            lambda: reference_td_update(table, python_batch, rule=rule, alpha=0.1, gamma=0.99), 3)
        print(f"  {rule:9s}  C engine {c_rate:14,.0f} updates/s   pure-Python loop {python_rate:12,.0f} updates/s"
              f"   ratio {c_rate / python_rate:6.1f}x")


if __name__ == "__main__":
    _benchmark()
