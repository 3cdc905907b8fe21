"""`rlbench upmem bench`: the emulator's update rate beside its peers, measured in one run on one
thread, and the emulator's memory against the dataset and Q-tables it holds.

Peers: a numba-compiled single-table sequential loop (the optional `bench` extra; the row says so
when numba is missing), timed in rounds interleaved with the emulator, medians compared; then, once
each, a numpy lock-step across DPUs (its tables must equal the emulator's) and a plain Python loop.
"""

from __future__ import annotations

import os
import time
import tracemalloc
from typing import Any, Callable

import numpy as np

from rlbench_upmem.backend import UpmemCompute
from rlbench_upmem.baselines import numpy_lockstep, python_loop
from rlbench_upmem.emulator import WorkloadDoesNotFitError


def run_bench(*, env_id: str, size: int, behaviour: str, seed: int, dpus: int, epochs: int, rule: str,
              numeric: str, python_updates: int, rounds: int, seconds: float, alpha: float = 0.1,
              gamma: float = 0.99) -> dict[str, Any]:
    from rlbench import datasets
    from rlbench.kit.bench import interleaved_medians

    threads = _one_thread()
    data = datasets.get(env_id, size, behaviour=behaviour, seed=seed)
    arrays, S, A = data.arrays, data.n_states, data.n_actions
    fit = dict(rule=rule, alpha=alpha, gamma=gamma, epochs=epochs)
    updates = len(data) * epochs

    # One aggregation at the end, as the lock-step baseline does, so the two tables can be compared.
    engine = UpmemCompute(dpus=dpus, numeric=numeric, sync_every=None).tabular(S, A)
    engine.report_int32_error = False  # time the int32 fit alone, not its fp32 error re-run
    reports: list[dict[str, Any]] = []

    def emulator(_call: int) -> None:
        engine.q[...] = 0.0
        reports.append(engine.fit_offline(arrays, **fit))

    emulator(0)  # warm-up: allocates the emulated DPUs' memory, which the engine keeps between fits
    subjects: dict[str, Callable[[int], None]] = {"emulator": emulator}
    numba_row, numba_run, numba_q = _numba_peer(arrays, S, A, fit, numeric)
    if numba_run is not None:
        subjects["numba"] = lambda _call: numba_run()
    per_call_us = interleaved_medians(subjects, rounds, seconds)
    emulator_rate = updates / (per_call_us["emulator"] * 1e-6)
    emulator_q = engine.q.copy()
    if numba_q is not None:
        numba_row["updates_per_s"] = updates / (per_call_us["numba"] * 1e-6)
        numba_row["emulator_ratio"] = emulator_rate / numba_row["updates_per_s"]
        numba_row["max_abs_diff_vs_emulator_on_one_dpu"] = _one_dpu_diff(arrays, S, A, fit, numba_q)

    t0 = time.perf_counter()
    lockstep_q = numpy_lockstep(arrays, S, A, dpus=dpus, **fit)
    lockstep_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    python_done = python_loop(arrays, S, A, dpus=dpus, max_updates=python_updates, **fit)
    python_s = time.perf_counter() - t0

    # Memory: everything a new engine allocates during a fit, against what it holds.
    fresh = UpmemCompute(dpus=dpus, numeric=numeric, sync_every=None).tabular(S, A)
    fresh.report_int32_error = False
    tracemalloc.start()
    fresh.fit_offline(arrays, **fit)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del fresh
    held = data.nbytes + dpus * S * A * 4 + S * A * 8  # dataset + per-DPU tables + host table

    kernel_rates = [r["emulated"]["kernel_updates_per_s"] for r in reports[1:] or reports]
    return {
        "workload": {"env": data.env_id, "transitions": len(data), "behaviour": behaviour, "dpus": dpus,
                     "epochs": epochs, "rule": rule, "numeric": numeric, "updates": updates},
        "kind": "measured",
        "threads": threads,
        "timing": f"median of {rounds} rounds of {seconds:g} s" + (", emulator and numba taking turns"
                                                                   if len(subjects) > 1 else ""),
        "emulator_updates_per_s": emulator_rate,
        "emulator_kernel_updates_per_s": float(np.median(kernel_rates)),
        "emulator_seconds": reports[-1]["emulated"]["seconds"],
        "numba": numba_row,
        "numpy_lockstep_updates_per_s": updates / lockstep_s,
        "python_loop_updates_per_s": python_done / python_s,
        "python_loop_updates": python_done,
        "speedup_vs_numpy": emulator_rate / (updates / lockstep_s),
        "speedup_vs_python": emulator_rate / (python_done / python_s),
        "max_abs_diff_vs_numpy": float(np.abs(emulator_q - lockstep_q).max()) if numeric == "fp32" else None,
        "memory": {"emulator_peak_bytes": peak, "dataset_plus_qtables_bytes": held, "ratio": peak / held},
        "modelled": {"kind": "modelled", "upmem_seconds": reports[-1]["modelled"]["seconds"]["total"],
                     "upmem_updates_per_s": reports[-1]["modelled"]["updates_per_s"]},
    }


