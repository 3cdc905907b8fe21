"""Prove the prediction: run mappings for real, long enough for a steady window, and set what they
measured beside what the model predicted.

What is compared. Replay-loop algorithms: env steps/s in the run's steady window (rlbench.plan.measure:
after learning_starts and the rate limiter's slack, the least-squares rate through the episodes
that ended there, with the spread of its stretches), against the model's steady prediction. Each
run lasts its warm-up plus `seconds` of steady window at the predicted rate (a wall-clock cap
stops one that is far slower than predicted; its window is then what it ran). A mapping runs with
seeds seed, seed + 1, ... until `repeats` runs that no other process disturbed agree within
AGREEMENT, or `repeats` + EXTRA_RUNS runs in all (`measure.enough`), in rounds across the mappings
(`run_checks`: runs a round apart sample different stretches of the host's pace); the measured
figure is the median of the undisturbed ones (all, where none was), its spread the larger of their
half range and the windows' own: how far the measurement itself can be trusted.
Offline tabular learning: updates/s of `fit_offline` (its own timed span, dataset loading excluded;
the median of OFFLINE_REPEATS runs), predicted as what runs here; a backend's modelled hardware
time is printed beside it and never validated (no hardware here).

Against the default, in the same rounds. This host's pace drifts 15-20 % within minutes (docs/planner.md):
a run's absolute rate carries that drift, which no profile taken before can predict. So `validate`
runs the default mapping (`reference`) at the start of every round and once after the last, and
sets each run beside the default's rate at that moment (interpolated in time between the default's
runs before and after it): the mapping's measured ratio to the default, the median of its runs', is
set beside the predicted ratio (its prediction over the default's). The pace cancels in the ratio,
and ranking by predicted ratios is what the plan does: the summary's headline is the ratio error,
with how many pairs of mappings measured in the predicted order; the absolute error stays beside it.

Runs shorter than the job. A validation run waits for learning_starts before its steady window, at
most VALIDATION_LEARNING_STARTS env steps (an Atari preset's 80,000 would take ten minutes a run
here): the steady rate does not depend on it, except through how full the memory is when it is
sampled (the profile's micro figures are timed on 20,000 transitions at most, so a run's memory is
no fuller than what the model was measured on).

Which mappings. `validate`: the top K on this host and the default. `holdout`: N mappings drawn at
random (a seeded draw) from those the profile did not calibrate on and the top K did not include.
`first_choice_check`: the first choice and the default, for the same steps and seed, and the gain
measured beside the gain predicted. `policy_check`: `rlbench bench policies`' own runs of a
single learner and of N data-parallel learners, and the speed-up they measure beside the plan's.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from rlbench.plan import measure
from rlbench.plan.model import Mapping, Prediction, Schedule, warm_up_steps
from rlbench.plan.planner import Plan, Row, learner_gains

OFFLINE_REPEATS = 5
DEFAULT_SECONDS = 4.0  # steady window of a validation run, at the predicted rate
DEFAULT_REPEATS = 2  # undisturbed runs per mapping (seeds seed, seed + 1, ...) that agree within ...
AGREEMENT = 0.10  # ... (max - min) / median; more runs until they do, up to EXTRA_RUNS more
EXTRA_RUNS = 2
CAP_FACTOR = 12  # a run is stopped after this many times its planned duration (60 s at least)
MIN_STEADY_STEPS = 1_500  # env steps of steady window at least, unless they take longer than
MAX_STEADY_S = 12.0  # this at the predicted rate (an Atari job's ~50 env steps/s: 30 s a run, 12 s hold ~20 lives)
VALIDATION_LEARNING_STARTS = 2_000  # a run's warm-up in env steps at most (the job's learning_starts, capped)
# the learner's period per update, part by part: (part, the model's term, the run's time split; None:
# a run spreads the model's taking turns over the other parts)
LEARNER_PARTS = (("compute", "update", "compute_us"), ("wait", "waiting for the replay node", "wait_us"),
                 ("all-reduce", "all-reduce", "allreduce_us"), ("weights", "weight sends", "weights_us"),
                 ("loop", "loop", "loop_us"), ("turns", "taking turns on the cores", None))


@dataclass
class Check:
    mapping: Mapping
    prediction: Prediction
    rank: int | None  # None: not ranked among the top K (the default, or a holdout)
    kind: str = "top"  # "top", "default" or "holdout"
    predicted: float | None = None  # the figure compared (env steps/s, or updates/s offline)
    measured: float | None = None
    spread: float | None = None  # the measurement's relative spread
    measured_updates_per_s: float | None = None
    status: str = ""
    steps: int = 0
    window_s: float | None = None  # the steady window's length (of the median run)
    runs: list[float] = field(default_factory=list)  # each kept run's measured rate
    left_out: int = 0  # runs disturbed by other processes, left out for undisturbed ones
    machine: dict[str, Any] = field(default_factory=dict)  # the last run's machine state
    contended: str = ""  # what disturbed any of its runs
    # the learner's period per update: (part, predicted us, the median run's measured us) (`learner_split`)
    learner_split: list[tuple[str, float | None, float | None]] = field(default_factory=list)
    # against the default measured in the same rounds (`validate`'s reference), where it ran beside one
    reference: bool = False  # this is the default every run is set against
    predicted_ratio: float | None = None  # its prediction over the default's
    measured_ratio: float | None = None  # the median of its runs' rates over the default's at that time
    ratio_spread: float | None = None  # the half range of its runs' ratios, relative
    ratios: list[float] = field(default_factory=list)  # each kept run's ratio

    @property
    def error(self) -> float | None:
        """(predicted - measured) / measured."""
        if self.predicted is None or not self.measured:
            return None
        return (self.predicted - self.measured) / self.measured

    @property
    def ratio_error(self) -> float | None:
        """(predicted ratio - measured ratio) / measured ratio: the error with the host's pace cancelled."""
        if self.predicted_ratio is None or not self.measured_ratio:
            return None
        return (self.predicted_ratio - self.measured_ratio) / self.measured_ratio


