"""`rlbench upmem scale`: strong scaling over DPU counts on one dataset.

Every column is one kind of figure, and its header says which: [measured] on this host (the
emulator, the core's CPU engine, and their ratio) or [modelled] (UPMEM hardware time and anything
derived from it alone). A model is compared only with the model (efficiency against the first DPU
count) and a measurement only with a measurement (CPU time / emulator time); the modelled UPMEM
time and the measured CPU time stand side by side, never divided into one figure.
Writes scale.json and scale.csv, and scale.png when matplotlib is importable, otherwise scale.txt
with an ASCII chart.
"""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path
from typing import Any

COLUMNS = [("dpus", "DPUs", "{:d}"),
           ("emulator_s", "emulator s [measured]", "{:.4f}"),
           ("emulator_mups", "emulator M upd/s [measured]", "{:.1f}"),
           ("cpu_s", "CPU s [measured]", "{:.4f}"),
           ("cpu_over_emulator", "CPU s / emulator s [measured]", "{:.2f}"),
           ("upmem_s", "UPMEM s [modelled]", "{:.5f}"),
           ("upmem_kernel_s", "UPMEM kernel s [modelled]", "{:.5f}"),
           ("efficiency", "efficiency [modelled]", "{:.2f}")]
MEASURED = [key for key, header, _ in COLUMNS if header.endswith("[measured]")]
MODELLED = [key for key, header, _ in COLUMNS if header.endswith("[modelled]")]


def cpu_baseline(arrays: Any, S: int, A: int, fit: dict[str, Any]) -> tuple[float | None, str]:
    """The core's CPU tabular engine (exact sequential, one core) on the whole dataset."""
    from rlbench import get_registry

    try:
        engine = get_registry().get("compute", "cpu").create().tabular(S, A)
        t0 = time.perf_counter()
        engine.fit_offline(arrays, **fit)
        return time.perf_counter() - t0, "rlbench cpu compute backend, fit_offline"
    except Exception as exc:  # the baseline is optional; say why it is missing
        return None, f"unavailable: {type(exc).__name__}: {exc}"


def run_scale(*, algo: str, env_id: str, dpus_list: list[int], size: int, behaviour: str, seed: int, epochs: int,
              alpha: float, gamma: float, numeric: str, partition: str, tasklets: int, scale: int,
              sync_every: int | None) -> dict[str, Any]:
    from rlbench import datasets
    from rlbench_upmem.backend import UpmemCompute

    data = datasets.get(env_id, size, behaviour=behaviour, seed=seed)
    fit = dict(rule=algo, alpha=alpha, gamma=gamma, epochs=epochs)
    cpu_s, cpu_note = cpu_baseline(data.arrays, data.n_states, data.n_actions, fit)
    rows = []
    for dpus in dpus_list:
        engine = UpmemCompute(dpus=dpus, numeric=numeric, partition=partition, fixed_point_scale=scale,
                              tasklets=tasklets, sync_every=sync_every, seed=seed).tabular(data.n_states, data.n_actions)
        engine.report_int32_error = False  # time the fit alone
        t0 = time.perf_counter()
        report = engine.fit_offline(data.arrays, **fit)
        emulator_s = time.perf_counter() - t0
        modelled = report["modelled"]
        rows.append({"dpus": dpus, "emulator_s": emulator_s,
                     "emulator_mups": report["emulated"]["updates"] / emulator_s / 1e6,
                     "upmem_s": modelled["seconds"]["total"], "upmem_kernel_s": modelled["seconds"]["kernel"],
                     "cpu_s": cpu_s, "cpu_over_emulator": cpu_s / emulator_s if cpu_s else None,
                     "modelled_detail": modelled})
    first = rows[0]
    for row in rows:
        row["efficiency"] = first["upmem_s"] * first["dpus"] / (row["upmem_s"] * row["dpus"])
    return {"workload": {"algo": algo, "env": data.env_id, "transitions": len(data), "behaviour": behaviour,
                         "epochs": epochs, "numeric": numeric, "partition": partition, "tasklets": tasklets,
                         "sync_every": sync_every},
            "cpu_baseline": cpu_note, "rows": rows,
            "labels": {"measured": MEASURED, "modelled": MODELLED + ["modelled_detail"]}}


def format_table(result: dict[str, Any]) -> str:
    cells = [[h for _, h, _ in COLUMNS]]
    for row in result["rows"]:
        cells.append([fmt.format(row[key]) if row[key] is not None else "n/a" for key, _, fmt in COLUMNS])
    widths = [max(len(r[i]) for r in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    w = result["workload"]
    head = (f"{w['algo']} on {w['env']}, {w['transitions']:,} transitions ({w['behaviour']}), {w['epochs']} epochs, "
            f"{w['numeric']}, partition {w['partition']}, {w['tasklets']} tasklets; CPU baseline: {result['cpu_baseline']}")
    return head + "\n" + "\n".join(lines)


def ascii_chart(result: dict[str, Any], width: int = 50) -> str:
    """Modelled speed-up over the smallest DPU count, against ideal linear scaling (|)."""
    rows = result["rows"]
    base, top = rows[0], rows[-1]["dpus"] / rows[0]["dpus"]
    out = ["modelled UPMEM speed-up over the first DPU count (# achieved, | ideal linear)"]
    for row in rows:
        achieved = base["upmem_s"] / row["upmem_s"]
        ideal = row["dpus"] / base["dpus"]
        bar = ["#" if i < round(achieved / top * width) else " " for i in range(width + 1)]
        bar[min(width, round(ideal / top * width))] = "|"
        out.append(f"{row['dpus']:>6} {''.join(bar)} {achieved:.1f}x (ideal {ideal:.0f}x)")
    return "\n".join(out)


def write_outputs(result: dict[str, Any], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "scale.json", out / "scale.csv"]
    written[0].write_text(json.dumps(result, indent=2, default=float))
    with written[1].open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([h for _, h, _ in COLUMNS])
        writer.writerows([[row[key] for key, _, _ in COLUMNS] for row in result["rows"]])
    try:
        import matplotlib
    except ImportError:
        chart = out / "scale.txt"
        chart.write_text(format_table(result) + "\n\n" + ascii_chart(result) + "\n")
        return written + [chart]
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    dpus = [r["dpus"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.loglog(dpus, [r["upmem_s"] for r in rows], "o-", label="UPMEM total [modelled]")
    ax.loglog(dpus, [r["upmem_kernel_s"] for r in rows], "s--", label="UPMEM kernel [modelled]")
    ax.loglog(dpus, [rows[0]["upmem_s"] * dpus[0] / d for d in dpus], ":", label="ideal linear")
    ax.loglog(dpus, [r["emulator_s"] for r in rows], "^-", label="emulator on this host [measured]")
    if rows[0]["cpu_s"]:
        ax.axhline(rows[0]["cpu_s"], color="k", linestyle="-.", label="CPU baseline [measured]")
    ax.set_xlabel("DPUs")
    ax.set_ylabel("seconds")
    w = result["workload"]
    ax.set_title(f"{w['algo']} {w['env']} {w['transitions']:,} transitions, {w['epochs']} epochs")
    ax.legend(fontsize=8)
    fig.tight_layout()
    png = out / "scale.png"
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return written + [png]
