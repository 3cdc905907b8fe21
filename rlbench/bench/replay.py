"""`rlbench bench replay`: replay-memory operation rates, side by side with their peers.

Every available registered replay memory (plugins' included) is filled to --capacity with
CartPole-sized transitions and measured next to two peers in the same run: cpprb's C++
PrioritizedReplayBuffer used as its documentation shows (when cpprb is installed; `pip install
rlbench[test]`) and the textbook numpy sum tree (rlbench.kit.bench.numpy_sumtree_replay_class).
Rates are printed with their ratio to cpprb. All memories are measured in interleaved rounds (each
operation of each memory once per round) and the median round is reported, so a burst of load from
other processes hits every memory alike.

Cache regimes. How fast a sum tree is depends on whether the lines it touches are in cache, so
sample and update_priorities are each measured in the regimes that matter:
- cold: on the full memory (a million leaves by default, tens of MB of tree: beyond L2, shared L3),
  sample draws wherever the priorities say; update writes random index sets, 1,024 of them in
  rotation, so no set finds its leaves left in cache by its previous turn.
- hot: sample on a small memory (--hot-capacity, CleanRL DQN's 10,000 by default: its tree fits in
  L2); update reuses one index set, so its leaves and paths stay cached. With new priorities every
  call: cpprb's tree stops walking up at the first parent whose value does not change, so writing
  the same priorities again costs it almost nothing (measured here: ~6x its rate with new ones), a
  case no learner produces.
- learner: what a learner does: sample a batch (untimed), then update the priorities of exactly
  those indices (timed). The sample has just walked those leaves' paths, so this update is warmer
  than cold but, on a large memory, not hot. A learner on a large memory sees "sample cold" and
  "update learner"; on a small one, the hot figures.
Indices passed to update are in the dtype the memory's own sample returns (uint64 for cpprb), as its
users pass them back.

One thread: OMP_NUM_THREADS=1 is set (unless already set) and torch and numpy's OpenBLAS are pinned
to one thread (rlbench.kit.bench.pin_one_thread), which the output reports, with the machine's state
while measuring (rlbench.machine_state).

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

OPERATIONS = ("add_1", "add_batch", "sample_cold", "sample_hot", "update_cold", "update_hot", "update_learner")
ROUNDS = 5
FILL_CHUNK = 10_000
INDEX_SETS = 1024  # cold updates rotate through this many random index sets
HOT_CAPACITY = 10_000
LEARNER_NOTE = ("a learner on a large memory sees 'sample cold' and 'update learner' (it updates the indices it "
                "just sampled: their paths were just walked, so warmer than cold, not hot); on a small memory, "
                "the hot figures")

Builder = Callable[[int], Any]  # capacity -> an empty memory


@click.command("replay")
@click.option("--replay", "replays", multiple=True, metavar="NAME",
              help="Registered replay memory to measure (repeatable). Default: every available one.")
@click.option("--capacity", type=click.IntRange(min=1000), default=1_000_000, show_default=True,
              help="Items each memory holds; each is filled to capacity before measuring (the cold regime).")
@click.option("--hot-capacity", type=click.IntRange(min=1000), default=HOT_CAPACITY, show_default=True,
              help="Items of the small memory whose tree stays in cache (the hot sample regime).")
@click.option("--batch-size", type=click.IntRange(min=1), default=256, show_default=True,
              help="Batch of add(batch), sample and update_priorities.")
@click.option("--seconds", type=click.FloatRange(min=0.01), default=1.0, show_default=True,
              help="Measuring time per operation and memory (split over rounds).")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
def command(replays: tuple[str, ...], capacity: int, hot_capacity: int, batch_size: int, seconds: float,
            as_json: bool) -> None:
    """Replay memory add / sample / update_priorities rates in cold, hot and learner regimes, with
    ratios to cpprb."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # takes effect if numpy is not loaded yet
    from rlbench.kit.bench import pin_one_thread
    from rlbench.machine_state import watch

    threads = {"OMP_NUM_THREADS": os.environ["OMP_NUM_THREADS"], **pin_one_thread()}
    hot_capacity = min(hot_capacity, capacity)  # the small memory is never the larger one
    subjects, unavailable = _subjects(replays)
    with watch(busy_processes=1) as state:
        results = run_benchmark(subjects, capacity=capacity, batch_size=batch_size, seconds=seconds,
                                unavailable=unavailable, hot_capacity=hot_capacity)
    report = {
        "capacity": capacity,
        "hot_capacity": hot_capacity,
        "batch_size": batch_size,
        "seconds_per_operation": seconds,
        "rounds": ROUNDS,
        "statistic": "median of rounds, calls per second",
        "transition": "obs float32[4], action int64, reward float32, next_obs float32[4], done float32",
        "regimes": {
            "sample_cold": f"sample({batch_size}) from the memory of {capacity:,} items",
            "sample_hot": f"sample({batch_size}) from a memory of {hot_capacity:,} items (its tree in cache)",
            "update_cold": f"update_priorities({batch_size}) at random indices, {INDEX_SETS} index sets in rotation",
            "update_hot": f"update_priorities({batch_size}) reusing one index set, new priorities each call "
                          "(the same ones again would let cpprb stop at the first unchanged parent)",
            "update_learner": f"update_priorities({batch_size}) of the indices just sampled (the sample untimed)",
        },
        "learner_sees": LEARNER_NOTE,
        "threads": threads,
        "machine_state": state.report(),
        "reference": "cpprb" if "cpprb" in results else None,
        "results": results,
        "unavailable": unavailable,
    }
    click.echo(json.dumps(report, indent=2) if as_json else format_table(report))


