"""One self-contained HTML page: tables, figures embedded as data URIs, no script, no external
resource, so it opens offline and can be mailed or archived as a single file."""

from __future__ import annotations

import base64
import html
import math
import time
from pathlib import Path
from typing import Any

from rlbench.report.collect import Group, Inputs, fingerprints
from rlbench.report.figures import Figure, asv_history, study_figures, transport_sizes
from rlbench.report.measures import Measure, estimate, flat, measures, modelled_measures
from rlbench.report.stats import Estimate, probability_of_improvement

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
"""


def _e(value: Any) -> str:
    return html.escape(str(value))


def _number(value: float, digits: int) -> str:
    if math.isnan(value):
        return "–"
    if math.isinf(value):
        return "not reached" if value > 0 else "−∞"
    return f"{value:,.{digits}f}"


def _estimate_cell(e: Estimate, digits: int, best: bool) -> str:
    ci = "" if math.isnan(e.low) else f"<br><span class='ci'>[{_number(e.low, digits)}, {_number(e.high, digits)}]</span>"
    return f"<td class='{'best' if best else ''}'>{_number(e.value, digits)}{ci}</td>"


def _figure(figure: Figure) -> str:
    data = base64.b64encode(figure.png).decode("ascii")
    return (f"<figure><img src='data:image/png;base64,{data}' width='{figure.width}' height='{figure.height}' "
            f"alt='{_e(figure.title)}'><figcaption><span class='badge {figure.kind}'>{figure.kind}</span>"
            f"<b>{_e(figure.title)}.</b> {_e(figure.caption)}</figcaption></figure>")


def _best(estimates: list[Estimate], measure: Measure) -> int | None:
    finite = [(i, e.value) for i, e in enumerate(estimates) if math.isfinite(e.value)]
    if len(finite) < 2 and len(finite) == len([e for e in estimates if not math.isnan(e.value)]):
        return None  # nothing to choose between
    if not finite:
        return None
    pick = max if measure.higher_is_better else min
    index, value = pick(finite, key=lambda item: item[1])
    return None if sum(1 for _, v in finite if v == value) > 1 else index


def comparison_table(group: Group, found: list[Measure]) -> str:
    rows = []
    per_measure = {m.key: [estimate(m, c, group) for c in group.combinations] for m in found}
    best = {m.key: _best(per_measure[m.key], m) for m in found}
    for index, combination in enumerate(group.combinations):
        cells = "".join(_estimate_cell(per_measure[m.key][index], m.digits, best[m.key] == index) for m in found)
        status = f"{len(combination.runs)}"
        if combination.incomplete:
            status += f" <span class='fail'>+{len(combination.incomplete)} incomplete</span>"
        if combination.failures:
            status += f" <span class='fail'>+{len(combination.failures)} failed</span>"
        rows.append(f"<tr><td class='name'>{_e(combination.label)}</td><td>{status}</td>{cells}</tr>")
    head = "".join(f"<th>{_e(m.label)}{' ↑' if m.higher_is_better else ' ↓'}</th>" for m in found)
    return (f"<table><tr><th class='name'>combination</th><th>runs</th>{head}</tr>{''.join(rows)}</table>"
            "<p class='meta'>Each cell: interquartile mean over seeds, below it the 95 % stratified bootstrap "
            "interval (scipy, percentile method). Bold: the best IQM. ↑ higher is better, ↓ lower.</p>")


def improvement_table(group: Group, measure: Measure) -> str:
    combos = [c for c in group.combinations if c.runs]
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
            p = probability_of_improvement(flat(measure, row, group), flat(measure, column, group),
                                           higher_is_better=measure.higher_is_better)
            verdict = "better" if p.low > 0.5 else ("worse" if p.high < 0.5 else "")
            ci = "" if math.isnan(p.low) else f"<br><span class='ci'>[{p.low:.2f}, {p.high:.2f}]</span>"
            cells.append(f"<td class='{verdict}'>{_number(p.value, 2)}{ci}</td>")
        rows.append(f"<tr><td class='name'>{_e(row.label)}</td>{''.join(cells)}</tr>")
    return (f"<h3>P(row beats column): {_e(measure.label)}</h3>"
            f"<table><tr><th class='name'>row \\ column</th>{head}</tr>{''.join(rows)}</table>")


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
    contended: dict[str, list[str]] = {}  # one line per reason, not one per run
    runs = group.all_runs()
    for run in runs:
        state = run.data.get("machine_state")
        if isinstance(state, dict) and (state.get("contended") or state.get("warning")):
            reason = str(state.get("warning") or "").removeprefix("measured on a contended machine: ")
            contended.setdefault(reason, []).append(Path(str(run.path)).stem)
    for reason, names in contended.items():
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        notes.append(f"{len(names)} of {len(runs)} run(s) measured on a contended machine — {reason}: {shown}")
    if len(fingerprints(group.all_runs())) > 1:
        notes.append("runs came from more than one machine (see the fingerprints below).")
    return "".join(f"<div class='warn'>{_e(n)}</div>" for n in notes)


def study_section(group: Group) -> str:
    found = measures(group)
    seeds = sorted({run.data["config"].get("seed") for run in group.all_runs()}, key=str)
    parts = [f"<h2>{_e(group.name)}</h2>",
             f"<p class='meta'>{len(group.combinations)} combination(s)"
             + (f" over {_e(', '.join(group.axes))}" if group.axes else "")
             + f"; seeds {_e(', '.join(map(str, seeds)))}; {len(group.runs())} complete run(s)"
             + (f"; target return {group.target_return:g} (mean of the last {group.target_window} training episodes)"
                if group.target_return is not None else
                "; no target return set (<code>[sweep] target_return</code> or <code>--target</code>), so no time-to-target")
             + ".</p>", _warnings(group)]
    figures = study_figures(group)
    if found:
        parts.append("<h3><span class='badge measured'>measured</span>Comparison</h3>" + comparison_table(group, found))
    parts += [_figure(f) for f in figures[:1]]  # the learning curves, next to the table they explain
    if found:
        matrices = [improvement_table(group, m) for key in ("final_return", "env_steps_per_s", "time_to_target_s")
                    for m in found if m.key == key]
        if any(matrices):
            parts.append("<div class='row'>" + "".join(f"<div>{t}</div>" for t in matrices if t) + "</div>"
                         "<p class='meta'>P(row beats column): the probability that a run of the row's combination "
                         "beats a run of the column's (ties count half), with its 95 % bootstrap interval; green: the "
                         "interval lies above 0.5, red: below.</p>")
    parts.append(modelled_table(group))
    parts.append(_status(group))
    parts += [_figure(f) for f in figures[1:]]
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
