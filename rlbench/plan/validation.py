"""Prove the prediction: run mappings for real, for a short budget, and set measured beside predicted.

What is compared. Replay-loop algorithms: env steps/s over the run as the runtime reports its
steady state (`throughput.steady_env_steps_per_s`, else `loop.steady_env_steps_per_s`: first to last
INSERT at the replay node), else from the learning curve (first to last episode end, the same
window for a local run), else the whole run's rate; the prediction is `model.run_average` over the
steps the run made, its warm-up before `learning_starts` included, since that window includes it.
Offline tabular learning: updates/s of `fit_offline` (its own timed span, dataset loading
excluded; the median of OFFLINE_REPEATS runs), predicted as what runs here; a backend's modelled hardware time is printed beside it
and never validated (no hardware here).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rlbench.plan.model import Mapping, Prediction, insert_lead, run_average, with_actors
from rlbench.plan.planner import Plan, Row

OFFLINE_REPEATS = 5


@dataclass
class Check:
    mapping: Mapping
    prediction: Prediction
    rank: int | None  # None: the default mapping, not among the top K
    predicted: float | None = None  # the figure compared (env steps/s, or updates/s offline)
    measured: float | None = None
    measured_updates_per_s: float | None = None
    status: str = ""
    steps: int = 0
    machine: dict[str, Any] = field(default_factory=dict)  # the run's machine state (contended or quiet)

    @property
    def error(self) -> float | None:
        """(predicted - measured) / measured."""
        if self.predicted is None or not self.measured:
            return None
        return (self.predicted - self.measured) / self.measured


def _curve_rate(result: dict[str, Any]) -> float | None:
    points = result.get("learning_curve") or []
    if len(points) < 2 or points[-1]["time_s"] <= points[0]["time_s"]:
        return None
    return (points[-1]["step"] - points[0]["step"]) / (points[-1]["time_s"] - points[0]["time_s"])


def measured_rates(result: dict[str, Any]) -> tuple[float | None, float | None]:
    """(env steps/s, updates/s) a run achieved, as defined in this module's docstring."""
    throughput, loop = result["throughput"], result.get("loop") or {}
    if loop.get("mode") == "offline":
        fit = (result.get("latency") or {}).get("learner.fit_offline") or {}
        seconds = fit.get("mean", 0.0) * 1e-6
        return None, throughput["updates"] / seconds if seconds > 0 else None
    env = (throughput.get("steady_env_steps_per_s") or loop.get("steady_env_steps_per_s") or _curve_rate(result)
           or throughput["env_steps_per_s"])
    updates = throughput.get("steady_updates_per_s") or loop.get("steady_updates_per_s")
    if updates is None and throughput["env_steps"]:
        updates = throughput["updates"] * env / throughput["env_steps"]  # the same window as env steps
    return env, updates


def validation_rows(plan: Plan, k: int) -> list[tuple[Row, int | None]]:
    """The top k mappings on this host, and the default mapping (rank None when not among them)."""
    here = [row for row in plan.rows if row.mapping.host == plan.this_host]
    chosen = [(row, row.rank) for row in here[:k]]
    if plan.default is not None and all(row is not plan.default for row, _ in chosen):
        chosen.append((plan.default, None))
    return chosen


def run_check(plan: Plan, row: Row, rank: int | None, *, seconds: float) -> Check:
    """Run one mapping: a replay-loop job for its warm-up plus `seconds` of learning (by the
    prediction); an offline one over its dataset OFFLINE_REPEATS times, keeping the median run (a
    fit lasts milliseconds: one run is mostly noise); with no evaluation episodes."""
    import rlbench

    mapping, prediction = row.mapping, row.prediction
    check = Check(mapping, prediction, rank)
    budget: dict[str, Any] = {"eval_episodes": 0, "seed": 0}
    learning_starts = plan.schedule.learning_starts
    if prediction.env_steps_per_s is not None:
        steps = int(max(learning_starts, plan.schedule.batch_size) + prediction.env_steps_per_s * seconds)
        budget.update(steps=steps, seconds=max(60.0, 6 * seconds))
    runs = [rlbench.run(mapping.config(**budget)) for _ in range(1 if prediction.env_steps_per_s is not None
                                                                 else OFFLINE_REPEATS)]
    result = sorted(runs, key=lambda r: measured_rates(r)[1] or 0.0)[len(runs) // 2]  # the median run
    check.status = result["status"] + (f" ({result['status_reason']})" if result.get("status_reason") else "")
    check.steps = result["throughput"]["env_steps"]
    check.machine = result.get("machine_state") or {}
    env, updates = measured_rates(result)
    check.measured_updates_per_s = updates
    if prediction.env_steps_per_s is None:
        check.predicted, check.measured = prediction.updates_per_s, updates
    else:
        check.predicted = run_average(prediction, check.steps, max(learning_starts, plan.schedule.batch_size),
                                      insert_lead(mapping, plan.schedule))
        check.measured = env
    return check


def validate(plan: Plan, k: int, *, seconds: float = 5.0, progress: Callable[[str], None] = lambda line: None) -> list[Check]:
    checks = []
    for row, rank in validation_rows(plan, k):
        check = run_check(plan, row, rank, seconds=seconds)
        progress(f"ran {'#' + str(rank) if rank else 'default'} {row.mapping.label()}: predicted "
                 f"{_rate(check.predicted)}, measured {_rate(check.measured)}")
        checks.append(check)
    return checks


def summary(checks: list[Check]) -> dict[str, Any]:
    """Median absolute error, and how the first choice fared against the best measured."""
    errors = [abs(c.error) for c in checks if c.error is not None and math.isfinite(c.error)]
    measured = [c for c in checks if c.measured]
    first = next((c for c in checks if c.rank == 1), None)
    best = max(measured, key=lambda c: c.measured) if measured else None
    return {
        "validated": len(checks),
        "median_abs_error": statistics.median(errors) if errors else None,
        "max_abs_error": max(errors) if errors else None,
        "first_choice": first.mapping.label() if first else None,
        "best_measured": best.mapping.label() if best else None,
        "first_vs_best": (first.measured / best.measured) if first and best and first.measured else None,
    }


def sweep_actors(plan: Plan, mapping: Mapping, max_actors: int, *, seconds: float,
                 progress: Callable[[str], None] = lambda line: None) -> list[Check]:
    """Run `mapping`'s family at 1..max_actors actors: predicted beside measured."""
    by_actors = {row.mapping.actors: row for row in plan.rows if row.mapping.family == mapping.family}
    checks = []
    for actors in range(1, max_actors + 1):
        row = by_actors.get(actors)
        if row is None:
            continue
        check = run_check(plan, row, row.rank, seconds=seconds)
        progress(f"{with_actors(mapping, actors).label()}: predicted {_rate(check.predicted)}, "
                 f"measured {_rate(check.measured)}")
        checks.append(check)
    return checks


def _rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f}/s"