def run_schedule(plan: Plan) -> Schedule:
    """The plan's schedule as validation runs it: its learning_starts at most VALIDATION_LEARNING_STARTS."""
    return replace(plan.schedule, learning_starts=min(plan.schedule.learning_starts, VALIDATION_LEARNING_STARTS))


def run_mapping(plan: Plan, mapping: Mapping) -> Mapping:
    """The mapping as a validation run runs it: the job's hyperparameters, its learning_starts shortened
    to `run_schedule`'s where that is shorter."""
    starts = run_schedule(plan).learning_starts
    if starts == plan.schedule.learning_starts:
        return mapping
    kept = tuple(item for item in mapping.hyperparameters if item[0] != "learning_starts")
    return replace(mapping, hyperparameters=tuple(sorted((*kept, ("learning_starts", starts)))))


def budget(plan: Plan, mapping: Mapping, prediction: Prediction, seconds: float) -> tuple[int, float]:
    """(env steps, warm-up steps) of a validation run: warm-up (`run_schedule`'s), then `seconds` of
    steady window at the predicted rate, and at least MIN_STEADY_STEPS (a prediction far too low
    still leaves a window with episodes in it) or MAX_STEADY_S of them, the fewer."""
    warm = warm_up_steps(mapping, run_schedule(plan))
    rate = prediction.env_steps_per_s
    steady = max(min(MIN_STEADY_STEPS, rate * MAX_STEADY_S), rate * seconds)
    return int(warm + steady / (1 - measure.SETTLE)), warm


@dataclass
class _Pending:
    """A check still being measured: what its runs need and the runs so far."""

    check: Check
    steps: int
    warm: float
    row: Row
    runs: list[dict[str, Any]] = field(default_factory=list)


def run_check(plan: Plan, row: Row, rank: int | None, *, seconds: float = DEFAULT_SECONDS, seed: int = 0,
              repeats: int = DEFAULT_REPEATS, steps: int | None = None, kind: str = "top") -> Check:
    """Run one mapping `repeats` times (seeds seed, seed + 1, ...; one more while they disagree): a
    replay-loop job for its warm-up plus `seconds` of steady window (or `steps`); an offline one
    OFFLINE_REPEATS times."""
    return run_checks(plan, [(row, rank, kind)], seconds=seconds, seed=seed, repeats=repeats, steps=steps)[0]


