"""Comparisons and verdicts: `rlbench compare A B` (two result sets), `rlbench compare STUDY --a
KEY=VALUE --b KEY=VALUE` (two sets of combinations of one study), and the verdict lines the report
shows too. A verdict names its clock; the default one counts env steps to the target (sample
efficiency), since wall-clock time also measures how loaded the machine was."""

from __future__ import annotations

import difflib
import math

from rlbench.errors import RlbenchError
from rlbench.report.collect import Combination, Group, Inputs, Run
from rlbench.report.measures import (DEFAULT_VERDICT, Measure, decimals, energy_meters, estimate, measures,
                                     paired_values, target_rule, unpriced_devices)
from rlbench.report.stats import (MIN_COMPARE_RUNS, MIN_RUNS, Estimate, coverage_words, probability_of_improvement,
                                  trimmed_per_end)


def interval_name(e: Estimate) -> str:
    return {"ci": "intervals", "range": "ranges"}.get(e.kind, "intervals")


def number_text(value: float, digits: int) -> str:
    if math.isnan(value):
        return "-"
    return "not reached" if math.isinf(value) else f"{value:,.{digits}f}"


def too_few(*estimates: Estimate) -> bool:
    """Fewer than MIN_COMPARE_RUNS runs (in some environment) on a side: a range of one or two runs
    says nothing about the spread, so nothing is called better or bolded on it."""
    return any(0 < e.n and e.per_task < MIN_COMPARE_RUNS for e in estimates)


def printed_equal(measure: Measure, a: Estimate, b: Estimate) -> bool:
    """The two IQMs print the same: the table could not show the difference a verdict would claim."""
    places = decimals(measure.digits, a.value, b.value)
    return number_text(a.value, places) == number_text(b.value, places)


def pairwise(measure: Measure, a: Estimate, b: Estimate) -> str:
    """A's and B's estimates of one measure: a side is better only when the intervals (or, from
    MIN_COMPARE_RUNS to MIN_RUNS seeds, the ranges of the runs) are apart, and never on fewer runs."""
    if not a.n or not b.n:
        return "not measured on a side"
    if too_few(a, b):
        return (f"too few runs to compare ({min(a.per_task, b.per_task)} on a side; "
                f"{MIN_COMPARE_RUNS} at least)")
    if math.isnan(a.low) or math.isnan(b.low):
        return "no interval"
    words = "ranges" if "range" in (a.kind, b.kind) else "intervals"
    if a.separated_from(b):
        if printed_equal(measure, a, b):
            return f"{words} apart, but equal as printed"
        higher = "A" if a.value > b.value else "B"
        better = higher if measure.higher_is_better else ("B" if higher == "A" else "A")
        return f"{better} better ({words} apart)"
    return f"within the {words}"


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
            lines.append(f"  {run_name(run)}: {run.contention}" + _superseded_words(group, run))
    return lines


def _superseded_words(group: Group, run: Run) -> str:
    """Whether a contended run was rerun, and whether the rerun the statistics use was quiet."""
    if not any(run is r for c in group.combinations for r in c.superseded):
        return ""
    cell = (run.study or {}).get("cell")
    chosen = next((r for c in group.combinations for r in c.runs if cell is not None and (r.study or {}).get("cell") == cell),
                  None)
    if chosen is not None and not chosen.contention:
        return f" (superseded by a quiet rerun, {run_name(chosen)})"
    if chosen is not None:
        return f" (rerun, but the rerun was contended too: the statistics use {run_name(chosen)})"
    return " (superseded by a rerun)"


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
    places = decimals(digits, e.value, e.low, e.high)
    if math.isnan(e.low):
        ci = ""
    elif e.kind == "range":
        ci = f" range [{number_text(e.low, places)}, {number_text(e.high, places)}]"
    else:
        ci = f" [{number_text(e.low, places)}, {number_text(e.high, places)}]"
    return f"{number_text(e.value, places)}{ci} n={e.n}"


def _header(estimates: list[Estimate]) -> str:
    """What the brackets of a table are: 95 % intervals only when every one is an interval."""
    kinds = {e.kind for e in estimates if e.n and e.kind != "none"}
    if kinds == {"ci"}:
        return "measure (IQM [95 % CI])"
    if kinds == {"range"}:
        return "measure (IQM [range])"
    return f"measure (IQM [95 % CI, or range below {MIN_RUNS} seeds])"


def _in_env(combination: Combination, env: str) -> Combination:
    return Combination(combination.label, dict(combination.values), [r for r in combination.runs if r.env == env])