# -- what is measured ------------------------------------------------------------------------------------
def _subjects(names: tuple[str, ...]) -> tuple[dict[str, tuple[str, Builder]], dict[str, str]]:
    """name -> (role, builder) for the registered memories and the peers; plus unavailable ones."""
    from rlbench.plugins import get_registry

    registry = get_registry()
    components = [registry.get("replay", name) for name in names] if names else list(registry.components("replay"))
    subjects: dict[str, tuple[str, Builder]] = {}
    unavailable: dict[str, str] = {}
    for component in components:
        probe = component.probe()
        if not probe.available:
            unavailable[component.name] = probe.reason
            continue
        subjects[component.name] = ("registered", builder_of(component))
    subjects["numpy-sumtree"] = ("baseline", lambda capacity: numpy_sumtree_replay_class()(capacity, alpha=0.6, seed=0))
    try:
        import cpprb  # noqa: F401
    except ImportError:
        unavailable["cpprb"] = "python module 'cpprb' not installed: pip install cpprb (or rlbench[test])"
    else:
        subjects["cpprb"] = ("peer", lambda capacity: CpprbPrioritized(capacity, alpha=0.6))
    return subjects, unavailable


def builder_of(component: Any) -> Builder:
    """capacity -> an empty memory of a registered replay component, as the benchmark configures it."""
    return lambda capacity: component.create(capacity=capacity, alpha=0.6, seed=0)


def _filled(build: Builder, capacity: int, rng: Any) -> tuple[Any, float]:
    """A memory filled to capacity, and the seconds the filling took."""
    memory = build(capacity)
    start = time.perf_counter()
    for begin in range(0, capacity, FILL_CHUNK):
        n = min(FILL_CHUNK, capacity - begin)
        memory.add(cartpole_batch(rng, n), rng.exponential(1.0, n) + 1e-3)
    return memory, time.perf_counter() - start