def run_checks(plan: Plan, rows: list[tuple[Row, int | None, str]], *, seconds: float = DEFAULT_SECONDS, seed: int = 0,
               repeats: int = DEFAULT_REPEATS, steps: int | None = None,
               progress: Callable[[str], None] = lambda line: None, reference: Row | None = None) -> list[Check]:
    """Run each (row, rank, kind) as `run_check` does, in rounds: a round runs once each mapping that
    still needs a run (`measure.enough`), in order. Rounds rather than each mapping's runs back to
    back, for the reason the profile calibrates in rounds: this host's pace moves by 20-30 % for a
    minute at a time (docs/planner.md), and two runs back to back sample the same stretch of it, so
    their agreement says little; runs a round apart sample different stretches, and a third run, when
    they disagree, outvotes the stretch that was off. `reference` (one of the rows): it runs first in
    every round that runs anything, and once after the last, and each run is set against it
    (`_set_against`: the measured ratio)."""
    cap = max(60.0, CAP_FACTOR * seconds)  # the wall-clock bound of every run
    checks: list[Check] = []
    pending: list[_Pending] = []
    for row, rank, kind in rows:
        check = Check(row.mapping, row.prediction, rank, kind, reference=row is reference)
        checks.append(check)
        if row.prediction.env_steps_per_s is None:
            _run_offline(check, seed)
            continue
        planned, warm = budget(plan, row.mapping, row.prediction, seconds)
        pending.append(_Pending(check, steps or planned, warm, row))
    anchor = next((item for item in pending if item.row is reference), None)
    for round_ in range(repeats + EXTRA_RUNS):
        due = [item for item in pending if not measure.enough([(r["rate"], r["contended"]) for r in item.runs],
                                                              repeats, repeats + EXTRA_RUNS, AGREEMENT)]
        if anchor is not None and any(item is not anchor for item in due):  # the round starts with the default
            due = [anchor, *(item for item in due if item is not anchor)]
        for item in due:
            _run_once(plan, item, round_, cap, seed, progress)
    if anchor is not None and anchor.runs and any(run["started"] > anchor.runs[-1]["started"]
                                                  for item in pending for run in item.runs):
        _run_once(plan, anchor, repeats + EXTRA_RUNS, cap, seed, progress)  # closing the last round
    for item in pending:
        if anchor is not None:
            _set_against(item, anchor)
        _settle(plan, item.check, item.runs)
    return checks


def _run_once(plan: Plan, item: _Pending, round_: int, cap: float, seed: int, progress: Callable[[str], None]) -> None:
    """One run of a pending check, read in its steady window, its start and end times kept."""
    import rlbench
    from rlbench.runner import stop_series_if_signalled

    check = item.check
    started = time.monotonic()
    result = stop_series_if_signalled(rlbench.run(run_mapping(plan, check.mapping).config(
        steps=item.steps, seconds=cap, eval_episodes=0, seed=seed + len(item.runs))))
    check.status = result["status"] + (f" ({result['status_reason']})" if result.get("status_reason") else "")
    check.steps = result["throughput"]["env_steps"]
    state = result.get("machine_state") or {}
    steady = measure.steady_rate(result, measure.window_start(item.warm, check.steps))
    rate = steady.rate if steady else None
    learner = (measure.role_costs(result).get("learner") or {}) if check.prediction.learner_terms else {}
    run = {"rate": rate, "window": steady, "contended": measure.contention(state), "machine": state,
           "split": learner_split(check.prediction, learner, plan.schedule.train_every, rate),
           "started": started, "ended": time.monotonic()}
    item.runs.append(run)
    progress(f"round {round_ + 1}: ran {_name(check)} {check.mapping.label()}: predicted "
             f"{_rate(check.prediction.env_steps_per_s)}, measured {_rate(rate)}"
             + (f" [contended: {run['contended']}]" if run["contended"] else "")
             + (f"; learner per update, predicted/measured us: {format_split(run['split'])}"
                if run["split"] else ""))


