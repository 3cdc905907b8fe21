"""`rlbench bench replay`: replay-memory operation rates, side by side with their peers.

Two workloads. `--workload atari` (at the end of this docstring) measures memories of stacked
frames. The default, `cartpole`: every available registered replay memory (plugins' included) is
filled to --capacity with CartPole-sized transitions and measured next to two peers in the same run: cpprb's C++
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

`--workload atari`: Atari transitions (obs and next_obs of 4 stacked 84x84 uint8 frames, int64
actions, float32 rewards and dones) from one env's stream (rlbench.kit.bench.AtariStream: one new
frame per step, episodes starting with reset stacks), as CleanRL's dqn_atari feeds its buffer. The
registered memories that store frames once (capabilities.frames; built with frames=4) are filled to
--capacity beside two peers: cpprb's PrioritizedReplayBuffer with next_of="obs" and
stack_compress="obs" as its documentation shows, and stable-baselines3's ReplayBuffer with
optimize_memory_usage=True as CleanRL's dqn_atari uses it (uniform; it keeps whole stacks, 28 KB per
transition). Measured: add of one step (the local loop), add of a chunk of steps (an actor's
INSERT), sample(batch) (prioritized with beta 0.4 where the memory is prioritized), each ratio to
the peer that samples the same way (prioritized: cpprb; uniform: SB3), and the resident memory each
took (VmRSS before building it and after filling it). The frames added while measuring are new ones
(prepared untimed), so a memory shares only what a stream lets it share. A memory whose estimated
footprint exceeds what the machine has available (MemAvailable, less a reserve) is not built, and
the output says so.

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
ATARI_OPERATIONS = ("add_1", "add_chunk", "sample")
ATARI_FILL_CHUNK = 1000
ATARI_RESERVE_BYTES = 2 << 30  # left to the rest of the machine when deciding whether a memory fits
ROUNDS = 5
FILL_CHUNK = 10_000
INDEX_SETS = 1024  # cold updates rotate through this many random index sets
HOT_CAPACITY = 10_000
LEARNER_NOTE = ("a learner on a large memory sees 'sample cold' and 'update learner' (it updates the indices it "
                "just sampled: their paths were just walked, so warmer than cold, not hot); on a small memory, "
                "the hot figures")

Builder = Callable[[int], Any]  # capacity -> an empty memory


@click.command("replay")
@click.option("--workload", type=click.Choice(["cartpole", "atari"]), default="cartpole", show_default=True,
              help="Transitions measured: CartPole-sized vectors, or Atari's 4 stacked 84x84 uint8 frames (memories "
                   "that store frames once, beside cpprb's stack_compress and SB3's optimize_memory_usage).")
@click.option("--replay", "replays", multiple=True, metavar="NAME",
              help="Registered replay memory to measure (repeatable). Default: every available one.")
@click.option("--capacity", type=click.IntRange(min=1000), default=1_000_000, show_default=True,
              help="Items each memory holds; each is filled to capacity before measuring (the cold regime).")
@click.option("--hot-capacity", type=click.IntRange(min=1000), default=HOT_CAPACITY, show_default=True,
              help="Items of the small memory whose tree stays in cache (the hot sample regime).")
@click.option("--batch-size", type=click.IntRange(min=1), default=None,
              help="Batch of add(batch), sample and update_priorities.  [default: 256; atari: 32, and chunks of 32 "
                   "steps for add]")
@click.option("--seconds", type=click.FloatRange(min=0.01), default=1.0, show_default=True,
              help="Measuring time per operation and memory (split over rounds).")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
def command(workload: str, replays: tuple[str, ...], capacity: int, hot_capacity: int, batch_size: int | None,
            seconds: float, as_json: bool) -> None:
    """Replay memory add / sample / update_priorities rates in cold, hot and learner regimes, with
    ratios to cpprb (--workload atari: memories of stacked frames beside cpprb and SB3, with their
    resident memory)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # takes effect if numpy is not loaded yet
    from rlbench.kit.bench import pin_one_thread
    from rlbench.machine_state import watch

    threads = {"OMP_NUM_THREADS": os.environ["OMP_NUM_THREADS"], **pin_one_thread()}
    if workload == "atari":
        report = atari_report(replays, capacity=capacity, batch_size=batch_size or 32, seconds=seconds,
                              threads=threads)
        click.echo(json.dumps(report, indent=2) if as_json else format_atari_table(report))
        return
    batch_size = batch_size or 256
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


# -- --workload atari ----------------------------------------------------------------------------------
class _Subject:
    """One memory of the Atari workload: how to build it, prepare a batch for it (untimed) and add it."""

    def __init__(self, name: str, role: str, sampling: str, build: Callable[[int], Any], bytes_per_transition: float,
                 prepare: Callable[[Any], Any] | None = None, add: Callable[[Any, Any], Any] | None = None) -> None:
        self.name, self.role, self.sampling = name, role, sampling
        self.build, self.bytes_per_transition = build, bytes_per_transition
        self.prepare = prepare or (lambda memory, batch: batch)
        self.add = add or (lambda memory, prepared: memory.add(prepared))