def run_benchmark(subjects: dict[str, tuple[str, Builder]], *, capacity: int, batch_size: int, seconds: float,
                  unavailable: dict[str, str], hot_capacity: int = HOT_CAPACITY) -> dict[str, dict[str, Any]]:
    """Fill every memory (and its small twin for the hot sample), then time each operation in
    interleaved rounds; rates in calls/s. A memory that refuses to be built is added to
    `unavailable` with its reason."""
    import numpy as np

    from rlbench.errors import RlbenchError

    rng = np.random.default_rng(0)
    one = [cartpole_batch(rng, 1) for _ in range(64)]
    batches = [cartpole_batch(rng, batch_size) for _ in range(64)]
    cold_indices = [rng.integers(0, capacity, batch_size, dtype=np.int64) for _ in range(INDEX_SETS)]
    priorities = [rng.exponential(1.0, batch_size).astype(np.float32) + 1e-3 for _ in range(INDEX_SETS)]

    memories: dict[str, tuple[Any, Any]] = {}
    fill_seconds: dict[str, float] = {}
    for name, (_, build) in subjects.items():
        try:
            memory, fill_seconds[name] = _filled(build, capacity, rng)
            small, _ = _filled(build, hot_capacity, rng)
        except RlbenchError as error:  # e.g. a device memory that cannot hold this capacity
            unavailable[name] = str(error)
            continue
        memories[name] = (memory, small)

    def operations(memory: Any, small: Any) -> dict[str, Callable[[float], float]]:
        sampled = memory.sample(batch_size, 0.4).indices  # the index dtype this memory's users pass back
        as_own = (lambda a: a.astype(sampled.dtype)) if isinstance(sampled, np.ndarray) else (lambda a: a)
        own_indices = [as_own(indices) for indices in cold_indices]
        return {
            "add_1": functools.partial(_rate, lambda k: memory.add(one[k % len(one)])),
            "add_batch": functools.partial(_rate, lambda k: memory.add(batches[k % len(batches)])),
            "sample_cold": functools.partial(_rate, lambda k: memory.sample(batch_size, 0.4)),
            "sample_hot": functools.partial(_rate, lambda k: small.sample(batch_size, 0.4)),
            "update_cold": functools.partial(_rate, lambda k: memory.update_priorities(
                own_indices[k % INDEX_SETS], priorities[k % INDEX_SETS])),
            "update_hot": functools.partial(_rate, lambda k: memory.update_priorities(
                own_indices[0], priorities[k % INDEX_SETS])),
            "update_learner": functools.partial(_rate_after, lambda: memory.sample(batch_size, 0.4).indices,
                                                lambda k, indices: memory.update_priorities(
                                                    indices, priorities[k % INDEX_SETS])),
        }

    measures = {name: operations(*pair) for name, pair in memories.items()}
    rates: dict[str, dict[str, list[float]]] = {name: {op: [] for op in OPERATIONS} for name in memories}
    for _ in range(ROUNDS):
        for name, by_operation in measures.items():
            for op, measure in by_operation.items():
                rates[name][op].append(measure(seconds / ROUNDS))

    results: dict[str, dict[str, Any]] = {}
    for name, (memory, _) in memories.items():
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


def _rate_after(prepare: Callable[[], Any], call: Callable[[int, Any], Any], seconds: float) -> float:
    """Calls per second of call(k, prepare()), only the call timed, until the calls took `seconds`."""
    clock = time.perf_counter
    calls, timed = 0, 0.0
    while timed < seconds:
        argument = prepare()
        start = clock()
        call(calls, argument)
        timed += clock() - start
        calls += 1
    return calls / timed


def format_table(report: dict[str, Any]) -> str:
    from rlbench.machine_state import summary_line

    batch = report["batch_size"]
    headers = ["memory", "role", "add(1)/s", f"add({batch})/s", "sample cold/s", "sample hot/s", "update cold/s",
               "update hot/s", "update learner/s"]
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
        f"threads: {', '.join(f'{k}={v}' for k, v in report['threads'].items())}; {report['statistic']} over "
        f"{report['rounds']} rounds of {report['seconds_per_operation'] / report['rounds']:.2f} s",
        summary_line(report["machine_state"]),
        "(xN) = rate / the rate of cpprb's PrioritizedReplayBuffer in this run" if report["reference"]
        else "cpprb not installed: no ratios",
        *(f"  {op.replace('_', ' ')}: {text}" for op, text in report["regimes"].items()),
        f"  {report['learner_sees']}",
        "",
        "  ".join(h.ljust(w) if i < 2 else h.rjust(w) for i, (h, w) in enumerate(zip(headers, widths))),
    ]
    for row in rows:
        lines.append("  ".join(str(c).ljust(w) if i < 2 else str(c).rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
    for name, reason in report["unavailable"].items():
        lines.append(f"not measured: {name}: {reason}")
    return "\n".join(lines)
