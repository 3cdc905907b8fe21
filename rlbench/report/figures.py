"""The report's figures, drawn with matplotlib (Agg, no display) into PNG bytes. Each figure is
labelled `measured` or `modelled` and never holds both."""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlbench.report.collect import Combination, Group, Inputs, Run
from rlbench.report.measures import estimate, flat, measures, modelled_measures

MAX_LINES = 10  # per panel of the asv history: more is unreadable


@dataclass
class Figure:
    title: str
    caption: str
    kind: str  # "measured" | "modelled"
    png: bytes
    width: int
    height: int


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
    return Figure(title, caption, kind, buffer.getvalue(), width, height)


def _colour(index: int):
    from matplotlib import colormaps

    return colormaps["tab10"](index % 10)


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


def learning_curves(group: Group) -> Figure | None:
    from rlbench.report.stats import curve_band

    figure = _new(11, 3.8)
    axes = figure.subplots(1, 2, sharey=True)
    drawn = False
    for index, combination in enumerate(group.combinations):
        for ax, x_key, x_label in ((axes[0], "step", "env steps"), (axes[1], "time_s", "wall time (s)")):
            curves = [c for c in (_curve(run, x_key, group.target_window) for run in combination.runs) if c]
            if not curves:
                continue
            # from where every run has a point to where the last one ends; a run that ended earlier
            # holds its last value (np.interp clamps), as a finished run's policy does
            low, high = max(c[0][0] for c in curves), max(c[0][-1] for c in curves)
            if not high > low:
                continue
            grid = np.linspace(low, high, 150)
            matrix = np.stack([np.interp(grid, x, y) for x, y in curves])
            centre, band_low, band_high = curve_band(matrix)
            colour = _colour(index)
            ax.plot(grid, centre, color=colour, lw=1.8, label=f"{combination.label} (n={len(curves)})")
            if len(curves) > 1:
                ax.fill_between(grid, band_low, band_high, color=colour, alpha=0.2, lw=0)
            ax.set_xlabel(x_label)
            drawn = True
    if not drawn:
        return None
    for ax in axes:
        _style(ax)
        if group.target_return is not None:
            ax.axhline(group.target_return, color="0.4", ls="--", lw=1)
    axes[0].set_ylabel(f"training return (mean of last {group.target_window} episodes)")
    axes[0].legend(fontsize=8, loc="best")
    figure.suptitle("learning curves: IQM over seeds, 95 % bootstrap band", fontsize=11)
    return _png(figure, "Learning curves",
                "Training return against env steps and against wall time; the line is the IQM over seeds at each "
                "point, the band its 95 % bootstrap interval; a run that ended earlier holds its last value" + (f"; dashed: the target {group.target_return:g}"
                                                                 if group.target_return is not None else "") + ".",
                "measured")


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
    figure.legend(list(handles.values()), list(handles), loc="outside upper center", ncols=min(4, len(handles)),
                  fontsize=8)
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
    """Fraction of runs whose final greedy return exceeds each threshold (Agarwal et al.'s profile)."""
    measure = next((m for m in measures(group) if m.key == "final_return"), None)
    if measure is None:
        return None
    scores = {c.label: np.array([v for v in flat(measure, c, group) if math.isfinite(v)]) for c in group.combinations}
    everything = np.concatenate([s for s in scores.values() if s.size] or [np.zeros(1)])
    taus = np.linspace(everything.min(), everything.max(), 200) if everything.size else np.zeros(1)
    figure = _new(5.5, 3.6)
    ax = figure.subplots()
    for index, (label, values) in enumerate(scores.items()):
        if values.size:
            ax.step(taus, [(values > tau).mean() for tau in taus], where="post", color=_colour(index),
                    label=f"{label} (n={values.size})")
    ax.set_xlabel("final greedy return τ")
    ax.set_ylabel("fraction of runs > τ")
    ax.set_ylim(0, 1.02)
    _style(ax)
    ax.legend(fontsize=8)
    return _png(figure, "Performance profile",
                "Fraction of runs (over seeds) whose final greedy return exceeds each threshold: a curve above "
                "another dominates it.", "measured")


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
    figure.legend(fontsize=8, ncols=min(7, len(categories)), loc="outside lower center")
    _style(ax)
    return _png(figure, "Where the time goes",
                "Each role's steady window split into environment, inference, learner, replay, weights, transport "
                "and rlbench's own bookkeeping, mean share over seeds.", "measured")


def study_figures(group: Group) -> list[Figure]:
    return [f for f in (learning_curves(group), performance_profile(group), scaling(group), time_split(group),
                        latency_cdfs(group), modelled(group)) if f is not None]


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