def reference_rate(anchors: list[tuple[float, float]], at: float) -> float | None:
    """The default's rate at time `at`, from its runs (mid-time, rate): interpolated linearly between
    the runs before and after it, the nearest one's where it has a run on one side only."""
    if not anchors:
        return None
    before = [a for a in anchors if a[0] <= at]
    after = [a for a in anchors if a[0] > at]
    if not before or not after:
        return (before[-1] if before else after[0])[1]
    (t0, r0), (t1, r1) = before[-1], after[0]
    return r0 + (r1 - r0) * (at - t0) / (t1 - t0)


def _set_against(item: _Pending, anchor: _Pending) -> None:
    """Each run's rate over the default's at its time (`reference_rate`), and the check's ratios: its
    prediction over the default's, and the median of its kept runs' ratios."""
    anchors = sorted(((r["started"] + r["ended"]) / 2, r["rate"]) for r in anchor.runs if r["rate"])
    for run in item.runs:
        default = reference_rate(anchors, (run["started"] + run["ended"]) / 2)
        run["ratio"] = run["rate"] / default if run["rate"] and default else None
    check, predicted = item.check, anchor.check.prediction.env_steps_per_s
    check.predicted_ratio = check.prediction.env_steps_per_s / predicted if predicted else None
    if item is anchor:  # its own runs are what the others are set against
        check.ratios, check.measured_ratio, check.ratio_spread = [1.0], 1.0, 0.0
        return
    check.ratios = [run["ratio"] for run in measure.kept(item.runs) if run.get("ratio")]
    if check.ratios:
        check.measured_ratio, check.ratio_spread = measure.combine(check.ratios)


def _settle(plan: Plan, check: Check, runs: list[dict[str, Any]]) -> None:
    """A check's figures from its runs: the median of the undisturbed ones (all, where none was)."""
    check.predicted = check.prediction.env_steps_per_s
    kept = measure.kept(runs)
    check.left_out = len(runs) - len(kept)
    if not kept:
        check.status += "; too few episodes in the steady window to measure it"
        check.machine = runs[-1]["machine"]
        return
    check.machine = kept[-1]["machine"]
    check.contended = "; ".join(sorted({r["contended"] for r in kept if r["contended"]}))
    check.runs = [r["rate"] for r in kept]
    check.measured, across = measure.combine(check.runs)
    within = [r["window"].spread for r in kept if math.isfinite(r["window"].spread)]
    check.spread = max(across, statistics.median(within) if within else 0.0)
    middle = min(kept, key=lambda r: abs(r["rate"] - check.measured))
    check.window_s = middle["window"].seconds
    check.learner_split = middle["split"]
    check.measured_updates_per_s = check.measured / plan.schedule.train_every


def learner_split(prediction: Prediction, measured_us: dict[str, Any], train_every: int,
                  rate: float | None) -> list[tuple[str, float | None, float | None]]:
    """A distributed run's learner period per update, part by part: (part, the model's microseconds,
    the run's time split's), and the whole period (from the rate). Where a prediction misses, this
    says which part of the learner's period it missed. [] for a mapping with no learner terms."""
    if not prediction.learner_terms:
        return []
    by_name = {term.name: term.us * train_every for term in prediction.learner_terms}
    parts = [(part, by_name.get(term, 0.0), measured_us.get(key) if key else None) for part, term, key in LEARNER_PARTS]
    period = 1e6 * train_every / rate if rate else None
    return parts + [("period", 1e6 * train_every / prediction.env_steps_per_s, period)]


def format_split(split: list[tuple[str, float | None, float | None]]) -> str:
    def us(value: float | None) -> str:
        return "-" if value is None else f"{value:,.0f}"

    return ", ".join(f"{part} {us(predicted)}/{us(measured)}" for part, predicted, measured in split
                     if predicted or measured)


def _name(check: Check) -> str:
    return check.kind + (f" #{check.rank}" if check.rank else "")


