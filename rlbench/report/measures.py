"""The per-run numbers a study compares, each labelled measured or modelled, and their estimates
over seeds (IQM with a 95 % stratified bootstrap interval; strata are environments).

Reaching the target is sustained, not a lucky moment. A run reaches the study's target return (one
for every environment, or one per environment) at the first of TARGET_EVALUATIONS consecutive points
of its evaluation curve (`--eval-every`: greedy episodes) whose mean return each reaches it, when every
run of the study has an evaluation curve (a seed scoring 0.75 and then 0.00 against a target of 0.7
has not reached it); otherwise at the first training episode where the mean return of the last
`target_window` episodes reaches it. `target_rule` says which, in words. The same
point gives every clock: env steps, learner updates (recorded by evaluation points only), training
wall time and CPU time (recorded by evaluation points; pro-rated from the run's totals on the
training curve), and from them energy and money. A run that never reached it counts as +inf.
"""

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
    clock: str = ""  # what a to-target measure counts: "env steps", "wall clock", ...


def decimals(digits: int, *values: float) -> int:
    """Decimals to print `values` with: the measure's own, or more when the smallest of them would
    otherwise show fewer than 2 significant digits (USD to the target: 0.00012, not 0.0000)."""
    small = [abs(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v) and v != 0]
    if not small:
        return digits
    return max(digits, min(10, 1 - math.floor(math.log10(min(small)))))


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan


def _at(data: dict[str, Any], *path: str) -> Any:
    for part in path:
        if not isinstance(data, dict):
            return None
        data = data.get(part)
    return data


# ------------------------------------------------------------------------------------ the target
TARGET_EVALUATIONS = 3  # consecutive evaluation points at or above the target: reached, not touched once


@dataclass(frozen=True)
class Reach:
    """Where a run first reached the target, on every clock (+inf: never; NaN: not recorded)."""

    step: float
    updates: float
    time_s: float
    cpu_s: float
    cpu_pro_rated: bool


NOT_MEASURED = Reach(math.nan, math.nan, math.nan, math.nan, False)
NEVER = Reach(math.inf, math.inf, math.inf, math.inf, False)


def evaluation_points(run: Run) -> list[dict[str, Any]]:
    points = _at(run.data, "evaluation_curve", "points") or []
    return [p for p in points if isinstance(p, dict) and not math.isnan(_number(p.get("return")))
            and not math.isnan(_number(p.get("step")))]


def target_curve(group: Group) -> str:
    """"evaluation" when every run of the study has an evaluation curve, else "training"."""
    runs = group.runs()
    return "evaluation" if runs and all(evaluation_points(run) for run in runs) else "training"


def _training_totals(run: Run) -> tuple[float, float]:
    """(training wall s, training CPU s): the run's, less what --eval-every's evaluations took."""
    timing = run.data.get("timing") or {}
    wall = _number(timing.get("wall_s")) - (_number(timing.get("evaluating_s")) if timing.get("evaluating_s") else 0.0)
    cpu = _number(timing.get("cpu_s")) - (_number(timing.get("evaluating_cpu_s")) if timing.get("evaluating_cpu_s") else 0.0)
    return wall, cpu


def reach(run: Run, group: Group) -> Reach:
    from rlbench.bench.matrix import time_to_threshold

    target = group.target_for(run.env)
    if target is None:
        return NOT_MEASURED
    if target_curve(group) == "evaluation":
        points = evaluation_points(run)
        above = [_number(p.get("return")) >= target for p in points]
        for index, point in enumerate(points):
            streak = above[index:index + TARGET_EVALUATIONS]  # a curve that ends mid-streak has not sustained it
            if len(streak) == TARGET_EVALUATIONS and all(streak):
                return Reach(_number(point["step"]), _number(point.get("updates")), _number(point.get("time_s")),
                             _number(point.get("cpu_s")), False)
        return NEVER
    curve = [p for p in run.data.get("learning_curve") or [] if isinstance(p, dict)
             and not math.isnan(_number(p.get("return"))) and not math.isnan(_number(p.get("time_s")))]
    if not curve:
        return NOT_MEASURED
    seconds = time_to_threshold(curve, target, group.target_window)
    if math.isnan(seconds):
        return NEVER
    point = next(p for p in curve if _number(p["time_s"]) == seconds)
    wall, cpu = _training_totals(run)
    cpu_s = cpu * seconds / wall if wall > 0 else math.nan  # constant utilisation over the run assumed
    return Reach(_number(point.get("step")), math.nan, seconds, cpu_s, True)


