"""How the planner reads a real run: its steady rate, how far that rate spreads, what each role spent,
and whether someone else's work was on the machine meanwhile. Calibration runs (`profile`) and
validation runs (`validation`) both read runs here, so the profile's figures and the validation's
measured column are the same measurement.

The steady window. A replay-loop run has three phases: start-up (processes, imports, connections),
warm-up (the actors fill the memory up to ``learning_starts`` with no learner at work, then run
ahead of it by the rate limiter's slack, ``insert_lead`` transitions) and the steady state, where
actors and learner move at the pace of the slower. Only the last is what a mapping sustains, and
what the model predicts. (A result's own ``steady_*`` rates run from the first env step to the
last: start-up is out, but warm-up and slack are in, which makes a short run look faster than the
mapping is, the more so the more actors fill the slack.) Its rate is the least-squares slope of env steps over wall time through the
episodes that ended in it (`steady_rate`): every episode end is a (step, time) sample, a slope uses
all of them, and a distributed run's actors, whose clocks start a few hundred milliseconds apart,
only shift their samples along the time axis, which a slope through all of them barely feels. The
run's spread is the larger of the slope's standard error relative to the rate (few episodes, actors'
clocks that disagree) and the half difference of the two halves' rates relative to their mean (a
rate that changed within the window). Repeated runs (`combine`) add their half range.

Only the standard library: this module is imported where torch must not be.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

STRETCHES = 4  # consecutive timings are cut into this many stretches; their medians' half range is the spread
SETTLE = 0.1  # share of the steps after warm-up left out while actors and learner settle
MIN_POINTS = 6  # episode ends a steady window needs for a rate and its spread (three in each half)


@dataclass(frozen=True)
class Steady:
    """A run's rate in its steady window, measured."""

    rate: float  # env steps/s (least-squares slope over the window)
    spread: float  # relative: the slope's standard error, or its halves' difference, the larger
    start_step: int
    steps: int  # env steps inside the window
    seconds: float  # the window's length
    episodes: int


