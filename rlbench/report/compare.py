"""Comparisons and verdicts: `rlbench compare A B` (two result sets), `rlbench compare STUDY --a
KEY=VALUE --b KEY=VALUE` (two sets of combinations of one study), and the verdict lines the report
shows too. A verdict names its clock; the default one counts env steps to the target (sample
efficiency), since wall-clock time also measures how loaded the machine was."""

from __future__ import annotations

import difflib
import math

from rlbench.errors import RlbenchError
from rlbench.report.collect import Combination, Group, Inputs, Run
from rlbench.report.measures import (DEFAULT_VERDICT, Measure, energy_meters, estimate, measures, paired_values,
                                     unpriced_devices)
from rlbench.report.stats import MIN_RUNS, Estimate, probability_of_improvement, trimmed_per_end


def interval_name(e: Estimate) -> str:
    return {"ci": "intervals", "range": "ranges"}.get(e.kind, "intervals")


def pairwise(measure: Measure, a: Estimate, b: Estimate) -> str:
    """A's and B's estimates of one measure: a side is better only when the intervals (or, below
    MIN_RUNS seeds, the ranges of the runs) are apart."""
    if math.isnan(a.low) or math.isnan(b.low):
        return "no interval (one run)" if min(a.n, b.n) < 2 else "no interval"
    if a.separated_from(b):
        higher = "A" if a.value > b.value else "B"
        better = higher if measure.higher_is_better else ("B" if higher == "A" else "A")
        words = "ranges" if "range" in (a.kind, b.kind) else "intervals"
        return f"{better} better ({words} apart)"
    return f"within the {'ranges' if 'range' in (a.kind, b.kind) else 'intervals'}"


def improvement_verdict(p: Estimate, a: str = "A", b: str = "B") -> str:
    if p.kind == "none" or math.isnan(p.low):
        return f"undecided (no interval: fewer than {MIN_RUNS} runs on a side)" if p.n else "not measured"
    if p.low > 0.5:
        return f"{a} better"
    if p.high < 0.5:
        return f"{b} better"
    return "undecided (the interval holds 0.5)"


def default_measure(found: list[Measure]) -> Measure | None:
    """What a verdict is about unless a table says otherwise: env steps to the target, else the final return."""
    by_key = {m.key: m for m in found}
    return by_key.get(DEFAULT_VERDICT) or by_key.get("final_return")


def clock_words(measure: Measure) -> str:
    return f"clock: {measure.clock}" if measure.clock else "no clock: a final score"


def contention_lines(groups: list[Group]) -> list[str]:
    """One list per study of every run measured on a contended machine, with the reason."""
    lines = []
    for group in groups:
        runs = group.contended()
        if not runs:
            continue
        total = len(group.all_runs())
        lines.append(f"{len(runs)} of {total} run(s) of {group.name!r} were measured on a contended machine "
                     "(their throughput and wall-clock figures are lower than a quiet machine's; rerun them with "
                     "rlbench sweep --rerun-contended N):")
        for run in runs:
            superseded = any(run is r for c in group.combinations for r in c.superseded)
            lines.append(f"  {run_name(run)}: {run.contention}" + (" (superseded by a quiet rerun)" if superseded else ""))
    return lines


def run_name(run: Run) -> str:
    from pathlib import Path

    return Path(run.path).stem


# ------------------------------------------------------------------------------------ selection
def _parse_selection(items: tuple[str, ...], side: str) -> dict[str, str]:
    chosen = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise RlbenchError(f"--{side} {item!r} is not KEY=VALUE (an axis of the study and one of its values)")
        chosen[key.strip()] = value.strip()
    return chosen