def _run_offline(check: Check, seed: int) -> Check:
    import rlbench
    from rlbench.runner import stop_series_if_signalled

    rates = []
    for _ in range(OFFLINE_REPEATS):
        result = stop_series_if_signalled(rlbench.run(check.mapping.config(eval_episodes=0, seed=seed)))
        fit = (result.get("latency") or {}).get("learner.fit_offline") or {}
        seconds = fit.get("mean", 0.0) * 1e-6
        if seconds > 0:
            rates.append(result["throughput"]["updates"] / seconds)
        check.status = result["status"] + (f" ({result['status_reason']})" if result.get("status_reason") else "")
        check.machine = result.get("machine_state") or {}
        check.contended = measure.contention(check.machine) or check.contended
    check.predicted = check.prediction.updates_per_s
    if rates:
        check.runs = rates
        check.measured, check.spread = measure.combine(rates)
        check.measured_updates_per_s = check.measured
    return check


def validation_rows(plan: Plan, k: int) -> list[tuple[Row, int | None]]:
    """The top k mappings on this host, and the default mapping (rank None when not among them)."""
    here = [row for row in plan.rows if row.mapping.host == plan.this_host]
    chosen = [(row, row.rank) for row in here[:k]]
    if plan.default is not None and all(row is not plan.default for row, _ in chosen):
        chosen.append((plan.default, None))
    return chosen


def calibrated(plan: Plan, profile: dict[str, Any]) -> set[Mapping]:
    """The mappings (actor count and policy included, schedule left out) the profile's calibration
    runs of this job ran on this host."""
    entry = profile["hosts"].get(plan.this_host) or {}
    runs = ((entry.get("jobs") or {}).get(plan.job.key) or {}).get("calibration") or {}
    found = set()
    for run in runs.values():
        if "placement" not in run:
            continue
        learners = run.get("learners", 1)
        found.add(_shape(Mapping(plan.job.algo, plan.job.env, run.get("compute") or "cpu", placement=run["placement"],
                                 replay=run.get("replay", "prioritized"), transport=run.get("transport"),
                                 actors=run.get("actors", 1) if run["placement"] != "local" else 1,
                                 policy="data-parallel" if learners > 1 else "single-learner", learners=learners)))
    return found


def _shape(mapping: Mapping) -> tuple[Any, ...]:
    return (mapping.placement, mapping.transport if mapping.placement != "local" else None, mapping.replay,
            mapping.compute, mapping.options, mapping.actors, mapping.policy, mapping.learners, mapping.dataset)


def holdout_rows(plan: Plan, profile: dict[str, Any], n: int, *, seed: int = 0,
                 exclude: list[Row] = ()) -> list[Row]:
    """`n` mappings on this host drawn at random (seeded) from those the profile did not calibrate on,
    leaving out `exclude` (the rows validated already)."""
    trained = calibrated(plan, profile)
    taken = {id(row) for row in exclude}
    candidates = [row for row in plan.rows if row.mapping.host == plan.this_host and id(row) not in taken
                  and _shape(row.mapping) not in trained]
    return random.Random(seed).sample(candidates, min(n, len(candidates)))


def validate(plan: Plan, rows: list[tuple[Row, int | None, str]], *, seconds: float = DEFAULT_SECONDS, seed: int = 0,
             repeats: int = DEFAULT_REPEATS, progress: Callable[[str], None] = lambda line: None,
             reference: Row | None = None) -> list[Check]:
    """Run each (row, rank, kind), in rounds (`run_checks`), and set measured beside predicted; with a
    `reference` (the default mapping: `rlbench plan --validate` names it), each measured rate also as a
    ratio to the reference's measured in the same rounds, beside the predicted ratio. The reference is
    added to the rows (kind "default") where they lack it."""
    if reference is not None and all(row is not reference for row, _, _ in rows):
        rows = [*rows, (reference, None, "default")]
    checks = run_checks(plan, rows, seconds=seconds, seed=seed, repeats=repeats, progress=progress,
                        reference=reference)
    for check in checks:
        error, ratio = check.error, check.ratio_error
        progress(f"{_name(check)} {check.mapping.label()}: predicted {_rate(check.predicted)}, measured "
                 f"{_rate(check.measured)} from {len(check.runs)} run(s)"
                 + (f" ({error:+.1%})" if error is not None else "")
                 + (f"; to the default: predicted x{check.predicted_ratio:.3f}, measured x{check.measured_ratio:.3f}"
                    f" ({ratio:+.1%})" if ratio is not None and not check.reference else "")
                 + (f" [contended: {check.contended}]" if check.contended else ""))
    return checks


