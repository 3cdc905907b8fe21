"""The report's figures, drawn with matplotlib (Agg, no display) into PNG bytes. Each figure is
labelled `measured` or `modelled` and never holds both."""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlbench.report.collect import Combination, Group, Inputs, Run
from rlbench.report.measures import estimate, flat, measures, modelled_measures, normalisation, values

MAX_LINES = 10  # per panel of the asv history: more is unreadable


@dataclass
class Figure:
    title: str
    caption: str
    kind: str  # "measured" | "modelled"
    png: bytes
    width: int
    height: int
    source: Any = field(default=None, repr=False, compare=False)  # the matplotlib figure it was drawn from


def _new(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure as MplFigure

    figure = MplFigure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _png(figure, title: str, caption: str, kind: str) -> Figure:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    width, height = (int(round(v)) for v in figure.get_size_inches() * figure.dpi)
    return Figure(title, caption, kind, buffer.getvalue(), width, height, figure)


def _colour(index: int):
    from matplotlib import colormaps

    return colormaps["tab10"](index % 10)


def _outside_legend(figure, handles: list, labels: list[str], loc: str, most: int):
    """A figure legend outside the panels in as many columns (up to `most`) as fit the figure's
    width: a wider legend is cut at the figure's edges when saved. Labels longer than the figure is
    wide wrap onto more lines."""
    import textwrap

    width = figure.get_figwidth() * figure.dpi
    renderer = figure.canvas.get_renderer()
    chars = max(16, int(figure.get_figwidth() * 14))  # about what fits of 8-point text, per inch
    labels = [textwrap.fill(str(label), chars) for label in labels]
    for columns in range(max(1, min(most, len(labels))), 0, -1):
        legend = figure.legend(handles, labels, loc=loc, ncols=columns, fontsize=8)
        if legend.get_window_extent(renderer).width <= 0.98 * width or columns == 1:
            return legend
        legend.remove()
    return None


def _style(ax) -> None:
    ax.grid(True, alpha=0.3)
    ax.spines[["top", "right"]].set_visible(False)


# ------------------------------------------------------------------------------- learning curves
def _moving_mean(values: np.ndarray, window: int) -> np.ndarray:
    """Mean of the last `window` values at each point (fewer at the start)."""
    sums = np.cumsum(np.insert(values, 0, 0.0))
    ends = np.arange(1, values.size + 1)
    starts = np.maximum(0, ends - window)
    return (sums[ends] - sums[starts]) / (ends - starts)


def _curve(run: Run, x_key: str, window: int) -> tuple[np.ndarray, np.ndarray] | None:
    points = [p for p in run.data.get("learning_curve") or []
              if isinstance(p, dict) and isinstance(p.get(x_key), (int, float)) and isinstance(p.get("return"), (int, float))]
    if len(points) < 2:
        return None
    x = np.array([p[x_key] for p in points], dtype=np.float64)
    y = _moving_mean(np.array([p["return"] for p in points], dtype=np.float64), window)
    return x, y


def _draw_band(ax, curves: list[tuple[np.ndarray, np.ndarray]], colour, label: str) -> str | None:
    """The IQM over runs of curves sampled at their own x, on a common grid, with its band; returns
    the band's kind ("ci" or "range") or None when nothing could be drawn."""
    from rlbench.report.stats import curve_band

    if not curves:
        return None
    # from where every run has a point to where the last one ends; a run that ended earlier holds
    # its last value (np.interp clamps), as a finished run's policy does
    low, high = max(c[0][0] for c in curves), max(c[0][-1] for c in curves)
    if not high > low:
        return None
    grid = np.linspace(low, high, 150)
    matrix = np.stack([np.interp(grid, x, y) for x, y in curves])
    centre, band_low, band_high, kind = curve_band(matrix)
    ax.plot(grid, centre, color=colour, lw=1.8, label=f"{label} (n={len(curves)})")
    if len(curves) > 1:
        ax.fill_between(grid, band_low, band_high, color=colour, alpha=0.2, lw=0)
    return kind


def _band_words(kinds: set[str]) -> str:
    if kinds == {"ci"}:
        return "the band its 95 % bootstrap interval"
    if kinds == {"range"}:
        return "the band the range of the runs (fewer than 5 seeds: no interval)"
    return "the band its 95 % bootstrap interval, or the range of the runs where fewer than 5 seeds ran"


def _method_label(group: Group, combination: Combination) -> str:
    """A combination's label without its environment: the line's name within an environment's panel."""
    others = [a for a in group.axes if a != "env"]
    if "env" not in group.axes:
        return combination.label
    return " ".join(f"{a}={combination.values.get(a)}" for a in others) or "all runs"


def _target_line(ax, target: float) -> None:
    """A dashed target line, labelled on the line itself (the legend holds the combinations)."""
    ax.axhline(target, color="0.4", ls="--", lw=1)
    ax.text(0.99, target, f"target {target:g}", transform=ax.get_yaxis_transform(), ha="right", va="bottom",
            fontsize=7, color="0.3")


def _curve_panels(group: Group, read, y_label: str, title: str, what: str) -> Figure | None:
    """Per environment a row of two panels (against env steps, against training wall time), each with
    its own y-axis and target, one line per combination: returns of different environments are not on
    one scale (Taxi's -200..8 would flatten FrozenLake's 0..1)."""
    envs = group.envs() or [""]
    figure = _new(11, 3.6 * len(envs) + 0.2)
    axes = figure.subplots(len(envs), 2, sharey="row", squeeze=False)
    kinds: set[str] = set()
    colours = {label: index for index, label in enumerate(dict.fromkeys(_method_label(group, c)
                                                                         for c in group.combinations))}
    for row, env in zip(axes, envs):
        for combination in group.combinations:
            runs = [run for run in combination.runs if not env or run.env == env]
            label = _method_label(group, combination)
            for ax, x_key, x_label in ((row[0], "step", "env steps"), (row[1], "time_s", "training wall time (s)")):
                kind = _draw_band(ax, [c for c in (read(run, x_key) for run in runs) if c], _colour(colours[label]),
                                  label)
                if kind:
                    kinds.add(kind)
                ax.set_xlabel(x_label)
        target = group.target_for(env) if env else None
        for ax in row:
            _style(ax)
            if target is not None:
                _target_line(ax, target)
        row[0].set_ylabel(y_label, fontsize=9)
        if len(envs) > 1:
            row[0].set_title(env, fontsize=10, loc="left")
        if row[0].get_legend_handles_labels()[0]:
            row[0].legend(fontsize=8, loc="best")
    if not kinds:
        return None
    targets = [(env, group.target_for(env)) for env in envs if env and group.target_for(env) is not None]
    figure.suptitle(f"{title}: IQM over seeds with {'95 % bootstrap band' if kinds == {'ci'} else 'band'}", fontsize=11)
    return _png(figure, title.capitalize(),
                f"{what} against env steps and against training wall time"
                + (f", one row of panels per environment ({len(envs)}), each on its own scale" if len(envs) > 1 else "")
                + f"; the line is the IQM over seeds at each point, {_band_words(kinds)}; a run that ended earlier "
                "holds its last value"
                + (f"; dashed and labelled: the target{'s' if len(targets) > 1 else ''} "
                   + ", ".join((f"{env} {t:g}" if len(envs) > 1 else f"{t:g}") for env, t in targets)
                   if targets else "") + ".", "measured")


def learning_curves(group: Group) -> Figure | None:
    def read(run: Run, x_key: str):
        return _curve(run, x_key, group.target_window)

    return _curve_panels(group, read, f"training return (mean of last {group.target_window} episodes)",
                         "learning curves", "Training return (exploration on)")


def evaluation_curves(group: Group) -> Figure | None:
    """--eval-every's greedy returns against env steps and wall time."""
    from rlbench.report.measures import evaluation_points

    def read(run: Run, x_key: str):
        points = [p for p in evaluation_points(run) if isinstance(p.get(x_key), (int, float))]
        if len(points) < 2:
            return None
        return (np.array([p[x_key] for p in points], dtype=np.float64),
                np.array([p["return"] for p in points], dtype=np.float64))

    return _curve_panels(group, read, "greedy return (evaluation episodes)", "evaluation curves",
                         "Greedy return of the learner's weights at each --eval-every point (episodes on a separate "
                         "environment copy)")


# --------------------------------------------------------------------------------- latency CDFs
def _merged(combination: Combination, op: str):
    from rlbench.metrics import Histogram

    merged = Histogram()
    for run in combination.runs:
        data = (run.data.get("latency_histograms") or {}).get(op)
        if isinstance(data, dict):
            try:
                merged.merge(Histogram.from_dict(data))
            except (ValueError, KeyError, TypeError):
                continue  # another bucket layout or a damaged histogram: not drawn
    return merged


def _cdf(histogram) -> tuple[np.ndarray, np.ndarray]:
    from rlbench.metrics import bucket_bounds

    indices = [i for i, c in enumerate(histogram.counts) if c]
    counts = np.array([histogram.counts[i] for i in indices], dtype=np.float64)
    upper_us = np.array([bucket_bounds(i)[1] for i in indices], dtype=np.float64) / 1e3
    return upper_us, np.cumsum(counts) / counts.sum()


def latency_cdfs(group: Group) -> Figure | None:
    ops = sorted({op for run in group.runs() for op in (run.data.get("latency_histograms") or {})})
    if not ops:
        return None
    columns = 3 if len(ops) > 4 else len(ops)
    rows = math.ceil(len(ops) / columns)
    figure = _new(4.0 * columns, 2.5 * rows + 0.8)
    axes = np.atleast_1d(figure.subplots(rows, columns, squeeze=False)).ravel()
    handles = {}
    for ax, op in zip(axes, ops):
        for index, combination in enumerate(group.combinations):
            histogram = _merged(combination, op)
            if not histogram.count:
                continue
            x, y = _cdf(histogram)
            (line,) = ax.step(x, y, where="post", color=_colour(index), lw=1.4)
            handles.setdefault(combination.label, line)
        ax.set_xscale("log")
        ax.set_ylim(0, 1.02)
        ax.set_title(op, fontsize=9)
        ax.tick_params(labelsize=8)
        _style(ax)
    for ax in axes[len(ops):]:
        ax.set_visible(False)
    for ax in axes[::columns]:
        ax.set_ylabel("fraction", fontsize=8)
    for ax in axes[len(ops) - columns:len(ops)]:
        ax.set_xlabel("latency (us)", fontsize=8)
    _outside_legend(figure, list(handles.values()), list(handles), "outside upper center", 4)
    return _png(figure, "Latency CDFs",
                "Every replay, transport, inference and learner operation as its caller saw it: cumulative fraction of "
                "calls against latency (log scale), from the lossless histograms merged over the seeds of each "
                "combination.", "measured")


# ------------------------------------------------------------------------------------- scaling
def scaling(group: Group) -> Figure | None:
    """Env steps/s against the number of actors, one line per combination of the other axes."""
    if "actors" not in group.axes:
        return None
    rate = next((m for m in measures(group) if m.key == "env_steps_per_s"), None)
    steady = next((m for m in measures(group) if m.key == "steady_env_steps_per_s"), None)
    if rate is None:
        return None
    panels = [m for m in (rate, steady) if m is not None]
    figure = _new(5.5 * len(panels), 3.8)
    axes = np.atleast_1d(figure.subplots(1, len(panels)))
    others = [a for a in group.axes if a != "actors"]
    lines: dict[str, list[Combination]] = {}
    for combination in group.combinations:
        label = " ".join(f"{a}={combination.values.get(a)}" for a in others) or "all runs"
        lines.setdefault(label, []).append(combination)
    for ax, measure in zip(axes, panels):
        for index, (label, members) in enumerate(lines.items()):
            points = sorted((c.values.get("actors"), estimate(measure, c, group)) for c in members
                            if isinstance(c.values.get("actors"), int) and c.runs)
            if not points:
                continue
            x = np.array([p[0] for p in points], dtype=np.float64)
            y = np.array([p[1].value for p in points])
            err = np.array([[max(0.0, p[1].value - p[1].low) if math.isfinite(p[1].low) else 0.0 for p in points],
                            [max(0.0, p[1].high - p[1].value) if math.isfinite(p[1].high) else 0.0 for p in points]])
            ax.errorbar(x, y, yerr=err, marker="o", capsize=3, color=_colour(index), label=label)
        ax.set_xlabel("actors")
        ax.set_ylabel(measure.label)
        _style(ax)
        ax.legend(fontsize=8)
    return _png(figure, "Scaling with actors",
                "IQM over seeds with 95 % bootstrap intervals, against the number of actor processes.", "measured")


def performance_profile(group: Group) -> Figure | None:
    """Agarwal et al.'s performance profile: the fraction of runs whose score exceeds each threshold,
    with its stratified bootstrap band; over normalised scores per method when the study can be
    aggregated over environments, else over the final greedy return per combination, one panel per
    environment (raw returns of different environments are not on one scale)."""
    from rlbench.report.aggregate import available, methods
    from rlbench.report.stats import performance_profile as profile

    envs = group.envs()
    normalised = len(envs) > 1 and not available(group)
    if normalised:
        panels = {"": {m.label: list(m.scores(group).values()) for m in methods(group)}}
        name = normalisation(group)[0]
        x_label, what = f"{name} score τ", f"{name} final score"
    else:
        measure = next((m for m in measures(group) if m.key == "final_return"), None)
        if measure is None:
            return None
        panels = {}
        for env in envs or [""]:
            lines = {}
            for c in group.combinations:
                runs = Combination(c.label, c.values, [r for r in c.runs if not env or r.env == env])
                if runs.runs:
                    lines[_method_label(group, c)] = values(measure, runs, group)
            panels[env] = lines
        x_label, what = "final greedy return τ", "final greedy return"
    colours = {label: i for i, label in enumerate(dict.fromkeys(l for lines in panels.values() for l in lines))}
    figure = _new(5.8 * len(panels), 3.8)
    axes = np.atleast_1d(figure.subplots(1, len(panels)))
    banded = drawn = False
    for ax, (env, lines) in zip(axes, panels.items()):
        finite = [v for strata in lines.values() for stratum in strata for v in stratum if math.isfinite(v)]
        if not finite:
            ax.set_visible(False)
            continue
        taus = np.linspace(min(finite), max(finite), 120) if max(finite) > min(finite) else np.array([min(finite)])
        for label, strata in lines.items():
            strata = [[v for v in stratum if math.isfinite(v)] for stratum in strata]
            strata = [s for s in strata if s]
            if not strata:
                continue
            centre, low, high = profile(strata, taus)
            ax.step(taus, centre, where="post", color=_colour(colours[label]),
                    label=f"{label} (n={sum(map(len, strata))})")
            drawn = True
            if not np.isnan(low).all():
                ax.fill_between(taus, low, high, step="post", color=_colour(colours[label]), alpha=0.2, lw=0)
                banded = True
        ax.set_xlabel(x_label)
        ax.set_ylabel("fraction of runs > τ")
        ax.set_ylim(0, 1.02)
        if env and len(panels) > 1:
            ax.set_title(env, fontsize=10)
        _style(ax)
        ax.legend(fontsize=8)
    if not drawn:
        return None
    return _png(figure, "Performance profile",
                f"Fraction of runs whose {what} exceeds each threshold τ"
                + (", every environment's runs pooled" if normalised else "")
                + (f", one panel per environment ({len(panels)})" if len(panels) > 1 else "")
                + ("; the band is its 95 % stratified bootstrap interval" if banded else
                   "; no band: fewer than 5 runs per environment") + ". A curve above another dominates it.",
                "measured")


def aggregate_intervals(group: Group) -> Figure | None:
    """rliable's interval estimates: median, IQM, mean and optimality gap of normalised final scores
    over every environment, per method, with their 95 % stratified bootstrap intervals; below 5 runs
    in an environment (no interval) their ranges, drawn hatched, so the spread shows either way."""
    from rlbench.report.aggregate import aggregate_estimates, available, shown_aggregates

    if available(group):
        return None
    rows = aggregate_estimates(group)
    if not rows:
        return None
    columns, merged = shown_aggregates(group)
    name, one = normalisation(group)
    figure = _new(3.0 * len(columns) + 1.5, 0.5 * len(rows) + 1.6)
    axes = figure.subplots(1, len(columns), sharey=True)
    kinds = set()
    for ax, (title, statistic) in zip(axes, columns):
        for index, (method, estimates) in enumerate(rows):
            e = estimates[statistic]
            if math.isfinite(e.low) and math.isfinite(e.high):
                kinds.add(e.kind)
                hatched = e.kind == "range"
                ax.barh(index, max(e.high - e.low, 1e-9), left=e.low, height=0.6, color=_colour(index),
                        alpha=0.35 if hatched else 0.75, hatch="//" if hatched else None,
                        edgecolor=_colour(index) if hatched else None)
            ax.plot([e.value, e.value], [index - 0.3, index + 0.3], color="k", lw=1.5)
        ax.set_title(title + (" ↓" if statistic == "optimality gap" else " ↑"), fontsize=10)
        ax.set_xlabel(f"{name} score")
        _style(ax)
    axes[0].set_yticks(range(len(rows)), [method.label for method, _ in rows], fontsize=8)
    axes[0].invert_yaxis()
    envs = group.envs()
    bars = ("bar: its 95 % stratified bootstrap interval" if kinds == {"ci"} else
            "bar: its 95 % stratified bootstrap interval; hatched bar, with fewer than 5 runs in an environment (no "
            "interval): its range, from the aggregate of every environment's worst run to that of every "
            "environment's best")
    return _png(figure, "Aggregates over environments",
                f"{name.capitalize()} final scores, (score − random) / ({one} − random), over {len(envs)} "
                f"environment(s) ({', '.join(envs)}): median and mean of the per-environment means, IQM of every run, "
                f"optimality gap (how far runs fall short of the {one}'s score; lower is better)."
                + (f" {merged}" if merged else "") + f" Black tick: the estimate; {bars}.", "measured")


def modelled(group: Group) -> Figure | None:
    """The runs' modelled figures (e.g. predicted hardware time), apart from every measured one."""
    from rlbench.report.stats import interval

    found = modelled_measures(group)
    if not found:
        return None
    figure = _new(max(5.0, 1.2 * len(found) * len(group.combinations) / 2 + 3), 3.6)
    ax = figure.subplots()
    width = 0.8 / max(1, len(group.combinations))
    for index, combination in enumerate(group.combinations):
        estimates = [interval(flat(m, combination, group)) for m in found]
        x = np.arange(len(found)) + index * width
        ax.bar(x, [e.value for e in estimates], width, color=_colour(index), label=combination.label)
    ax.set_xticks(np.arange(len(found)) + width * (len(group.combinations) - 1) / 2, [m.label for m in found],
                  rotation=20, ha="right", fontsize=8)
    ax.set_yscale("log")
    _style(ax)
    ax.legend(fontsize=8)
    return _png(figure, "Modelled figures",
                "Predictions of hardware time by the plugins' models (IQM over seeds): modelled, not measured.",
                "modelled")


def time_split(group: Group) -> Figure | None:
    """Where each role's steady window went (env, inference, learner, replay, ...), as shares of the
    window, averaged over seeds: one bar per combination and role."""
    bars: list[tuple[str, dict[str, float]]] = []
    categories: list[str] = []
    for combination in group.combinations:
        shares: dict[str, dict[str, list[float]]] = {}
        for run in combination.runs:
            split = run.data.get("time_split") or (run.data.get("loop") or {}).get("time_split") or {}
            for role, parts in split.items() if isinstance(split, dict) else ():
                window = parts.get("window_s") if isinstance(parts, dict) else None
                if not isinstance(window, (int, float)) or window <= 0:
                    continue
                for key, seconds in parts.items():
                    if key != "window_s" and not key.endswith("_share") and isinstance(seconds, (int, float)):
                        shares.setdefault(role, {}).setdefault(key, []).append(seconds / window)
                        categories.append(key)
        for role, parts in shares.items():
            bars.append((f"{combination.label} · {role}", {k: float(np.mean(v)) for k, v in parts.items()}))
    if not bars:
        return None
    categories = list(dict.fromkeys(categories))
    figure = _new(9, 0.45 * len(bars) + 2.0)
    ax = figure.subplots()
    left = np.zeros(len(bars))
    for index, category in enumerate(categories):
        widths = np.array([parts.get(category, 0.0) for _, parts in bars])
        ax.barh(range(len(bars)), widths, left=left, color=_colour(index), label=category)
        left += widths
    ax.set_yticks(range(len(bars)), [label for label, _ in bars], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, max(1.0, float(left.max())))
    ax.set_xlabel("share of the steady window (mean over seeds)")
    handles, labels = ax.get_legend_handles_labels()
    _outside_legend(figure, handles, labels, "outside lower center", 7)
    _style(ax)
    return _png(figure, "Where the time goes",
                "Each role's steady window split into environment, inference, learner, replay, weights, transport "
                "and rlbench's own bookkeeping, mean share over seeds.", "measured")


def study_figures(group: Group) -> dict[str, Figure]:
    """The study's figures by name, in page order; absent where the study has no data for one."""
    made = {"learning": learning_curves(group), "evaluation": evaluation_curves(group),
            "aggregates": aggregate_intervals(group), "profile": performance_profile(group),
            "scaling": scaling(group), "time_split": time_split(group), "latency": latency_cdfs(group),
            "modelled": modelled(group)}
    return {name: figure for name, figure in made.items() if figure is not None}


# ---------------------------------------------------------------------- transports and asv history
def _asv_values(data: dict[str, Any], name: str) -> list[tuple[tuple[str, ...], float]]:
    """(parameter values, value) of one benchmark in one asv result file (asv's version 2 layout)."""
    import itertools

    entry = data.get("results", {}).get(name)
    columns = data.get("result_columns") or []
    if not isinstance(entry, list) or "result" not in columns:
        return []
    row = dict(zip(columns, entry))
    results, params = row.get("result"), row.get("params") or []
    if not isinstance(results, list):
        results = [results]
    combos = list(itertools.product(*params)) if params else [()]
    return [(tuple(str(p).strip("'") for p in combo), float(v)) for combo, v in zip(combos, results)
            if isinstance(v, (int, float)) and math.isfinite(v)]


def transport_sizes(inputs: Inputs) -> Figure | None:
    """Round-trip p50 against message size per transport: from `rlbench bench transport --json` files
    and asv's bench_transport results (its latest commit)."""
    series: dict[str, list[tuple[float, float]]] = {}
    for path, data in inputs.transport_benches:
        for name, entry in data["transports"].items():
            for case in entry.get("cases") or []:
                if isinstance(case, dict) and isinstance(case.get("size"), (int, float)) and isinstance(case.get("p50_us"), (int, float)):
                    series.setdefault(f"{name} (bench)", []).append((case["size"], case["p50_us"]))
    latest = sorted(inputs.asv_results, key=lambda item: item[1].get("date") or 0)
    if latest:
        for (transport, size), value in _asv_values(latest[-1][1], "bench_transport.Transport.track_round_trip_p50"):
            series.setdefault(f"{transport} (asv {str(latest[-1][1].get('commit_hash'))[:8]})", []).append((float(size), value))
    if not series:
        return None
    figure = _new(6, 3.8)
    ax = figure.subplots()
    for index, (label, points) in enumerate(sorted(series.items())):
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", color=_colour(index), label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("round trip p50 (us)")
    _style(ax)
    ax.legend(fontsize=8)
    return _png(figure, "Transport latency against message size",
                "Request/echo round trip, median, per transport and message size.", "measured")


def asv_history(inputs: Inputs, pattern: str | None = None, per_figure: int = 9) -> list[Figure]:
    """Each micro-benchmark's value commit by commit (asv results), one panel per benchmark."""
    import re

    if not inputs.asv_results:
        return []
    ordered = sorted(inputs.asv_results, key=lambda item: (item[1].get("date") or 0, item[0]))
    commits = list(dict.fromkeys(str(data.get("commit_hash"))[:8] for _, data in ordered))
    names = sorted({name for _, data in ordered for name in data.get("results", {})})
    if pattern:
        names = [n for n in names if re.search(pattern, n)]
    panels = []
    for name in names:
        lines: dict[str, dict[int, float]] = {}
        for _, data in ordered:
            x = commits.index(str(data.get("commit_hash"))[:8])
            for params, value in _asv_values(data, name):
                lines.setdefault(" ".join(params) or "value", {})[x] = value
        if lines:
            panels.append((name, dict(sorted(lines.items())[:MAX_LINES]), len(lines) > MAX_LINES))
    figures = []
    for start in range(0, len(panels), per_figure):
        chunk = panels[start:start + per_figure]
        columns = min(3, len(chunk))
        rows = math.ceil(len(chunk) / columns)
        figure = _new(4.4 * columns, 3.0 * rows)
        axes = np.atleast_1d(figure.subplots(rows, columns, squeeze=False)).ravel()
        for ax, (name, lines, cut) in zip(axes, chunk):
            for index, (label, points) in enumerate(lines.items()):
                xs = sorted(points)
                ax.plot(xs, [points[x] for x in xs], marker="o", ms=3, color=_colour(index), label=label)
            unit = (inputs.asv_benchmarks.get(name) or {}).get("unit") or ""
            ax.set_title(name.split(".", 1)[-1] + (" (first 10 lines)" if cut else ""), fontsize=8)
            ax.set_ylabel(unit, fontsize=7)
            ax.set_xticks(range(len(commits)), commits, rotation=45, fontsize=6)
            ax.tick_params(labelsize=7)
            values = [v for points in lines.values() for v in points.values()]
            if min(values) > 0 and max(values) / min(values) > 50:
                ax.set_yscale("log")
            _style(ax)
            ax.legend(fontsize=5, loc="best")
        for ax in axes[len(chunk):]:
            ax.set_visible(False)
        figures.append(_png(figure, f"Micro-benchmark history ({start + 1}-{start + len(chunk)} of {len(panels)})",
                            "asv results, commit by commit (oldest left); one line per parameter combination.",
                            "measured"))
    return figures
