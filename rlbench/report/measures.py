"""The per-run numbers a study compares, each labelled measured or modelled, and their estimates
over seeds (IQM with a 95 % stratified bootstrap interval; strata are environments)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from rlbench.report.collect import Combination, Group, Run


@dataclass(frozen=True)
class Measure:
    key: str
    label: str
    unit: str
    higher_is_better: bool
    read: Callable[[Run, Group], float]  # NaN: not measured in this run
    kind: str = "measured"
    digits: int = 1


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan


def _at(data: dict[str, Any], *path: str) -> Any:
    for part in path:
        if not isinstance(data, dict):
            return None
        data = data.get(part)
    return data


def time_to_target(run: Run, group: Group) -> float:
    """Seconds until the mean return of the last `target_window` training episodes first reached the
    study's target; +inf when it never did (censored), NaN without a target."""
    from rlbench.bench.matrix import time_to_threshold

    if group.target_return is None:
        return math.nan
    curve = [p for p in run.data.get("learning_curve") or [] if isinstance(p, dict)
             and not math.isnan(_number(p.get("return"))) and not math.isnan(_number(p.get("time_s")))]
    seconds = time_to_threshold(curve, group.target_return, group.target_window) if curve else math.nan
    return math.inf if math.isnan(seconds) else seconds


def _steady(run: Run, group: Group) -> float:
    value = _number(_at(run.data, "throughput", "steady_env_steps_per_s"))
    return value if not math.isnan(value) else _number(_at(run.data, "loop", "steady_env_steps_per_s"))


def _energy_meters(group: Group) -> list[str]:
    """Meters that measured joules (kind "measured") in some run of the study."""
    names: list[str] = []
    for run in group.runs():
        for name, energy in (run.data.get("energy") or {}).items():
            if isinstance(energy, dict) and energy.get("kind") == "measured" and not math.isnan(_number(energy.get("joules"))):
                names.append(name)
    return list(dict.fromkeys(names))


def _joules(meter: str) -> Callable[[Run, Group], float]:
    def read(run: Run, group: Group) -> float:
        energy = _at(run.data, "energy", meter) or {}
        return _number(energy.get("joules")) if energy.get("kind") == "measured" else math.nan

    return read


def _joules_to_target(meter: str) -> Callable[[Run, Group], float]:
    """The run's measured joules pro-rated to the time it took to reach the target (constant power
    over the run assumed; the meters give one total per run)."""

    def read(run: Run, group: Group) -> float:
        joules = _joules(meter)(run, group)
        wall = _number(_at(run.data, "timing", "wall_s"))
        seconds = time_to_target(run, group)
        if math.isnan(joules) or math.isnan(seconds) or not wall > 0:
            return math.nan
        return math.inf if math.isinf(seconds) else joules * seconds / wall

    return read


def measures(group: Group) -> list[Measure]:
    """The measures this study has data for, in table order."""
    candidates = [
        Measure("env_steps_per_s", "env steps/s", "steps/s", True,
                lambda r, g: _number(_at(r.data, "throughput", "env_steps_per_s")), digits=0),
        Measure("steady_env_steps_per_s", "steady env steps/s", "steps/s", True, _steady, digits=0),
        Measure("updates_per_s", "updates/s", "updates/s", True,
                lambda r, g: _number(_at(r.data, "throughput", "updates_per_s")), digits=0),
        Measure("final_return", "final greedy return", "return", True,
                lambda r, g: _number(_at(r.data, "evaluation", "mean_return")), digits=1),
    ]
    if group.target_return is not None:
        candidates.append(Measure("time_to_target_s", f"time to return {group.target_return:g} (s)", "s", False,
                                  time_to_target, digits=1))
    for meter in _energy_meters(group):
        candidates.append(Measure(f"energy_{meter}_j", f"energy, {meter} (J)", "J", False, _joules(meter), digits=0))
        if group.target_return is not None:
            candidates.append(Measure(f"energy_to_target_{meter}_j", f"energy to target, {meter} (J, pro-rated)", "J",
                                      False, _joules_to_target(meter), digits=0))
    runs = group.runs()
    return [m for m in candidates if any(not math.isnan(m.read(run, group)) for run in runs)]


def modelled_measures(group: Group) -> list[Measure]:
    """Every number under the runs' "modelled" blocks: model predictions, never mixed with the measured."""
    keys: list[tuple[str, ...]] = []

    def walk(block: Any, path: tuple[str, ...]) -> None:
        if isinstance(block, dict):
            for key, value in block.items():
                walk(value, (*path, str(key)))
        elif not math.isnan(_number(block)):
            keys.append(path)

    for run in group.runs():
        walk(run.data.get("modelled") or {}, ())
    return [Measure("modelled." + ".".join(path), " ".join(path), "", True,
                    lambda r, g, path=path: _number(_at(r.data, "modelled", *path)), kind="modelled", digits=3)
            for path in dict.fromkeys(keys)]


def values(measure: Measure, combination: Combination, group: Group) -> list[list[float]]:
    """The measure's values of a combination's complete runs, one list per environment (stratum)."""
    strata: dict[str, list[float]] = {}
    for run in combination.runs:
        env = str(_at(run.data, "config", "env"))
        strata.setdefault(env, []).append(measure.read(run, group))
    return list(strata.values())


def estimate(measure: Measure, combination: Combination, group: Group):
    from rlbench.report.stats import interval

    return interval(values(measure, combination, group))


def flat(measure: Measure, combination: Combination, group: Group) -> list[float]:
    return [v for stratum in values(measure, combination, group) for v in stratum]