HOST_DRIFT = 0.10  # the default mapping measured this far off its prediction: the host's pace moved


def ranking(checks: list[Check]) -> dict[str, int]:
    """How many pairs of mappings with a measured ratio to the default (the default's own, 1, among
    them) measured in the order their predicted ratios put them, of the pairs the predictions order."""
    rated = [c for c in checks if c.measured_ratio and c.predicted_ratio]
    pairs = in_order = 0
    for i, first in enumerate(rated):
        for second in rated[i + 1:]:
            if first.predicted_ratio == second.predicted_ratio:
                continue
            pairs += 1
            predicted_first = first.predicted_ratio > second.predicted_ratio
            in_order += predicted_first == (first.measured_ratio > second.measured_ratio)
    return {"pairs": pairs, "in_predicted_order": in_order}


def summary(checks: list[Check], default: Mapping | None = None) -> dict[str, Any]:
    """Median and largest error, per kind of check and over all, as ratios to the default measured in
    the same rounds (where the checks have them: the host's pace cancels) and absolute; how many pairs
    measured in the predicted order (`ranking`); how the first choice fared against the best measured;
    how many runs someone else's work disturbed; and the host's pace: the `default` mapping's measured
    rate over its prediction. The default is local, predicted from the profile's local calibration
    runs of the same loop, so its error is mostly how much faster or slower the host ran than while it
    was profiled (this VM's pace moves 20-50 % for minutes at a time, docs/planner.md), which every
    other mapping's absolute error then shares, and its ratio cancels."""
    def errors(chosen: list[Check]) -> dict[str, Any]:
        values = [abs(c.error) for c in chosen if c.error is not None and math.isfinite(c.error)]
        ratios = [abs(c.ratio_error) for c in chosen if not c.reference and c.ratio_error is not None
                  and math.isfinite(c.ratio_error)]
        return {"mappings": len(chosen), "measured": len(values),
                "median_abs_error": statistics.median(values) if values else None,
                "max_abs_error": max(values) if values else None,
                "ratios_measured": len(ratios),
                "median_abs_ratio_error": statistics.median(ratios) if ratios else None,
                "max_abs_ratio_error": max(ratios) if ratios else None}

    validated = [c for c in checks if c.kind in ("top", "default")]
    held = [c for c in checks if c.kind == "holdout"]
    measured = [c for c in validated if c.measured]
    first = next((c for c in checks if c.rank == 1), None)
    best = max(measured, key=lambda c: c.measured) if measured else None
    return {
        "validated": len(checks), **errors(checks),
        "top_and_default": errors(validated), "holdout": errors(held), "ranking": ranking(checks),
        "contended_runs": sum(1 for c in checks if c.contended),
        "first_choice": first.mapping.label() if first else None,
        "best_measured": best.mapping.label() if best else None,
        "first_vs_best": (first.measured / best.measured) if first and best and first.measured else None,
        "host_pace": next((c.measured / c.predicted for c in checks if c.mapping == default and c.measured
                           and c.predicted), None),
    }


# ------------------------------------------------------------------------------ first choice
@dataclass
class GainCheck:
    """A candidate against a baseline, run for the same steps and seed: the gain predicted and measured."""

    candidate: Check
    baseline: Check
    what: str  # what the gain is of, e.g. "first choice over the default"
    unit: str = "env steps/s"

    @property
    def predicted_gain(self) -> float | None:
        c, b = self.candidate.predicted, self.baseline.predicted
        return c / b - 1 if c and b else None

    @property
    def measured_gain(self) -> float | None:
        c, b = self.candidate.measured, self.baseline.measured
        return c / b - 1 if c and b else None

    @property
    def error(self) -> float | None:
        """The measured ratio against the predicted one, less 1 (a gain of +30 % predicted and +25 %
        measured: 1.25 / 1.30 - 1 = -3.8 %)."""
        if self.predicted_gain is None or self.measured_gain is None:
            return None
        return (1 + self.measured_gain) / (1 + self.predicted_gain) - 1