def _envs(combination: Combination) -> list[str]:
    return list(dict.fromkeys(run.env for run in combination.runs))


def _measure_table(found: list[Measure], ca: Combination, ga: Group, cb: Combination, gb: Group,
                   extra: list[tuple[str, str, str, str]], indent: str) -> list[str]:
    """Per measure both estimates and whether they differ; the notes on what the brackets are worth."""
    rows, estimates = [], []
    for measure in found:
        ea, eb = estimate(measure, ca, ga), estimate(measure, cb, gb)
        estimates += [ea, eb]
        rows.append((measure.label, _text(ea, measure.digits), _text(eb, measure.digits), pairwise(measure, ea, eb)))
    rows += extra
    header = _header(estimates)
    widths = [max(len(r[i]) for r in rows + [(header, "A", "B", "")]) for i in range(3)]
    lines = [f"{indent}{header:<{widths[0]}}  {'A':<{widths[1]}}  {'B':<{widths[2]}}  difference"]
    for label, left, right, text in rows:
        lines.append(f"{indent}{label:<{widths[0]}}  {left:<{widths[1]}}  {right:<{widths[2]}}  {text}")
    n = min((e.per_task for e in estimates if e.n), default=0)
    if n and n < MIN_COMPARE_RUNS:
        lines.append(f"{indent}note: {n} run(s) on the smaller side: too few to call either side better "
                     f"(a range of {n} run(s) is no spread); run at least {MIN_COMPARE_RUNS} ({MIN_RUNS} for an interval)")
    elif n and n < MIN_RUNS:
        lines.append(f"{indent}note: {n} run(s) on the smaller side: its bracket is the runs' range, not a 95 % "
                     f"interval; the IQM of {n} runs trims {trimmed_per_end(n)} at each end"
                     + (" (it is the mean)" if trimmed_per_end(n) == 0 else ""))
    elif coverage_words(n):
        lines.append(f"{indent}note: {coverage_words(n)}")
    return lines


def compare_pair(ca: Combination, ga: Group, cb: Combination, gb: Group) -> list[str]:
    """The verdict on its clock (over every environment both sides ran, the probability of
    improvement averaged over them), then per environment each measure's estimates, then the costs.
    Raw values are never pooled across environments: a return of 7.9 on Taxi and one of 0.7 on
    FrozenLake are not on one scale."""
    found = {m.key: m for m in measures(ga)}
    for m in measures(gb):
        found.setdefault(m.key, m)
    envs_a, envs_b = _envs(ca), _envs(cb)
    shared = [env for env in envs_a if env in envs_b]
    several = len(set(envs_a) | set(envs_b)) > 1
    over = f", averaged over {len(shared)} environments" if len(shared) > 1 else ""
    lines = []
    primary = default_measure(list(found.values()))
    if primary is not None:
        p = probability_of_improvement(*paired_values(primary, ca, cb, ga, gb), higher_is_better=primary.higher_is_better)
        lines.append(f"  verdict ({clock_words(primary)}; {primary.label}): {improvement_verdict(p)}, "
                     f"P(A beats B) = {_text(p, 2)}{over}")
    if ga.has_target:
        lines.append(f"  target: {target_rule(ga)}")
    extra = []
    for key in ("final_return", "time_to_target_s"):
        measure = found.get(key)
        if measure is None or measure is primary:
            continue
        p = probability_of_improvement(*paired_values(measure, ca, cb, ga, gb), higher_is_better=measure.higher_is_better)
        extra.append((f"P(A beats B), {measure.label}" + (f" [{clock_words(measure)}]" if measure.clock else ""),
                      _text(p, 2), "", improvement_verdict(p)))
    if not several:
        lines += _measure_table(list(found.values()), ca, ga, cb, gb, extra, "  ")
    else:
        for label, left, _, text in extra:
            lines.append(f"  {label}: {left}  {text}{over}")
        for env in shared:
            counts = [sum(run.env == env for run in side.runs) for side in (ca, cb)]
            lines.append(f"  {env} (A {counts[0]} runs, B {counts[1]} runs):")
            lines += _measure_table(list(found.values()), _in_env(ca, env), ga, _in_env(cb, env), gb, [], "    ")
        for env in [e for e in dict.fromkeys(envs_a + envs_b) if e not in shared]:
            lines.append(f"  {env}: only {'A' if env in envs_a else 'B'} ran it: not compared")
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
