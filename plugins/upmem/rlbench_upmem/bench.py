"""`rlbench upmem bench`: the emulator's update rate beside its two baselines, measured in one run,
and the emulator's memory against the dataset and Q-tables it holds."""

from __future__ import annotations

import time
import tracemalloc
from typing import Any

import numpy as np

from rlbench_upmem.backend import UpmemCompute
from rlbench_upmem.baselines import numpy_lockstep, python_loop


def run_bench(*, env_id: str, size: int, behaviour: str, seed: int, dpus: int, epochs: int, rule: str,
              numeric: str, python_updates: int, alpha: float = 0.1, gamma: float = 0.99) -> dict[str, Any]:
    from rlbench import datasets

    data = datasets.get(env_id, size, behaviour=behaviour, seed=seed)
    arrays, S, A = data.arrays, data.n_states, data.n_actions
    fit = dict(rule=rule, alpha=alpha, gamma=gamma, epochs=epochs)
    updates = len(data) * epochs

    # One aggregation at the end, as the lock-step baseline does, so the two tables can be compared.
    engine = UpmemCompute(dpus=dpus, numeric=numeric, sync_every=None).tabular(S, A)
    engine.report_int32_error = False  # time the int32 fit alone, not its fp32 error re-run
    engine.fit_offline(arrays, **fit)  # warm-up: first touch of the emulated MRAM pages
    engine.q[...] = 0.0
    t0 = time.perf_counter()
    report = engine.fit_offline(arrays, **fit)
    emulator_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    lockstep_q = numpy_lockstep(arrays, S, A, dpus=dpus, **fit)
    lockstep_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    python_done = python_loop(arrays, S, A, dpus=dpus, max_updates=python_updates, **fit)
    python_s = time.perf_counter() - t0

    # Memory: everything the emulator allocates during a fit, against what it holds.
    engine.q[...] = 0.0
    tracemalloc.start()
    engine.fit_offline(arrays, **fit)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    held = data.nbytes + dpus * S * A * 4 + S * A * 8  # dataset + per-DPU tables + host table

    emulator_rate = updates / emulator_s
    return {
        "workload": {"env": data.env_id, "transitions": len(data), "behaviour": behaviour, "dpus": dpus,
                     "epochs": epochs, "rule": rule, "numeric": numeric, "updates": updates},
        "kind": "measured",
        "emulator_updates_per_s": emulator_rate,
        "emulator_kernel_updates_per_s": report["emulated"]["kernel_updates_per_s"],
        "emulator_seconds": report["emulated"]["seconds"],
        "numpy_lockstep_updates_per_s": updates / lockstep_s,
        "python_loop_updates_per_s": python_done / python_s,
        "python_loop_updates": python_done,
        "speedup_vs_numpy": emulator_rate / (updates / lockstep_s),
        "speedup_vs_python": emulator_rate / (python_done / python_s),
        "max_abs_diff_vs_numpy": float(np.abs(engine.q - lockstep_q).max()) if numeric == "fp32" else None,
        "memory": {"emulator_peak_bytes": peak, "dataset_plus_qtables_bytes": held, "ratio": peak / held},
        "modelled": {"kind": "modelled", "upmem_seconds": report["modelled"]["seconds"]["total"],
                     "upmem_updates_per_s": report["modelled"]["updates_per_s"]},
    }


def format_bench(r: dict[str, Any]) -> str:
    w = r["workload"]
    lines = [
        f"workload: {w['env']} {w['transitions']:,} transitions ({w['behaviour']}), {w['rule']} {w['numeric']}, "
        f"{w['dpus']} DPUs, {w['epochs']} epochs = {w['updates']:,} updates; one host core",
        "measured on this host (updates/s, same run):",
        f"  UPMEM emulator, exact per-DPU order   {r['emulator_updates_per_s'] / 1e6:8.1f} M/s   "
        f"(kernel alone {r['emulator_kernel_updates_per_s'] / 1e6:.1f} M/s)",
        f"  numpy lock-step across DPUs           {r['numpy_lockstep_updates_per_s'] / 1e6:8.1f} M/s   "
        f"emulator x{r['speedup_vs_numpy']:.1f}",
        f"  plain Python loop ({r['python_loop_updates']:,} updates) {r['python_loop_updates_per_s'] / 1e6:8.1f} M/s   "
        f"emulator x{r['speedup_vs_python']:.1f}",
    ]
    if r["max_abs_diff_vs_numpy"] is not None:
        lines.append(f"  emulator vs numpy lock-step tables: max |diff| = {r['max_abs_diff_vs_numpy']:.3g}")
    m = r["memory"]
    lines.append(f"memory: emulator peak {m['emulator_peak_bytes'] / 2**20:.1f} MiB / dataset + Q-tables "
                 f"{m['dataset_plus_qtables_bytes'] / 2**20:.1f} MiB = {m['ratio']:.2f}x (tracemalloc)")
    lines.append(f"modelled UPMEM hardware: {r['modelled']['upmem_seconds'] * 1e3:.2f} ms, "
                 f"{r['modelled']['upmem_updates_per_s'] / 1e6:.0f} M updates/s [modelled, not measured]")
    return "\n".join(lines)
