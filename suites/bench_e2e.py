"""End to end: the matrix's workloads across every transport x replay x compute x placement, each cell
a real short run with a fixed seed (rlbench.bench.matrix, shared with `rlbench bench matrix`). Invalid
cells are skipped with the message of the validator the CLI uses.

RLBENCH_ASV_MATRIX=quick (the default) measures the limited subset rlbench.bench.matrix.QUICK (about
two minutes); RLBENCH_ASV_MATRIX=full measures every valid cell (~420 runs here: hours). Both have the same
grid, budgets and seed, so a quick run's cells line up with a full run's in the dashboard.
"""

from __future__ import annotations

from typing import Any, Callable

from .common import full_matrix, lookup

from rlbench.bench.matrix import (COMPUTES, PLACEMENTS, REAL_WORKLOADS, REPLAY_LOOP_ALGORITHMS, REPLAYS,
                                  TABULAR_ALGORITHMS, TRANSPORTS, Cell, in_quick_subset)


def selection() -> Callable[[Cell], bool]:
    return (lambda cell: True) if full_matrix() else in_quick_subset


class ReplayLoop:
    """DQN (CartPole-v1) and DDPG (Pendulum-v1): actor, replay and learner over a placement."""

    params = [list(REPLAY_LOOP_ALGORITHMS), list(PLACEMENTS), list(TRANSPORTS), list(REPLAYS), list(COMPUTES)]
    param_names = ["algo", "placement", "transport", "replay", "compute"]
    timeout = 7200  # setup_cache runs every selected cell: the full matrix takes tens of minutes

    def setup_cache(self) -> dict[str, Any]:
        from rlbench.bench.matrix import replay_loop_cells, run_cells

        return run_cells(replay_loop_cells(), selection())

    def setup(self, cache: dict[str, Any], *cell: str) -> None:
        self.metrics = lookup(cache, Cell(*cell).label)

    def track_env_steps_per_s(self, cache, *cell) -> float:
        return self.metrics["env_steps_per_s"]

    track_env_steps_per_s.unit = "env steps/s"

    def track_updates_per_s(self, cache, *cell) -> float:
        return self.metrics["updates_per_s"]

    track_updates_per_s.unit = "updates/s"

    def track_sample_latency_p99(self, cache, *cell) -> float:
        return self.metrics["sample_p99_us"]

    track_sample_latency_p99.unit = "us"

    def track_time_to_threshold(self, cache, *cell) -> float:
        """Seconds to the workload's short-run return threshold (NaN: not reached within the budget)."""
        return self.metrics["time_to_threshold_s"]

    track_time_to_threshold.unit = "s"


class Tabular:
    """Q-learning and SARSA (Taxi-v3), online; they use no replay memory and no transport."""

    params = [list(TABULAR_ALGORITHMS), list(PLACEMENTS), list(COMPUTES)]
    param_names = ["algo", "placement", "compute"]
    timeout = 1800

    def setup_cache(self) -> dict[str, Any]:
        from rlbench.bench.matrix import run_cells, tabular_cells

        return run_cells(tabular_cells(), selection())

    def setup(self, cache: dict[str, Any], algo: str, placement: str, compute: str) -> None:
        from rlbench.bench.matrix import tabular_cells

        (cell,) = tabular_cells([algo], [placement], [compute])
        self.metrics = lookup(cache, cell.label)

    def track_env_steps_per_s(self, cache, algo, placement, compute) -> float:
        return self.metrics["env_steps_per_s"]

    track_env_steps_per_s.unit = "env steps/s"

    def track_updates_per_s(self, cache, algo, placement, compute) -> float:
        return self.metrics["updates_per_s"]

    track_updates_per_s.unit = "updates/s"

    def track_time_to_threshold(self, cache, algo, placement, compute) -> float:
        """Seconds to the workload's short-run return threshold (NaN: not reached within the budget)."""
        return self.metrics["time_to_threshold_s"]

    track_time_to_threshold.unit = "s"


class Workloads:
    """The jobs at their real sizes: DQN on MinAtar and Atari frames (the CNN; frames stored once, sent
    once), DDPG on a MuJoCo body; each workload's budget, settings and why it has no return threshold
    are in rlbench.bench.matrix.WORKLOADS."""

    params = [list(REAL_WORKLOADS), list(PLACEMENTS), list(TRANSPORTS), list(REPLAYS), list(COMPUTES)]
    param_names = ["workload", "placement", "transport", "replay", "compute"]
    timeout = 14400  # setup_cache runs every selected cell: in full, ~200 runs of 10-40 s each here

    def setup_cache(self) -> dict[str, Any]:
        from rlbench.bench.matrix import replay_loop_cells, run_cells

        return run_cells(replay_loop_cells(REAL_WORKLOADS), selection())

    def setup(self, cache: dict[str, Any], *cell: str) -> None:
        self.metrics = lookup(cache, Cell(*cell).label)

    def track_env_steps_per_s(self, cache, *cell) -> float:
        return self.metrics["env_steps_per_s"]

    track_env_steps_per_s.unit = "env steps/s"

    def track_updates_per_s(self, cache, *cell) -> float:
        return self.metrics["updates_per_s"]

    track_updates_per_s.unit = "updates/s"

    def track_sample_latency_p99(self, cache, *cell) -> float:
        return self.metrics["sample_p99_us"]

    track_sample_latency_p99.unit = "us"

    def track_time_to_threshold(self, cache, *cell) -> float:
        """Seconds to the workload's short-run return threshold: NaN where it has none (its no_threshold says
        why: these budgets end before the reference settings start learning) or did not reach it."""
        return self.metrics["time_to_threshold_s"]

    track_time_to_threshold.unit = "s"