def _atari_subjects(names: tuple[str, ...]) -> tuple[list[_Subject], dict[str, str]]:
    from rlbench.kit.bench import ATARI_FRAME, ATARI_STACK, CpprbFrames, Sb3Frames
    from rlbench.plugins import get_registry

    frame_bytes = ATARI_FRAME[0] * ATARI_FRAME[1]
    registry = get_registry()
    components = [registry.get("replay", name) for name in names] if names else list(registry.components("replay"))
    subjects: list[_Subject] = []
    unavailable: dict[str, str] = {}
    for component in components:
        probe = component.probe()
        if not probe.available:
            unavailable[component.name] = probe.reason
        elif not component.capabilities.frames:
            unavailable[component.name] = ("does not store frames once (capabilities.frames is False): it would keep "
                                           f"obs and next_obs whole, {2 * ATARI_STACK * frame_bytes:,} bytes per transition")
        else:
            sampling = "prioritized" if component.capabilities.prioritized else "uniform"
            subjects.append(_Subject(component.name, "registered", sampling, functools.partial(
                lambda c, capacity: c.create(capacity=capacity, alpha=0.6, seed=0, frames=ATARI_STACK), component),
                bytes_per_transition=1.07 * frame_bytes + 64))
    # prioritized first: the headline figure is measured even when memory runs short for the rest
    subjects.sort(key=lambda subject: subject.sampling != "prioritized")
    for module, hint, subject in (
            ("cpprb", "pip install cpprb (or rlbench[test])",
             _Subject("cpprb", "peer", "prioritized", lambda capacity: CpprbFrames(capacity, alpha=0.6),
                      bytes_per_transition=frame_bytes + 64, prepare=lambda memory, batch: CpprbFrames.prepare(batch),
                      add=lambda memory, prepared: memory.add_prepared(prepared))),
            ("stable_baselines3", "pip install stable-baselines3 (or rlbench[test])",
             _Subject("sb3", "peer", "uniform", Sb3Frames, bytes_per_transition=ATARI_STACK * frame_bytes + 64,
                      prepare=lambda memory, batch: Sb3Frames.prepare(batch),
                      add=lambda memory, prepared: memory.add_prepared(prepared)))):
        import importlib.util

        if importlib.util.find_spec(module) is None:
            unavailable[subject.name] = f"python module {module!r} not installed: {hint}"
        else:
            subjects.append(subject)
    return subjects, unavailable