def target_rule(group: Group) -> str:
    """When a run of this study counts as having reached its target, in words for the report and compare."""
    if target_curve(group) == "evaluation":
        return (f"reached at the first of {TARGET_EVALUATIONS} consecutive evaluation points (--eval-every) whose "
                "greedy return each reaches it (sustained: one good evaluation is not enough)")
    return (f"reached when the mean of the last {group.target_window} training episodes first reaches it (no "
            "evaluation curve in every run: updates to target unmeasured, CPU time pro-rated)")


def time_to_target(run: Run, group: Group) -> float:
    return reach(run, group).time_s


# ------------------------------------------------------------------------------------ normalised
def normalised_score(run: Run, group: Group) -> float:
    """(final greedy return - random) / (reference - random) for the run's environment; NaN when
    the environment has no scores (add them under [sweep.reference_scores])."""
    scores = group.reference_scores.get(run.env)
    value = _number(_at(run.data, "evaluation", "mean_return"))
    if scores is None or math.isnan(value):
        return math.nan
    return (value - scores.random) / (scores.reference - scores.random)


def normalisation(group: Group) -> tuple[str, str]:
    """(what the study's normalised scores are called, what their 1 is): ("human-normalised", "human")
    when every environment is an Atari game scored by the shipped random and human scores (Agarwal et
    al.'s Atari aggregates), else ("normalised", "reference"): 0 is a uniform random policy's score either way."""
    from rlbench.builtin.reference_scores import ATARI_SOURCE

    envs = group.envs()
    if envs and all(env in group.reference_scores and group.reference_scores[env].source.startswith(ATARI_SOURCE)
                    for env in envs):
        return "human-normalised", "human"
    return "normalised", "reference"


def unscored_envs(group: Group) -> list[str]:
    return [env for env in group.envs() if env not in group.reference_scores]


# ------------------------------------------------------------------------------------------ cost
def _steady(run: Run, group: Group) -> float:
    value = _number(_at(run.data, "throughput", "steady_env_steps_per_s"))
    return value if not math.isnan(value) else _number(_at(run.data, "loop", "steady_env_steps_per_s"))


def energy_meters(group: Group) -> tuple[list[str], dict[str, str]]:
    """(meters that measured joules in some run of the study, {meter: why absent} for the others)."""
    measured: list[str] = []
    absent: dict[str, str] = {}
    for run in group.runs():
        for name, energy in (run.data.get("energy") or {}).items():
            if not isinstance(energy, dict):
                continue
            if energy.get("kind") == "measured" and not math.isnan(_number(energy.get("joules"))):
                measured.append(name)
            else:
                absent.setdefault(name, str(energy.get("reason") or "not measured"))
    measured = list(dict.fromkeys(measured))
    return measured, {k: v for k, v in absent.items() if k not in measured}


def _joules(meter: str) -> Callable[[Run, Group], float]:
    def read(run: Run, group: Group) -> float:
        energy = _at(run.data, "energy", meter) or {}
        return _number(energy.get("joules")) if energy.get("kind") == "measured" else math.nan

    return read


def _joules_to_target(meter: str) -> Callable[[Run, Group], float]:
    """The run's measured joules pro-rated to the training time it took to reach the target
    (constant power over the run assumed; the meters give one total per run)."""

    def read(run: Run, group: Group) -> float:
        joules = _joules(meter)(run, group)
        seconds = reach(run, group).time_s
        wall = _number(_at(run.data, "timing", "wall_s"))
        if math.isnan(joules) or math.isnan(seconds) or not wall > 0:
            return math.nan
        return math.inf if math.isinf(seconds) else joules * seconds / wall

    return read


def priced_devices(run: Run) -> list[str]:
    """What a run pays for: "cpu" (its CPU time), and each component a plugin runs on a device of
    its own (compute gpu, replay fpga, ...), held for the run's wall time."""
    devices = ["cpu"]
    for component in (run.data.get("components") or {}).values():
        if isinstance(component, dict) and component.get("plugin") not in (None, "builtin") \
                and component.get("name") not in devices:
            devices.append(str(component["name"]))
    return devices


def dollars_to_target(run: Run, group: Group) -> float:
    """USD to reach the target: CPU-seconds x the cpu price per hour, plus training seconds x the
    price per hour of each other device the run used; NaN when one of them has no --price."""
    where = reach(run, group)
    if math.isnan(where.cpu_s) or math.isnan(where.time_s):
        return math.nan
    if math.isinf(where.time_s):
        return math.inf
    total = 0.0
    for device in priced_devices(run):
        if device not in group.prices:
            return math.nan
        seconds = where.cpu_s if device == "cpu" else where.time_s
        total += seconds / 3600.0 * group.prices[device]
    return total