def _one_thread() -> dict[str, Any]:
    """Every peer on one thread: the emulator and numba's loop are single-threaded by construction;
    numpy's BLAS (and torch's, when installed) are pinned."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # takes effect if numpy's BLAS has not started yet
    threads: dict[str, Any] = {"OMP_NUM_THREADS": os.environ["OMP_NUM_THREADS"]}
    try:
        from rlbench.kit.bench import pin_one_thread

        threads.update(pin_one_thread())
    except ImportError as exc:  # pin_one_thread needs torch
        threads["pinned"] = f"not pinned: {exc}"
    return threads


def _numba_peer(arrays: Any, S: int, A: int, fit: dict[str, Any], numeric: str
                ) -> tuple[dict[str, Any], Callable[[], None] | None, np.ndarray | None]:
    """(row, run, q): the numba peer's row, and when it can run, its compiled sweep and table."""
    row: dict[str, Any] = {"what": "numba-compiled single-table sequential loop, fp32"}
    if numeric != "fp32":
        row["missing"] = "not run: the numba peer computes fp32 (run with --numeric fp32)"
        return row, None, None
    try:
        from rlbench_upmem.numba_peer import VERSION, single_table_sweep
    except ImportError:
        row["missing"] = f"numba is not installed: {numba_install_command()}"
        return row, None, None
    run, q = single_table_sweep(arrays, S, A, **fit)
    run()  # warm-up
    row["version"] = VERSION
    return row, run, q


def numba_install_command() -> str:
    """The pip command for the `bench` extra's numba, with the pin from this plugin's metadata."""
    from importlib import metadata

    try:
        pins = [r.split(";")[0].strip() for r in metadata.requires("rlbench-upmem") or ()
                if r.startswith("numba") and "bench" in r]
    except metadata.PackageNotFoundError:
        pins = []
    return f"pip install '{pins[0] if pins else 'numba'}'"


def _one_dpu_diff(arrays: Any, S: int, A: int, fit: dict[str, Any], numba_q: np.ndarray) -> float | str:
    """The numba table against the emulator on one DPU (the same sequential sweep): 0 when they agree."""
    one = UpmemCompute(dpus=1, sync_every=None).tabular(S, A)
    try:
        one.fit_offline(arrays, **fit)
    except WorkloadDoesNotFitError:
        return "not checked: the dataset does not fit one DPU's MRAM"
    return float(np.abs(one.q - numba_q).max())


def format_bench(r: dict[str, Any]) -> str:
    w, n = r["workload"], r["numba"]
    lines = [
        f"workload: {w['env']} {w['transitions']:,} transitions ({w['behaviour']}), {w['rule']} {w['numeric']}, "
        f"{w['dpus']} DPUs, {w['epochs']} epochs = {w['updates']:,} updates",
        f"measured on this host, one thread ({', '.join(f'{k}={v}' for k, v in r['threads'].items())}); "
        f"updates/s, {r['timing']}:",
        f"  UPMEM emulator, exact per-DPU order     {r['emulator_updates_per_s'] / 1e6:8.1f} M/s   "
        f"(kernel alone {r['emulator_kernel_updates_per_s'] / 1e6:.1f} M/s)",
    ]
    if "updates_per_s" in n:
        diff = n["max_abs_diff_vs_emulator_on_one_dpu"]
        lines.append(f"  numba single-table loop (numba {n['version']}) {n['updates_per_s'] / 1e6:8.1f} M/s   "
                     f"emulator / numba = {n['emulator_ratio']:.2f}x   "
                     + (f"(its table vs the emulator on 1 DPU: max |diff| = {diff:.3g})" if isinstance(diff, float)
                        else f"({diff})"))
    else:
        lines.append(f"  numba single-table loop: {n['missing']}")
    lines += [
        f"  numpy lock-step across DPUs (once)      {r['numpy_lockstep_updates_per_s'] / 1e6:8.1f} M/s   "
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