def run_atari_benchmark(subjects: list[_Subject], *, capacity: int, batch_size: int, seconds: float,
                        unavailable: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Build and fill each memory in turn (resident memory measured around it), then time add(1),
    add(chunk) and sample(batch_size) in interleaved rounds. Rates in calls/s."""
    import numpy as np

    from rlbench.errors import RlbenchError
    from rlbench.kit.bench import AtariStream, available_bytes, resident_bytes

    memories: dict[str, tuple[_Subject, Any, Any]] = {}
    results: dict[str, dict[str, Any]] = {}
    for subject in subjects:
        needed = capacity * subject.bytes_per_transition
        available = available_bytes()
        if available is not None and needed > available - ATARI_RESERVE_BYTES:
            unavailable[subject.name] = (f"needs ~{needed / 2**30:.1f} GiB resident at capacity {capacity:,}; "
                                         f"{available / 2**30:.1f} GiB available (less a {ATARI_RESERVE_BYTES >> 30} "
                                         "GiB reserve): lower --capacity")
            continue
        stream = AtariStream(seed=0)  # every memory gets the same transitions
        before = resident_bytes()
        try:
            memory = subject.build(capacity)
            fill_seconds = 0.0
            for begin in range(0, capacity, ATARI_FILL_CHUNK):
                prepared = subject.prepare(memory, stream.take(min(ATARI_FILL_CHUNK, capacity - begin)))
                start = time.perf_counter()
                subject.add(memory, prepared)
                fill_seconds += time.perf_counter() - start
                del prepared
        except RlbenchError as error:
            unavailable[subject.name] = str(error)
            continue
        resident = resident_bytes() - before
        memories[subject.name] = (subject, memory, stream)
        results[subject.name] = {"role": subject.role, "sampling": subject.sampling, "size": len(memory),
                                 "fill_seconds": round(fill_seconds, 3), "resident_bytes": resident,
                                 "resident_bytes_per_transition": round(resident / capacity, 1)}
        stats = getattr(memory, "stats", None)
        if callable(stats) and "frames" in stats():
            results[subject.name]["frames"] = stats()["frames"]

    def operations(subject: _Subject, memory: Any, stream: Any) -> dict[str, Callable[[float], float]]:
        beta = 0.4
        return {
            "add_1": functools.partial(_rate_after, lambda: subject.prepare(memory, stream.take(1)),
                                       lambda k, prepared: subject.add(memory, prepared)),
            "add_chunk": functools.partial(_rate_after, lambda: subject.prepare(memory, stream.take(batch_size)),
                                           lambda k, prepared: subject.add(memory, prepared)),
            "sample": functools.partial(_rate, lambda k: memory.sample(batch_size, beta)),
        }

    measures = {name: operations(*triple) for name, triple in memories.items()}
    rates: dict[str, dict[str, list[float]]] = {name: {op: [] for op in ATARI_OPERATIONS} for name in memories}
    for _ in range(ROUNDS):
        for name, by_operation in measures.items():
            for op, measure in by_operation.items():
                rates[name][op].append(measure(seconds / ROUNDS))
    for name in memories:
        results[name]["per_second"] = {op: float(np.median(rates[name][op])) for op in ATARI_OPERATIONS}
    peers = {"prioritized": "cpprb", "uniform": "sb3"}
    for name, result in results.items():
        peer = peers[result["sampling"]]
        result["peer"] = peer if peer in results and peer != name else None
        result["ratio_to_peer"] = None if result["peer"] is None else {
            op: result["per_second"][op] / results[peer]["per_second"][op] for op in ATARI_OPERATIONS}
    return results


def atari_report(replays: tuple[str, ...], *, capacity: int, batch_size: int, seconds: float,
                 threads: dict[str, Any]) -> dict[str, Any]:
    from rlbench.kit.bench import ATARI_FRAME, ATARI_STACK
    from rlbench.machine_state import watch

    subjects, unavailable = _atari_subjects(replays)
    with watch(busy_processes=1) as state:
        results = run_atari_benchmark(subjects, capacity=capacity, batch_size=batch_size, seconds=seconds,
                                      unavailable=unavailable)
    frame_bytes = ATARI_FRAME[0] * ATARI_FRAME[1]
    return {
        "workload": "atari",
        "capacity": capacity,
        "batch_size": batch_size,
        "seconds_per_operation": seconds,
        "rounds": ROUNDS,
        "statistic": "median of rounds, calls per second",
        "transition": f"obs and next_obs uint8[{ATARI_STACK},{ATARI_FRAME[0]},{ATARI_FRAME[1]}], action int64, "
                      "reward float32, done float32",
        "stream": "one env (CleanRL's dqn_atari), one new frame per step, episodes of geometric length (mean 400 "
                  "steps) starting with a reset stack",
        "operations": {"add_1": "add of one step", "add_chunk": f"add of {batch_size} consecutive steps (an actor's "
                                                                "INSERT)",
                       "sample": f"sample({batch_size}), beta 0.4 where prioritized"},
        "frames_alone_bytes": capacity * frame_bytes,
        "threads": threads,
        "machine_state": state.report(),
        "results": results,
        "unavailable": unavailable,
    }


def format_atari_table(report: dict[str, Any]) -> str:
    from rlbench.machine_state import summary_line

    batch = report["batch_size"]
    headers = ["memory", "role", "sampling", "add(1)/s", f"add({batch})/s", f"sample({batch})/s", "resident",
               "per transition", "fill s"]
    rows = []
    for name, result in report["results"].items():
        ratios = result["ratio_to_peer"] or {}
        cells = []
        for op in ATARI_OPERATIONS:
            cell = f"{result['per_second'][op]:,.0f}"
            if op in ratios:
                cell += f" (x{ratios[op]:.2f})"
            cells.append(cell)
        rows.append([name, result["role"], result["sampling"], *cells, f"{result['resident_bytes'] / 2**30:.2f} GiB",
                     f"{result['resident_bytes_per_transition'] / 1024:,.1f} KiB", f"{result['fill_seconds']:.1f}"])
    widths = [max(len(str(row[i])) for row in [headers, *rows]) for i in range(len(headers))]
    lines = [
        f"replay memories of Atari transitions at capacity {report['capacity']:,} (filled): {report['transition']}",
        f"stream: {report['stream']}; the frames alone: {report['frames_alone_bytes'] / 1e9:.2f} GB",
        f"threads: {', '.join(f'{k}={v}' for k, v in report['threads'].items())}; {report['statistic']} over "
        f"{report['rounds']} rounds of {report['seconds_per_operation'] / report['rounds']:.2f} s",
        summary_line(report["machine_state"]),
        "(xN) = rate / the rate of the peer that samples the same way in this run (prioritized: cpprb's "
        "PrioritizedReplayBuffer with next_of and stack_compress; uniform: SB3's ReplayBuffer with "
        "optimize_memory_usage)",
        *(f"  {op.replace('_', ' ')}: {text}" for op, text in report["operations"].items()),
        "  resident: VmRSS after filling less VmRSS before building",
        "",
        "  ".join(h.ljust(w) if i < 3 else h.rjust(w) for i, (h, w) in enumerate(zip(headers, widths))),
    ]
    for row in rows:
        lines.append("  ".join(str(c).ljust(w) if i < 3 else str(c).rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
    for name, result in report["results"].items():
        frames = result.get("frames")
        if frames:
            lines.append(f"{name}: {frames['frames_held']:,} frames held for {result['size']:,} transitions "
                         f"({frames['frame_bytes'] / 2**30:.2f} GiB), {frames['dedup_ratio']} references per frame")
    for name, reason in report["unavailable"].items():
        lines.append(f"not measured: {name}: {reason}")
    return "\n".join(lines)