def _shown(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def select(groups: list[Group], items: tuple[str, ...], side: str) -> tuple[Combination, Group]:
    """The runs of one study's combinations that match every KEY=VALUE, as one combination (over
    several environments when `env` is left open)."""
    if len(groups) != 1:
        names = ", ".join(repr(g.name) for g in groups)
        raise RlbenchError(f"--{side} selects within one study, and the results hold {len(groups)}: {names}")
    (group,) = groups
    chosen = _parse_selection(items, side)
    for key, value in chosen.items():
        if key not in group.axes:
            close = difflib.get_close_matches(key, group.axes, n=1)
            raise RlbenchError(f"--{side} {key}={value}: {key!r} is not an axis of study {group.name!r}"
                               + (f"; did you mean {close[0]!r}?" if close else f" (its axes: {', '.join(group.axes)})"))
        known = list(dict.fromkeys(_shown(c.values.get(key)) for c in group.combinations))
        if value not in known:
            close = difflib.get_close_matches(value, known, n=1)
            raise RlbenchError(f"--{side} {key}={value}: the study has no {key} {value!r}"
                               + (f"; did you mean {close[0]!r}?" if close else f" (it has: {', '.join(known)})"))
    matched = [c for c in group.combinations if all(_shown(c.values.get(k)) == v for k, v in chosen.items())]
    open_axes = [a for a in group.axes if a not in chosen and a != "env"
                 and len({_shown(c.values.get(a)) for c in matched}) > 1]
    if open_axes:
        raise RlbenchError(f"--{side} {' '.join(items)} matches combinations that differ in "
                           f"{', '.join(open_axes)}: add --{side} {open_axes[0]}=VALUE")
    runs = [run for c in matched for run in c.runs]
    if not runs:
        raise RlbenchError(f"--{side} {' '.join(items)}: no complete run")
    label = " ".join(f"{k}={v}" for k, v in chosen.items())
    merged = Combination(label, dict(chosen), runs,
                         [r for c in matched for r in c.incomplete], [f for c in matched for f in c.failures],
                         [r for c in matched for r in c.superseded])
    return merged, group


# ---------------------------------------------------------------------------------------- pairs
def _combinations(groups: list[Group]) -> list[tuple[Combination, Group]]:
    return [(c, g) for g in groups for c in g.combinations if c.runs]


def pairs(a: list[Group], b: list[Group]) -> tuple[list[tuple[tuple[Combination, Group], tuple[Combination, Group]]], list[str]]:
    """Which combination of A faces which of B: the only one of each, else those with the same label."""
    left, right = _combinations(a), _combinations(b)
    if not left or not right:
        raise RlbenchError(f"nothing to compare: {'A' if not left else 'B'} holds no complete run")
    if len(left) == 1 and len(right) == 1:
        return [(left[0], right[0])], []
    by_label = {c.label: (c, g) for c, g in right}
    matched = [(item, by_label[item[0].label]) for item in left if item[0].label in by_label]
    unmatched = [f"A: {c.label}" for c, _ in left if c.label not in by_label]
    unmatched += [f"B: {c.label}" for c, _ in right if c.label not in {x[0].label for x, _ in matched}]
    if not matched:
        raise RlbenchError("A and B share no combination: give each one combination (a file or a folder of seeds), "
                           f"or sets whose combinations carry the same labels ({unmatched[0]}, ...); within one study, "
                           "rlbench compare STUDY --a KEY=VALUE --b KEY=VALUE")
    return matched, unmatched


def _text(e: Estimate, digits: int) -> str:
    def number(v: float) -> str:
        if math.isnan(v):
            return "-"
        return "not reached" if math.isinf(v) else f"{v:,.{digits}f}"

    if math.isnan(e.low):
        ci = ""
    elif e.kind == "range":
        ci = f" range [{number(e.low)}, {number(e.high)}]"
    else:
        ci = f" [{number(e.low)}, {number(e.high)}]"
    return f"{number(e.value)}{ci} n={e.n}"


def compare_pair(ca: Combination, ga: Group, cb: Combination, gb: Group) -> list[str]:
    """Per measure both estimates and the difference, the verdict on its clock, and the costs."""
    found = {m.key: m for m in measures(ga)}
    for m in measures(gb):
        found.setdefault(m.key, m)
    rows, estimates = [], {}
    for measure in found.values():
        ea, eb = estimate(measure, ca, ga), estimate(measure, cb, gb)
        estimates[measure.key] = (ea, eb)
        rows.append((measure.label, _text(ea, measure.digits), _text(eb, measure.digits), pairwise(measure, ea, eb)))
    lines = []
    primary = default_measure(list(found.values()))
    if primary is not None:
        p = probability_of_improvement(*paired_values(primary, ca, cb, ga, gb), higher_is_better=primary.higher_is_better)
        lines.append(f"  verdict ({clock_words(primary)}; {primary.label}): {improvement_verdict(p)}, "
                     f"P(A beats B) = {_text(p, 2)}")
    for key in ("final_return", "time_to_target_s"):
        measure = found.get(key)
        if measure is None or measure is primary:
            continue
        p = probability_of_improvement(*paired_values(measure, ca, cb, ga, gb), higher_is_better=measure.higher_is_better)
        rows.append((f"P(A beats B), {measure.label}" + (f" [{clock_words(measure)}]" if measure.clock else ""),
                     _text(p, 2), "", improvement_verdict(p)))
    n = min((e.n for pair in estimates.values() for e in pair if e.n), default=0)
    small = n and n < MIN_RUNS
    header = "measure (IQM [95% CI]" + ("; range below 5 seeds)" if small else ")")
    widths = [max(len(r[i]) for r in rows + [(header, "A", "B", "")]) for i in range(3)]
    lines.append(f"  {header:<{widths[0]}}  {'A':<{widths[1]}}  {'B':<{widths[2]}}  difference")
    for label, left, right, text in rows:
        lines.append(f"  {label:<{widths[0]}}  {left:<{widths[1]}}  {right:<{widths[2]}}  {text}")
    if small:
        lines.append(f"  note: {n} run(s) on the smaller side: its bracket is the runs' range, not a 95 % interval; "
                     f"the IQM of {n} runs trims {trimmed_per_end(n)} at each end"
                     + (" (it is the mean)" if trimmed_per_end(n) == 0 else ""))
    absent = {**energy_meters(ga)[1], **energy_meters(gb)[1]}
    measured = set(energy_meters(ga)[0]) | set(energy_meters(gb)[0])
    for meter, why in absent.items():
        if meter not in measured:
            lines.append(f"  energy ({meter}): absent, {why}")
    unpriced = list(dict.fromkeys(unpriced_devices(ga) + unpriced_devices(gb)))
    if ga.has_target and unpriced:
        lines.append(f"  cost in USD: no --price for {', '.join(unpriced)} (e.g. --price {unpriced[0]}=0.05, USD per "
                     f"{'CPU-hour' if unpriced[0] == 'cpu' else 'hour'})")
    return lines


def compare_lines(a_inputs: Inputs, b_inputs: Inputs, a_groups: list[Group], b_groups: list[Group],
                  names: tuple[str, str]) -> list[str]:
    matched, unmatched = pairs(a_groups, b_groups)
    lines = [f"A: {names[0]} ({len(a_inputs.runs)} results)", f"B: {names[1]} ({len(b_inputs.runs)} results)"]
    lines += contention_lines(a_groups + [g for g in b_groups if all(g is not x for x in a_groups)])
    for (ca, ga), (cb, gb) in matched:
        lines.append("")
        lines.append(f"A {ca.label}  vs  B {cb.label}" if ca.label != cb.label or len(matched) > 1 else f"{ca.label}")
        lines += compare_pair(ca, ga, cb, gb)
    for item in unmatched:
        lines.append(f"not compared (no counterpart): {item}")
    return lines


def compare_within(inputs: Inputs, groups: list[Group], a: tuple[str, ...], b: tuple[str, ...], name: str) -> list[str]:
    """Two selections of one study's combinations (--a, --b), compared as A and B."""
    ca, group = select(groups, a, "a")
    cb, _ = select(groups, b, "b")
    if {id(r) for r in ca.runs} & {id(r) for r in cb.runs}:
        raise RlbenchError(f"--a {' '.join(a)} and --b {' '.join(b)} select the same runs: make them differ")
    lines = [f"study {group.name!r} in {name} ({len(inputs.runs)} results)",
             f"A: {ca.label} ({len(ca.runs)} runs)", f"B: {cb.label} ({len(cb.runs)} runs)"]
    lines += contention_lines([group])
    lines.append("")
    lines += compare_pair(ca, group, cb, group)
    return lines