def first_choice_check(plan: Plan, *, seconds: float = DEFAULT_SECONDS, seed: int = 0, repeats: int = DEFAULT_REPEATS,
                       progress: Callable[[str], None] = lambda line: None) -> GainCheck | str:
    """Run the first choice and the default for the same env steps and seeds; or why not (a str)."""
    if plan.offline:
        return "--check compares replay-loop mappings (an offline plan has no default to beat in env steps)"
    if plan.default is None:
        return "no default mapping (local, cpu, prioritized) is in the plan to compare with"
    chosen, default = plan.chosen, plan.default
    if chosen is default:
        return f"the first choice is the default mapping itself ({default.mapping.label()}): nothing to gain"
    steps = max(budget(plan, chosen.mapping, chosen.prediction, seconds)[0],
                budget(plan, default.mapping, default.prediction, seconds)[0])
    # in rounds: the first choice, then the default, then each again, so both sample the same stretches
    # of the host's pace and the gain between them is measured in the same conditions
    checks = run_checks(plan, [(chosen, chosen.rank, "top"), (default, None, "default")], seconds=seconds, seed=seed,
                        repeats=repeats, steps=steps, progress=lambda line: progress("--check " + line))
    return GainCheck(checks[0], checks[1], "first choice over the default")


# ---------------------------------------------------------------------------------- policies
def policy_check(plan: Plan, learners: int, *, steps: int | None = None, seed: int = 0,
                 progress: Callable[[str], None] = lambda line: None) -> GainCheck | str:
    """`rlbench bench policies`' runs of one learner and of `learners` data-parallel learners, on the
    plan's best data-parallel family with that count, and the speed-up in updates/s they measure
    (the bench's own figure) beside the plan's prediction."""
    from rlbench.bench import policies as bench
    from rlbench.runner import run, stop_series_if_signalled

    gain = next((g for g in learner_gains(plan) if g.parallel.mapping.learners == learners), None)
    if gain is None:
        return f"no data-parallel mapping with {learners} learners on this host in the plan (see its left-out list)"
    mapping = gain.parallel.mapping
    hp = dict(mapping.hyperparameters)
    steps = steps or bench.DEFAULT_STEPS
    checks = []
    for policy, count, row in (("data-parallel", learners, gain.parallel), ("single-learner", 1, gain.single)):
        config = bench.policy_config(policy, count, steps, mapping.transport, mapping.actors, seed,
                                     hyperparameters=hp, replay=mapping.replay, compute=mapping.compute)
        result = stop_series_if_signalled(run(config))
        measured = bench.summarise(f"{policy} x{count}", result, bench.DEFAULT_TARGET)
        check = Check(replace(row.mapping), row.prediction, row.rank, "policy", predicted=row.prediction.updates_per_s,
                      measured=measured["updates_per_s"], status=result["status"],
                      steps=result["throughput"]["env_steps"], machine=result.get("machine_state") or {},
                      contended=measure.contention(result.get("machine_state")))
        progress(f"--check-policies ran {row.mapping.label()} ({steps} env steps, bench policies' run): updates/s "
                 f"predicted {_rate(check.predicted)}, measured {_rate(check.measured)}")
        checks.append(check)
    return GainCheck(checks[0], checks[1], f"{learners} data-parallel learners over one", unit="updates/s")


def sweep_actors(plan: Plan, mapping: Mapping, max_actors: int, *, seconds: float, seed: int = 0, repeats: int = 1,
                 progress: Callable[[str], None] = lambda line: None) -> list[Check]:
    """Run `mapping`'s family at 1..max_actors actors: predicted beside measured."""
    by_actors = {row.mapping.actors: row for row in plan.rows if row.mapping.family == mapping.family}
    rows = [(by_actors[actors], by_actors[actors].rank, "top") for actors in range(1, max_actors + 1)
            if actors in by_actors]
    return run_checks(plan, rows, seconds=seconds, seed=seed, repeats=repeats, progress=progress)


def _rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f}/s"
