"""One self-contained HTML page: tables, figures embedded as data URIs, no script, no external
resource, so it opens offline and can be mailed or archived as a single file."""

from __future__ import annotations

import base64
import html
import math
import time
from typing import Any

from rlbench.report.collect import Group, Inputs, fingerprints
from rlbench.report.compare import (clock_words, contention_lines, default_measure, improvement_verdict, printed_equal,
                                    too_few)
from rlbench.report.figures import Figure, asv_history, study_figures, transport_sizes
from rlbench.report.measures import (Measure, decimals, energy_meters, estimate, measures, modelled_measures,
                                     paired_values, target_rule, unpriced_devices)
from rlbench.report.stats import (MIN_COMPARE_RUNS, MIN_RUNS, Estimate, coverage_words, probability_of_improvement,
                                  trimmed_per_end)

STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1d2330; margin: 0;
       background: #f6f7f9; }
main { max-width: 1180px; margin: 0 auto; padding: 24px 28px 60px; }
h1 { font-size: 24px; margin: 0 0 4px; } h2 { font-size: 20px; margin: 36px 0 8px; border-bottom: 2px solid #d9dde5;
padding-bottom: 4px; } h3 { font-size: 15px; margin: 22px 0 6px; }
.meta { color: #5b6475; font-size: 13px; }
table { border-collapse: collapse; background: #fff; margin: 6px 0 12px; font-size: 13px; }
th, td { border: 1px solid #dde1e8; padding: 4px 8px; text-align: right; vertical-align: top; }
th { background: #eef1f6; font-weight: 600; } td.name, th.name { text-align: left; }
.ci { color: #6b7385; font-size: 11px; white-space: nowrap; } .best { font-weight: 700; }
.better { background: #e3f4e6; } .worse { background: #fbe7e7; }
figure { background: #fff; border: 1px solid #dde1e8; margin: 12px 0; padding: 10px; }
figure img { max-width: 100%; height: auto; display: block; }
figcaption { font-size: 12.5px; color: #465063; margin-top: 6px; }
.badge { display: inline-block; font-size: 11px; font-weight: 700; padding: 1px 7px; border-radius: 9px;
         margin-right: 6px; text-transform: uppercase; letter-spacing: .04em; }
.measured { background: #dcefff; color: #0b4f8a; } .modelled { background: #fff0d1; color: #8a5a00; }
.warn { background: #fff4d6; border-left: 4px solid #e0a800; padding: 6px 10px; margin: 8px 0; }
.fail { color: #a01c1c; } code { font-size: 12px; }
.row { display: flex; flex-wrap: wrap; gap: 0 22px; }
details { margin: 6px 0; } summary { cursor: pointer; color: #33405a; }
.verdict { background: #eef6ee; border-left: 4px solid #3c8d40; padding: 6px 10px; margin: 8px 0; }
.verdict ul { margin: 4px 0; } .clock { font-weight: 400; color: #5b6475; font-size: 13px; }
.wide { overflow-x: auto; max-width: 100%; } /* a table wider than the page scrolls inside its own box */
"""


def _e(value: Any) -> str:
    return html.escape(str(value))


def _number(value: float, digits: int) -> str:
    if math.isnan(value):
        return "–"
    if math.isinf(value):
        return "not reached" if value > 0 else "−∞"
    return f"{value:,.{digits}f}"


def _wide(table: str) -> str:
    """A table in a box of the page's width that scrolls sideways (many combinations, 3-seed ranges)."""
    return f"<div class='wide'>{table}</div>"


def _estimate_cell(e: Estimate, digits: int, best: bool) -> str:
    digits = decimals(digits, e.value, e.low, e.high)
    if math.isnan(e.low):
        bracket = ""
    elif e.kind == "range":
        bracket = f"<br><span class='ci'>range [{_number(e.low, digits)}, {_number(e.high, digits)}]</span>"
    else:
        bracket = f"<br><span class='ci'>[{_number(e.low, digits)}, {_number(e.high, digits)}]</span>"
    return f"<td class='{'best' if best else ''}'>{_number(e.value, digits)}{bracket}</td>"


def _figure(figure: Figure) -> str:
    data = base64.b64encode(figure.png).decode("ascii")
    return (f"<figure><img src='data:image/png;base64,{data}' width='{figure.width}' height='{figure.height}' "
            f"alt='{_e(figure.title)}'><figcaption><span class='badge {figure.kind}'>{figure.kind}</span>"
            f"<b>{_e(figure.title)}.</b> {_e(figure.caption)}</figcaption></figure>")


def _envs_of(combination) -> tuple[str, ...]:
    return tuple(dict.fromkeys(run.env for run in combination.runs))


def _best(estimates: list[Estimate], measure: Measure, combinations: list | None = None) -> set[int]:
    """The combinations to bold: in each environment, the best IQM, only when its interval (or range)
    is apart from every other combination's of that environment, every side has MIN_COMPARE_RUNS
    runs or more, and the values differ as printed. Raw values of different environments (Taxi's 7.9,
    FrozenLake's 0.7) are never compared."""
    shown = [(i, e) for i, e in enumerate(estimates) if not math.isnan(e.value)]
    by_env: dict[tuple[str, ...], list[tuple[int, Estimate]]] = {}
    for i, e in shown:
        by_env.setdefault(_envs_of(combinations[i]) if combinations else (), []).append((i, e))
    chosen = set()
    pick = max if measure.higher_is_better else min
    for items in by_env.values():
        if len(items) < 2 or too_few(*(e for _, e in items)):
            continue
        index, best = pick(items, key=lambda item: item[1].value)
        if all(best.separated_from(e) and not printed_equal(measure, best, e) for i, e in items if i != index):
            chosen.add(index)
    return chosen


def _small_sample_note(group: Group) -> str:
    sizes = [len(c.runs) for c in group.combinations if c.runs]
    n = min(sizes, default=0)
    envs = len(group.envs())
    bold = (" Bold: the best IQM of its environment, only when its interval lies apart from every other "
            "combination's there." if envs > 1 else
            " Bold: the best IQM, only when its interval lies apart from every other combination's.")
    if not n or n >= MIN_RUNS:
        coverage = coverage_words(n)
        return (" Below each IQM, its 95 % stratified bootstrap interval (scipy, percentile method)"
                + (f"; {_e(coverage)}" if coverage else "") + "." + bold)
    trims = trimmed_per_end(n)
    text = (f" With fewer than {MIN_RUNS} seeds (here as few as {n}) a bootstrap interval is about the runs' min..max "
            f"and covers far less than 95 %, so below each IQM is the <b>range</b> of the runs, not an interval; the "
            f"IQM of {n} runs trims {trims} run{'s' if trims != 1 else ''} at each end"
            + (" (it is the mean)" if trims == 0 else "") + ".")
    if n < MIN_COMPARE_RUNS:
        return text + (f" With {n} run(s) a range is no spread: nothing is bold, too few runs to compare "
                       f"(at least {MIN_COMPARE_RUNS}).")
    return text + bold.replace("interval", "range")


def comparison_table(group: Group, found: list[Measure]) -> str:
    rows = []
    per_measure = {m.key: [estimate(m, c, group) for c in group.combinations] for m in found}
    best = {m.key: _best(per_measure[m.key], m, group.combinations) for m in found}
    for index, combination in enumerate(group.combinations):
        cells = "".join(_estimate_cell(per_measure[m.key][index], m.digits, index in best[m.key]) for m in found)
        status = f"{len(combination.runs)}"
        if combination.incomplete:
            status += f" <span class='fail'>+{len(combination.incomplete)} incomplete</span>"
        if combination.failures:
            status += f" <span class='fail'>+{len(combination.failures)} failed</span>"
        rows.append(f"<tr><td class='name'>{_e(combination.label)}</td><td>{status}</td>{cells}</tr>")
    head = "".join(f"<th>{_e(m.label)}{' ↑' if m.higher_is_better else ' ↓'}</th>" for m in found)
    return (_wide(f"<table><tr><th class='name'>combination</th><th>runs</th>{head}</tr>{''.join(rows)}</table>")
            + "<p class='meta'>Each cell: the interquartile mean (IQM) over seeds." + _small_sample_note(group)
            + " ↑ higher is better, ↓ lower.</p>")


def improvement_table(group: Group, measure: Measure) -> str:
    from rlbench.report.aggregate import verdict_combinations

    combos = verdict_combinations(group)
    if len(combos) < 2:
        return ""
    head = "".join(f"<th>{_e(c.label)}</th>" for c in combos)
    rows = []
    for row in combos:
        cells = []
        for column in combos:
            if row is column:
                cells.append("<td>–</td>")
                continue
            p = probability_of_improvement(*paired_values(measure, row, column, group, group),
                                           higher_is_better=measure.higher_is_better)
            cells.append(_probability_cell(p))
        rows.append(f"<tr><td class='name'>{_e(row.label)}</td>{''.join(cells)}</tr>")
    return (f"<h3>P(row beats column): {_e(measure.label)} <span class='clock'>({_e(clock_words(measure))})</span></h3>"
            + _wide(f"<table><tr><th class='name'>row \\ column</th>{head}</tr>{''.join(rows)}</table>"))


def _probability_cell(p: Estimate) -> str:
    verdict = "better" if p.low > 0.5 else ("worse" if p.high < 0.5 else "")
    ci = "" if math.isnan(p.low) else f"<br><span class='ci'>[{p.low:.2f}, {p.high:.2f}]</span>"
    return f"<td class='{verdict}'>{_number(p.value, 2)}{ci}</td>"


def verdict_box(group: Group, found: list[Measure]) -> str:
    """The study's verdict on its default clock (env steps to the target, else the final return):
    the best IQM against each other combination, by the probability of improvement."""
    from rlbench.report.aggregate import verdict_combinations

    primary = default_measure(found)
    combos = verdict_combinations(group)
    if primary is None or len(combos) < 2:
        return ""
    estimates = [estimate(primary, c, group) for c in combos]
    shown = [(c, e) for c, e in zip(combos, estimates) if not math.isnan(e.value)]
    if not shown:
        return ""
    pick = max if primary.higher_is_better else min
    leader, _ = pick(shown, key=lambda item: item[1].value)
    items = []
    for other in combos:
        if other is leader:
            continue
        p = probability_of_improvement(*paired_values(primary, leader, other, group, group),
                                       higher_is_better=primary.higher_is_better)
        p_text = f"{p.value:.2f}" + ("" if math.isnan(p.low) else f" [{p.low:.2f}, {p.high:.2f}]")
        items.append(f"<li>{_e(leader.label)} vs {_e(other.label)}: P = {p_text} — "
                     f"<b>{_e(improvement_verdict(p, leader.label, other.label))}</b></li>")
    return (f"<div class='verdict'><b>Verdict — {_e(clock_words(primary))}</b> ({_e(primary.label)}; "
            f"{'lower' if not primary.higher_is_better else 'higher'} is better). Best IQM: {_e(leader.label)}."
            f"<ul>{''.join(items)}</ul><span class='meta'>Default clock: env steps, so that a loaded machine does not "
            "decide it; the tables below name their own clock.</span></div>")


def cost_table(group: Group, found: list[Measure]) -> str:
    """What reaching the target costs: CPU-seconds, joules and dollars, each IQM over seeds."""
    if not group.has_target:
        return ""
    keys = ["steps_to_target", "cpu_to_target_s", "dollars_to_target"]
    shown = [m for key in keys for m in found if m.key == key]
    shown += [m for m in found if m.key.startswith("energy_to_target_")]
    notes = []
    measured, absent = energy_meters(group)
    for meter, why in absent.items():
        notes.append(f"energy ({meter}): absent — {why}")
    if not measured and not absent:
        notes.append("energy: absent — no meter reported")
    unpriced = unpriced_devices(group)
    if unpriced:
        notes.append(f"USD: no price for {', '.join(unpriced)} (rlbench report --price cpu=USD_PER_CPU_HOUR"
                     + "".join(f" --price {d}=USD_PER_HOUR" for d in unpriced if d != "cpu") + ")")
    if not shown:
        return ""
    return ("<h3><span class='badge measured'>measured</span>Cost to the target</h3>" + comparison_table(group, shown)
            + "".join(f"<p class='meta absent'>{_e(n)}</p>" for n in notes))


def aggregate_section(group: Group, figures: dict[str, Figure]) -> str:
    from rlbench.report.aggregate import aggregate_estimates, available, improvement, methods, shown_aggregates
    from rlbench.report.measures import normalisation

    why = available(group)
    if len(group.envs()) < 2:
        return ""
    if why:
        return f"<h3>Aggregates over environments</h3><div class='warn'>not drawn: {_e(why)}</div>"
    rows = aggregate_estimates(group)
    name, one = normalisation(group)
    columns, merged = shown_aggregates(group)
    head = "".join(f"<th>{_e(title)}{' ↓' if key == 'optimality gap' else ' ↑'}</th>" for title, key in columns)
    body = "".join(f"<tr><td class='name'>{_e(m.label)}</td>"
                   + "".join(_estimate_cell(est[key], 2, False) for _, key in columns) + "</tr>" for m, est in rows)
    scores = "; ".join(f"{env}: random {group.reference_scores[env].random:g}, reference "
                       f"{group.reference_scores[env].reference:g} ({group.reference_scores[env].source})"
                       for env in group.envs())
    kinds = {est[key].kind for _, est in rows for _, key in columns}
    brackets = ("Below each, its 95 % stratified bootstrap interval" if kinds == {"ci"} else
                f"Below each, its 95 % stratified bootstrap interval, or with fewer than {MIN_RUNS} runs in an "
                "environment (no interval) its <b>range</b>: the aggregate of every environment's worst run to that "
                "of every environment's best")
    parts = ["<h3><span class='badge measured'>measured</span>Aggregates over environments</h3>",
             _wide(f"<table><tr><th class='name'>method</th>{head}</tr>{body}</table>"),
             f"<p class='meta'>{name.capitalize()} final greedy score (score − random) / ({one} − random): 0 is a "
             f"uniform random policy's score, 1 the {one}'s. {_e(scores)}. {brackets}."
             + (f" {_e(merged)}" if merged else "") + "</p>"]
    parts += [_figure(figures[k]) for k in ("aggregates",) if k in figures]
    found = methods(group)
    if len(found) > 1:
        cells = "".join(f"<th>{_e(m.label)}</th>" for m in found)
        matrix = "".join(f"<tr><td class='name'>{_e(x.label)}</td>"
                         + "".join("<td>–</td>" if x is y else _probability_cell(improvement(group, x, y)) for y in found)
                         + "</tr>" for x in found)
        parts.append(f"<h3>P(row beats column) over environments: {name} final score</h3>"
                     + _wide(f"<table><tr><th class='name'>row \\ column</th>{cells}</tr>{matrix}</table>")
                     + "<p class='meta'>The probability that a run of the row beats a run of the column on the same "
                     "environment, averaged over the environments (Agarwal et al.), with its stratified bootstrap "
                     "interval.</p>")
    return "".join(parts)


def modelled_table(group: Group) -> str:
    found = modelled_measures(group)
    if not found:
        return ""
    return ("<h3><span class='badge modelled'>modelled</span>Modelled figures (predictions, not measurements)</h3>"
            + comparison_table(group, found))


def _fingerprint_rows(fingerprint: dict[str, Any]) -> str:
    memory = fingerprint.get("memory_bytes")
    rows = [("host", fingerprint.get("hostname")), ("CPU", fingerprint.get("cpu")),
            ("cores (usable)", f"{fingerprint.get('cores')} ({fingerprint.get('cores_usable')})"),
            ("memory", f"{memory / 2**30:.1f} GiB" if isinstance(memory, (int, float)) else "–"),
            ("OS", fingerprint.get("os")), ("Python", fingerprint.get("python")),
            ("packages", ", ".join(f"{k} {v}" for k, v in (fingerprint.get("packages") or {}).items() if v)),
            ("thread settings", ", ".join(f"{k}={v}" for k, v in (fingerprint.get("threads_env") or {}).items()) or "–")]
    for plugin, data in (fingerprint.get("plugins") or {}).items():
        if isinstance(data, dict):
            shown = {k: v for k, v in data.items() if not isinstance(v, (dict, list)) and v is not None}
            rows.append((f"plugin {plugin}", "; ".join(f"{k}={v}" for k, v in shown.items())))
    return "".join(f"<tr><th class='name'>{_e(k)}</th><td class='name'>{_e(v)}</td></tr>" for k, v in rows)


def _devices(group: Group) -> list[str]:
    seen = []
    for run in group.runs():
        replay = run.data.get("replay_stats") or {}
        device = replay.get("device") if isinstance(replay, dict) else None
        if isinstance(device, dict):
            text = f"replay {run.data['config'].get('replay')}: {device.get('device')} ({device.get('platform')})"
            if device.get("emulation"):
                text += f", emulated: {device.get('emulation_kind') or 'yes'}"
            seen.append(text)
    return list(dict.fromkeys(seen))


def _status(group: Group) -> str:
    items = []
    for combination in group.combinations:
        for run in combination.incomplete:
            items.append(f"<li>{_e(combination.label)}, seed {_e(run.data['config'].get('seed'))}: incomplete "
                         f"({_e(run.data.get('status_reason'))}) — <code>{_e(run.path)}</code></li>")
        for failure in combination.failures:
            items.append(f"<li class='fail'>{_e(combination.label)}, seed {_e(failure.study.get('seed'))}: failed: "
                         f"{_e(failure.reason)} — <code>{_e(failure.path)}</code></li>")
    if not items:
        return ""
    return ("<h3>Cells not in the statistics</h3><ul>" + "".join(items) + "</ul>"
            "<p class='meta'>Rerun the study (<code>rlbench sweep OUT/study.toml</code>) to run them again.</p>")


def _warnings(group: Group) -> str:
    notes = []
    if group.concurrent_cells > 1:
        notes.append(f"cells ran {group.concurrent_cells} at a time on one machine: their throughput and latency "
                     "figures share its cores.")
    if len(fingerprints(group.all_runs())) > 1:
        notes.append("runs came from more than one machine (see the fingerprints below).")
    boxes = "".join(f"<div class='warn'>{_e(n)}</div>" for n in notes)
    contended = contention_lines([group])
    if contended:  # one box for the study: every contended run, whatever the reason
        head, *runs = contended
        boxes += (f"<div class='warn contended'>{_e(head)}<ul>"
                  + "".join(f"<li>{_e(line.strip())}</li>" for line in runs) + "</ul></div>")
    return boxes


def _targets_text(group: Group) -> str:
    if not group.has_target:
        return ("; no target return set (<code>[sweep] target_return</code> or <code>--target</code>), so nothing "
                "is measured to a target")
    if isinstance(group.target_return, dict):
        target = "target returns " + ", ".join(f"{env} {value:g}" for env, value in group.target_return.items())
    else:
        target = f"target return {group.target_return:g}"
    return f"; {_e(target)}, {_e(target_rule(group))}"


def study_section(group: Group) -> str:
    found = measures(group)
    seeds = sorted({run.data["config"].get("seed") for run in group.all_runs()}, key=str)
    parts = [f"<h2>{_e(group.name)}</h2>",
             f"<p class='meta'>{len(group.combinations)} combination(s)"
             + (f" over {_e(', '.join(group.axes))}" if group.axes else "")
             + f"; seeds {_e(', '.join(map(str, seeds)))}; {len(group.runs())} complete run(s)"
             + _targets_text(group) + ".</p>", _warnings(group), verdict_box(group, found)]
    figures = study_figures(group)
    if found:
        parts.append("<h3><span class='badge measured'>measured</span>Comparison</h3>" + comparison_table(group, found))
    parts += [_figure(figures[k]) for k in ("learning", "evaluation") if k in figures]
    if found:
        primary = default_measure(found)
        order = [m for m in [primary] if m is not None]
        order += [m for key in ("final_return", "env_steps_per_s", "time_to_target_s") for m in found
                  if m.key == key and m is not primary]
        matrices = [improvement_table(group, m) for m in order]
        if any(matrices):
            parts.append("<div class='row'>" + "".join(f"<div>{t}</div>" for t in matrices if t) + "</div>"
                         "<p class='meta'>P(row beats column): the probability that a run of the row's combination "
                         "beats a run of the column's on the same environment (ties count half; averaged over the "
                         "environments where env is an axis), with its 95 % "
                         f"bootstrap interval (none with fewer than {MIN_RUNS} runs); green: the interval lies above "
                         "0.5, red: below. Each heading names the clock it counts.</p>")
    parts.append(cost_table(group, found))
    parts.append(aggregate_section(group, figures))
    parts += [_figure(figures[k]) for k in ("profile",) if k in figures]
    parts.append(modelled_table(group))
    parts.append(_status(group))
    parts += [_figure(f) for k, f in figures.items() if k not in ("learning", "evaluation", "aggregates", "profile")]
    devices = _devices(group)
    if devices:
        parts.append("<h3>Devices</h3><ul>" + "".join(f"<li>{_e(d)}</li>" for d in devices) + "</ul>")
    for index, fingerprint in enumerate(fingerprints(group.all_runs())):
        parts.append(f"<details{' open' if index == 0 else ''}><summary>Machine fingerprint"
                     f"{'' if index == 0 else f' #{index + 1}'}</summary><table>{_fingerprint_rows(fingerprint)}</table></details>")
    return "\n".join(p for p in parts if p)


def build(inputs: Inputs, groups: list[Group], *, asv_pattern: str | None = None,
          title: str = "rlbench report") -> str:
    sections = [study_section(group) for group in groups]
    bench = [f for f in [transport_sizes(inputs), *asv_history(inputs, asv_pattern)] if f is not None]
    if bench:
        sections.append("<h2>Micro-benchmarks</h2>" + "".join(_figure(f) for f in bench))
    if inputs.skipped:
        sections.append("<details><summary>Files not read (" + str(len(inputs.skipped)) + ")</summary><ul>"
                        + "".join(f"<li><code>{_e(p)}</code>: {_e(why)}</li>" for p, why in inputs.skipped)
                        + "</ul></details>")
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    summary = (f"{len(inputs.runs)} result(s) in {len(groups)} stud{'y' if len(groups) == 1 else 'ies'}"
               + (f", {len(inputs.asv_results)} asv result file(s)" if inputs.asv_results else "")
               + f"; generated {stamp}")
    return (f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{_e(title)}</title>"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'><style>{STYLE}</style></head>"
            f"<body><main><h1>{_e(title)}</h1><p class='meta'>{_e(summary)}. Figures marked "
            f"<span class='badge measured'>measured</span> hold measurements only, "
            f"<span class='badge modelled'>modelled</span> ones model predictions only.</p>"
            + "\n".join(sections) + "</main></body></html>")