def unpriced_devices(group: Group) -> list[str]:
    return list(dict.fromkeys(d for run in group.runs() for d in priced_devices(run) if d not in group.prices))


# ------------------------------------------------------------------------------------- the list
DEFAULT_VERDICT = "steps_to_target"  # sample efficiency: what the verdict is about unless a table says otherwise


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
    if len(group.envs()) > 1 and not unscored_envs(group):
        candidates.append(Measure("normalised_score", f"{normalisation(group)[0]} final score", "", True,
                                  normalised_score, digits=2))
    if group.has_target:
        to = group.target_text()
        pro_rated = " (pro-rated)" if target_curve(group) == "training" else ""
        candidates += [
            Measure("steps_to_target", f"env steps to {to}", "env steps", False,
                    lambda r, g: reach(r, g).step, digits=0, clock="env steps"),
            Measure("updates_to_target", f"updates to {to}", "updates", False,
                    lambda r, g: reach(r, g).updates, digits=0, clock="learner updates"),
            Measure("time_to_target_s", f"wall time to {to} (s)", "s", False,
                    lambda r, g: reach(r, g).time_s, digits=1, clock="wall clock"),
            Measure("cpu_to_target_s", f"CPU-seconds to {to}{pro_rated}", "CPU s", False,
                    lambda r, g: reach(r, g).cpu_s, digits=1, clock="CPU time"),
        ]
        if group.prices:
            candidates.append(Measure("dollars_to_target", f"USD to {to}", "USD", False, dollars_to_target,
                                      digits=4, clock="money"))
    measured, _ = energy_meters(group)
    for meter in measured:
        candidates.append(Measure(f"energy_{meter}_j", f"energy, {meter} (J)", "J", False, _joules(meter), digits=0))
        if group.has_target:
            candidates.append(Measure(f"energy_to_target_{meter}_j", f"energy to target, {meter} (J, pro-rated)", "J",
                                      False, _joules_to_target(meter), digits=0, clock="energy"))
    runs = group.runs()
    return [m for m in candidates if any(not math.isnan(m.read(run, group)) for run in runs)]


# Every measure key a study can have, whatever its results hold: what --ci-measure is checked against
# before a sweep runs (`measures` lists those a study's results actually have).
MEASURE_KEYS = ("env_steps_per_s", "steady_env_steps_per_s", "updates_per_s", "final_return", "normalised_score")
TARGET_KEYS = ("steps_to_target", "updates_to_target", "time_to_target_s", "cpu_to_target_s", "dollars_to_target")
PATTERN_KEYS = ("energy_METER_j", "energy_to_target_METER_j", "modelled.NAME")


def check_measure_key(key: str, *, has_target: bool, option: str = "--ci-measure") -> None:
    """Refuse a measure key no study could have (with the close match), or a to-target one without a target."""
    import difflib
    import re

    from rlbench.errors import RlbenchError

    if key in MEASURE_KEYS or key.startswith("modelled.") or re.fullmatch(r"energy_(to_target_)?\w+_j", key):
        if key.startswith("energy_to_target_") and not has_target:
            raise RlbenchError(f"{option} {key}: a to-target measure, and the study has no target_return (--target)")
        return
    if key in TARGET_KEYS:
        if not has_target:
            raise RlbenchError(f"{option} {key}: a to-target measure, and the study has no target_return (--target)")
        return
    known = [*MEASURE_KEYS, *TARGET_KEYS]
    close = difflib.get_close_matches(key, known, n=1)
    raise RlbenchError(f"{option} {key!r} is not a measure" + (f"; did you mean {close[0]!r}?" if close else
                                                                f" (measures: {', '.join(known + list(PATTERN_KEYS))})"))


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
        strata.setdefault(run.env, []).append(measure.read(run, group))
    return list(strata.values())


def paired_values(measure: Measure, a: Combination, b: Combination, group_a: Group,
                  group_b: Group) -> tuple[list[list[float]], list[list[float]]]:
    """Both combinations' values on the environments both ran, in the same order (the tasks of a
    probability of improvement)."""
    left: dict[str, list[float]] = {}
    right: dict[str, list[float]] = {}
    for run in a.runs:
        left.setdefault(run.env, []).append(measure.read(run, group_a))
    for run in b.runs:
        right.setdefault(run.env, []).append(measure.read(run, group_b))
    envs = [env for env in left if env in right]
    return [left[env] for env in envs], [right[env] for env in envs]


def estimate(measure: Measure, combination: Combination, group: Group):
    from rlbench.report.stats import interval

    return interval(values(measure, combination, group))


def flat(measure: Measure, combination: Combination, group: Group) -> list[float]:
    return [v for stratum in values(measure, combination, group) for v in stratum]