def _slope(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """(least-squares slope of step over time through (step, time) points, its standard error)."""
    n = len(points)
    if n < 3:
        return None
    mean_t = sum(t for _, t in points) / n
    mean_s = sum(s for s, _ in points) / n
    variance = sum((t - mean_t) ** 2 for _, t in points)
    if variance <= 0:
        return None
    slope = sum((t - mean_t) * (s - mean_s) for s, t in points) / variance
    residuals = sum((s - mean_s - slope * (t - mean_t)) ** 2 for s, t in points)
    return slope, (residuals / (n - 2) / variance) ** 0.5


def window_start(warm_up_steps: float, total_steps: int) -> int:
    """The first env step of the steady window: warm-up over, plus SETTLE of what follows."""
    warm_up = min(float(total_steps), max(0.0, warm_up_steps))
    return int(warm_up + SETTLE * (total_steps - warm_up))


def steady_rate(result: dict[str, Any], start_step: int, end_step: float = float("inf")) -> Steady | None:
    """The run's env steps/s over the episodes that ended from `start_step` to `end_step` (None: too
    few episodes for a rate and its spread)."""
    points = sorted((float(p["step"]), float(p["time_s"])) for p in result.get("learning_curve") or []
                    if start_step <= p["step"] <= end_step)
    if len(points) < MIN_POINTS:
        return None
    fitted = _slope(points)
    if fitted is None or fitted[0] <= 0:
        return None
    rate, error = fitted
    spread = error / rate
    half = len(points) // 2
    first, second = _slope(points[:half]), _slope(points[half:])
    if first is not None and second is not None and first[0] > 0 and second[0] > 0:
        spread = max(spread, abs(first[0] - second[0]) / (first[0] + second[0]))
    times = [t for _, t in points]
    return Steady(rate, spread, int(points[0][0]), int(points[-1][0] - points[0][0]), max(times) - min(times),
                  len(points))


def enough(rates: list[tuple[float | None, str]], minimum: int, most: int, agreement: float) -> bool:
    """Whether repeated runs, each (its rate or None, what disturbed it or ""), are enough: `minimum`
    undisturbed ones that agree within `agreement` ((max - min) / median), or `most` runs in all.
    Someone else's load on a shared machine comes and goes: a disturbed run is run again rather than
    averaged in. Any `minimum` of the runs may be the ones that agree: where a third run agrees with
    one of two that did not, the median of the three is one of the pair, whatever the third was."""
    if len(rates) >= most:
        return True
    quiet = sorted(rate for rate, disturbed in rates if rate is not None and not disturbed)
    return any(combine(quiet[i:i + minimum])[1] <= agreement / 2 for i in range(len(quiet) - minimum + 1))


def kept(runs: list[dict[str, Any]], rate: str = "rate") -> list[dict[str, Any]]:
    """The runs a figure is made of: the measured undisturbed ones, or all measured where none was."""
    measured = [run for run in runs if run.get(rate) is not None]
    quiet = [run for run in measured if not run.get("contended")]
    return quiet or measured


def combine(values: list[float]) -> tuple[float, float]:
    """(median, relative half range) of repeated measurements of one figure."""
    middle = statistics.median(values)
    return middle, ((max(values) - min(values)) / 2 / middle if middle and len(values) > 1 else 0.0)


# ------------------------------------------------------------------------------- the machine
def contention(state: dict[str, Any] | None) -> str:
    """"" when nobody else used the machine while it measured; else what did. Our own processes
    outnumbering the cores is not contention here: it is the mapping's own work, which the model
    accounts for (its CPU bound). Judged with rlbench.machine_state's thresholds."""
    from rlbench.machine_state import CONTENDED_OTHER_CORES, CONTENDED_STEAL

    if not state:
        return ""
    reasons = []
    others = state.get("other_processes_cores")
    if others is not None and others > CONTENDED_OTHER_CORES:
        reasons.append(f"other processes used {others:.2f} cores")
    steal = state.get("steal_fraction")
    if steal is not None and steal > CONTENDED_STEAL:
        reasons.append(f"{steal:.0%} of the CPU was stolen by the hypervisor")
    return "; ".join(reasons)


def machine_note(state: dict[str, Any] | None) -> str:
    """One short cell for a table: quiet, or contended and by how much; the load beside it."""
    if not state:
        return "-"
    load = state.get("load_before")
    others = state.get("other_processes_cores")
    word = "contended" if contention(state) else "quiet"
    return word + (f", others {others:.2f} cores" if others is not None else "") + \
        (f", load {load[0]:.2f}" if load else "")


# ---------------------------------------------------------------------------- what roles spent
def _per(total: float | None, count: float) -> float | None:
    return None if total is None or count <= 0 else total / count * 1e6


def role_costs(result: dict[str, Any]) -> dict[str, Any]:
    """Microseconds each role spent per unit of its work, from the run's time splits: the learner
    per update (its compute, its sends of weights, its own loop, its CPU), each actor and the replay
    node per env step (CPU), and the node's CPU per second of the run (its polling while idle)."""
    loop = result.get("loop") or {}
    splits, roles = loop.get("time_split") or {}, loop.get("roles") or {}
    throughput = result["throughput"]
    costs: dict[str, Any] = {}
    learner = splits.get("learner")
    updates = (roles.get("learner") or {}).get("updates") or throughput["updates"]
    if learner and updates:
        costs["learner"] = {"compute_us": _per(learner.get("learner"), updates),
                            "wait_us": _waits_us(result.get("latency") or {}),
                            "allreduce_us": _per(learner.get("allreduce"), updates),
                            "weights_us": _per(learner.get("weights"), updates),
                            "loop_us": _per(learner.get("bookkeeping"), updates),
                            "cpu_us": _per(learner.get("cpu_s", (roles.get("learner") or {}).get("cpu_s")), updates)}
    actors = [(split, roles.get(name) or {}) for name, split in splits.items() if name.startswith("actor-")]
    produced = sum(role.get("produced", 0) for _, role in actors)
    if actors and produced:
        cpu = [split.get("cpu_s", role.get("cpu_s")) for split, role in actors]
        costs["actors"] = {"cpu_us": _per(sum(cpu), produced) if None not in cpu else None,
                           "weights_us": _per(sum(split.get("weights", 0.0) for split, _ in actors), produced)}
    node = splits.get("replay")
    steps = throughput["env_steps"]
    if node and steps:
        cpu = node.get("cpu_s", (roles.get("replay") or {}).get("cpu_s"))
        costs["node"] = {"cpu_us": _per(cpu, steps), "memory_us": _per(node.get("replay"), steps),
                         "cores": cpu / node["window_s"] if cpu is not None and node.get("window_s") else None}
    return costs


def _waits_us(latency: dict[str, Any]) -> float | None:
    """The learner's wait for each batch (SAMPLE's round trip, or the push it waits for) and its
    priority send, per update, in microseconds: their means, the first batch's wait left out (it
    spans the start-up and the warm-up, not an update's)."""
    sample = latency.get("replay.SAMPLE") or {}
    count = sample.get("count") or 0
    if count < 2 or sample.get("mean") is None or sample.get("max") is None:
        return None
    priorities = latency.get("replay.UPDATE_PRIORITIES") or {}
    return (sample["mean"] * count - sample["max"]) / (count - 1) + (priorities.get("mean") or 0.0)


def flat_role_costs(result: dict[str, Any]) -> dict[str, float]:
    """`role_costs` as flat names (learner_compute_us, actor_cpu_us, node_cores, ...), measured ones only."""
    return {f"{role}_{name}": value for role, figures in role_costs(result).items()
            for name, value in figures.items() if value is not None}
