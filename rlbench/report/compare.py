"""`rlbench compare A B`: two result sets side by side, per measure, with their intervals."""

from __future__ import annotations

import math

from rlbench.errors import RlbenchError
from rlbench.report.collect import Combination, Group, Inputs
from rlbench.report.measures import Measure, estimate, flat, measures
from rlbench.report.stats import Estimate, probability_of_improvement


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
                           f"or sets whose combinations carry the same labels ({unmatched[0]}, ...)")
    return matched, unmatched


def _text(e: Estimate, digits: int) -> str:
    def number(v: float) -> str:
        if math.isnan(v):
            return "-"
        return "not reached" if math.isinf(v) else f"{v:,.{digits}f}"

    ci = "" if math.isnan(e.low) else f" [{number(e.low)}, {number(e.high)}]"
    return f"{number(e.value)}{ci} n={e.n}"


def verdict(measure: Measure, a: Estimate, b: Estimate) -> str:
    if a.separated_from(b):
        higher = "A" if a.value > b.value else "B"
        better = higher if measure.higher_is_better else ("B" if higher == "A" else "A")
        return f"{better} better (intervals apart)"
    if math.isnan(a.low) or math.isnan(b.low):
        return "no interval (one run)"
    return "within the intervals"


def compare_lines(a_inputs: Inputs, b_inputs: Inputs, a_groups: list[Group], b_groups: list[Group],
                  names: tuple[str, str]) -> list[str]:
    matched, unmatched = pairs(a_groups, b_groups)
    lines = [f"A: {names[0]} ({len(a_inputs.runs)} results)", f"B: {names[1]} ({len(b_inputs.runs)} results)"]
    for (ca, ga), (cb, gb) in matched:
        lines.append("")
        lines.append(f"A {ca.label}  vs  B {cb.label}" if ca.label != cb.label or len(matched) > 1 else
                     f"{ca.label}")
        found = {m.key: m for m in measures(ga)}
        for m in measures(gb):
            found.setdefault(m.key, m)
        rows = []
        for measure in found.values():
            ea, eb = estimate(measure, ca, ga), estimate(measure, cb, gb)
            rows.append((measure.label, _text(ea, measure.digits), _text(eb, measure.digits), verdict(measure, ea, eb)))
        final = found.get("final_return")
        if final is not None:
            p = probability_of_improvement(flat(final, ca, ga), flat(final, cb, gb))
            rows.append(("P(A beats B), final return", _text(p, 2), "", "A better" if p.low > 0.5 else
                         ("B better" if p.high < 0.5 else "undecided")))
        widths = [max(len(r[i]) for r in rows + [("measure (IQM [95% CI])", "A", "B", "")]) for i in range(3)]
        lines.append(f"  {'measure (IQM [95% CI])':<{widths[0]}}  {'A':<{widths[1]}}  {'B':<{widths[2]}}  difference")
        for label, left, right, text in rows:
            lines.append(f"  {label:<{widths[0]}}  {left:<{widths[1]}}  {right:<{widths[2]}}  {text}")
    for item in unmatched:
        lines.append(f"not compared (no counterpart): {item}")
    return lines
