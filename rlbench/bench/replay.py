"""`rlbench bench replay`: replay-memory operation rates, side by side with their peers.

Every available registered replay memory (plugins' included) is filled to --capacity with
CartPole-sized transitions and measured on add(1), add(batch), sample(batch) and
update_priorities(batch), next to two peers measured in the same run: cpprb's C++
PrioritizedReplayBuffer (when cpprb is installed; `pip install rlbench[test]`) and the textbook
numpy sum tree defined below. Rates are printed with their ratio to cpprb. All memories are
measured in interleaved rounds (each operation of each memory once per round) and the median round
is reported, so a burst of load from other processes hits every memory alike.

One thread: OMP_NUM_THREADS=1 is set (unless already set) and torch and numpy's OpenBLAS are pinned
to one thread (rlbench.kit.bench.pin_one_thread), which the output reports.

Only click is imported at module level: `rlbench --help` must stay fast.
"""

from __future__ import annotations

import functools
import json
import os
import time
from typing import Any, Callable

import click

from rlbench.kit.bench import CpprbPrioritized, cartpole_batch, numpy_sumtree_replay_class

OPERATIONS = ("add_1", "add_batch", "sample", "update")
ROUNDS = 5
FILL_CHUNK = 10_000


@click.command("replay")
@click.option("--replay", "replays", multiple=True, metavar="NAME",
              help="Registered replay memory to measure (repeatable). Default: every available one.")
@click.option("--capacity", type=click.IntRange(min=1000), default=1_000_000, show_default=True,
              help="Items each memory holds; each is filled to capacity before measuring.")
@click.option("--batch-size", type=click.IntRange(min=1), default=256, show_default=True,
              help="Batch of add(batch), sample and update_priorities.")
@click.option("--seconds", type=click.FloatRange(min=0.01), default=1.0, show_default=True,
              help="Measuring time per operation and memory (split over rounds).")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
def command(replays: tuple[str, ...], capacity: int, batch_size: int, seconds: float, as_json: bool) -> None:
    """Replay memory add / sample / update_priorities rates, with ratios to cpprb."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # takes effect if numpy is not loaded yet
    from rlbench.kit.bench import pin_one_thread

    threads = {"OMP_NUM_THREADS": os.environ["OMP_NUM_THREADS"], **pin_one_thread()}
    subjects, unavailable = _subjects(replays, capacity)
    results = run_benchmark(subjects, capacity=capacity, batch_size=batch_size, seconds=seconds,
                            unavailable=unavailable)
    report = {
        "capacity": capacity,
        "batch_size": batch_size,
        "seconds_per_operation": seconds,
        "rounds": ROUNDS,
        "statistic": "median of rounds, calls per second",
        "transition": "obs float32[4], action int64, reward float32, next_obs float32[4], done float32",
        "threads": threads,
        "reference": "cpprb" if "cpprb" in results else None,
        "results": results,
        "unavailable": unavailable,
    }
    click.echo(json.dumps(report, indent=2) if as_json else format_table(report))


# -- what is measured ------------------------------------------------------------------------------------
def _subjects(names: tuple[str, ...], capacity: int) -> tuple[dict[str, tuple[str, Callable[[], Any]]], dict[str, str]]:
    """name -> (role, builder) for the registered memories and the peers; plus unavailable ones."""
    from rlbench.plugins import get_registry

    registry = get_registry()
    components = [registry.get("replay", name) for name in names] if names else list(registry.components("replay"))
    subjects: dict[str, tuple[str, Callable[[], Any]]] = {}
    unavailable: dict[str, str] = {}
    for component in components:
        probe = component.probe()
        if not probe.available:
            unavailable[component.name] = probe.reason
            continue
        subjects[component.name] = ("registered", functools.partial(component.create, capacity=capacity, alpha=0.6, seed=0))
    subjects["numpy-sumtree"] = ("baseline", lambda: numpy_sumtree_replay_class()(capacity, alpha=0.6, seed=0))
    try:
        import cpprb  # noqa: F401
    except ImportError:
        unavailable["cpprb"] = "python module 'cpprb' not installed: pip install cpprb (or rlbench[test])"
    else:
        subjects["cpprb"] = ("peer", lambda: CpprbPrioritized(capacity, alpha=0.6))
    return subjects, unavailable


def run_benchmark(subjects: dict[str, tuple[str, Callable[[], Any]]], *, capacity: int, batch_size: int,
                  seconds: float, unavailable: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Fill every memory, then time each operation in interleaved rounds; rates in calls/s.
    A memory that refuses to be built is added to `unavailable` with its reason."""
    import numpy as np

    from rlbench.errors import RlbenchError

    rng = np.random.default_rng(0)
    one = [cartpole_batch(rng, 1) for _ in range(64)]
    batches = [cartpole_batch(rng, batch_size) for _ in range(64)]
    # Enough distinct index sets that updates do not find their leaves in cache from a previous lap.
    pool = 1024
    update_indices = [rng.integers(0, capacity, batch_size, dtype=np.int64) for _ in range(pool)]
    update_priorities = [rng.exponential(1.0, batch_size).astype(np.float32) + 1e-3 for _ in range(pool)]

    memories: dict[str, Any] = {}
    fill_seconds: dict[str, float] = {}
    for name, (_, build) in subjects.items():
        try:
            memory = build()
        except RlbenchError as error:  # e.g. a device memory that cannot hold this capacity
            unavailable[name] = str(error)
            continue
        start = time.perf_counter()
        for begin in range(0, capacity, FILL_CHUNK):
            n = min(FILL_CHUNK, capacity - begin)
            memory.add(cartpole_batch(rng, n), rng.exponential(1.0, n) + 1e-3)
        fill_seconds[name] = time.perf_counter() - start
        memories[name] = memory

    def operations(memory: Any) -> dict[str, Callable[[int], Any]]:
        return {
            "add_1": lambda k: memory.add(one[k % len(one)]),
            "add_batch": lambda k: memory.add(batches[k % len(batches)]),
            "sample": lambda k: memory.sample(batch_size, 0.4),
            "update": lambda k: memory.update_priorities(update_indices[k % pool], update_priorities[k % pool]),
        }

    rates: dict[str, dict[str, list[float]]] = {name: {op: [] for op in OPERATIONS} for name in memories}
    for _ in range(ROUNDS):
        for name, memory in memories.items():
            for op, call in operations(memory).items():
                rates[name][op].append(_rate(call, seconds / ROUNDS))

    results: dict[str, dict[str, Any]] = {}
    for name, memory in memories.items():
        medians = {op: float(np.median(rates[name][op])) for op in OPERATIONS}
        results[name] = {"role": subjects[name][0], "per_second": medians,
                         "fill_seconds": round(fill_seconds[name], 3), "size": len(memory)}
    reference = results.get("cpprb")
    for result in results.values():
        result["ratio_to_cpprb"] = None if reference is None else {
            op: result["per_second"][op] / reference["per_second"][op] for op in OPERATIONS}
    return results


def _rate(call: Callable[[int], Any], seconds: float) -> float:
    """Calls per second of call(0), call(1), ... over at least `seconds`."""
    calls = 0
    start = time.perf_counter()
    while True:
        for k in range(calls, calls + 16):
            call(k)
        calls += 16
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return calls / elapsed


def format_table(report: dict[str, Any]) -> str:
    batch = report["batch_size"]
    headers = ["memory", "role", "add(1)/s", f"add({batch})/s", f"sample({batch})/s", f"update({batch})/s"]
    rows = []
    for name, result in report["results"].items():
        ratios = result["ratio_to_cpprb"] or {}
        cells = []
        for op in OPERATIONS:
            cell = f"{result['per_second'][op]:,.0f}"
            if op in ratios:
                cell += f" (x{ratios[op]:.2f})"
            cells.append(cell)
        rows.append([name, result["role"], *cells])
    widths = [max(len(str(row[i])) for row in [headers, *rows]) for i in range(len(headers))]
    lines = [
        f"replay memories at capacity {report['capacity']:,} (filled), {report['transition']}",
        f"threads: {', '.join(f'{k}={v}' for k, v in report['threads'].items())}; {report['statistic']} over {report['rounds']} rounds of "
        f"{report['seconds_per_operation'] / report['rounds']:.2f} s",
        "(xN) = rate / the rate of cpprb's PrioritizedReplayBuffer in this run" if report["reference"]
        else "cpprb not installed: no ratios",
        "",
        "  ".join(h.ljust(w) if i < 2 else h.rjust(w) for i, (h, w) in enumerate(zip(headers, widths))),
    ]
    for row in rows:
        lines.append("  ".join(str(c).ljust(w) if i < 2 else str(c).rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
    for name, reason in report["unavailable"].items():
        lines.append(f"not measured: {name}: {reason}")
    return "\n".join(lines)


