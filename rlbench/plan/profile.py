"""The profile: what each primitive costs on one machine, measured, for the jobs a plan is made for.

A profile document (JSON, ``"schema": "rlbench.profile/1"``) holds one entry per host, keyed by
`host_key(machine_fingerprint())` (host name and a hash of CPU model, core counts and memory), so
profiles of several machines can be merged (`rlbench profile --merge A B -o C`) and a plan can
place a job on any of them. It is cached at ``$RLBENCH_CACHE/profiles/<host key>.json`` (default
``~/.cache/rlbench/profiles/``, beside the datasets' cache), which later commands reuse.

What a host entry holds (all times in microseconds, medians unless said otherwise):

- ``transports``: round trip (p50) and one-way messages/s of every available transport that
  crosses processes, at the message sizes the profiled jobs send (`rlbench bench transport`'s
  measurement, echo server in a spawned process): shown by `rlbench profile`; the planner uses it
  for availability, the model the replay node's per-message figures below (the same transport at
  the job's own message sizes, codec and node included).
- ``power``: package watts idle and per busy core from RAPL where it is readable; otherwise null
  with the reason (the planner then uses a rated figure labelled ``modelled``).
- ``jobs``: one entry per job (algorithm, environment, the hyperparameters that change an
  operation's cost). For replay-loop algorithms (DQN, DDPG):

  * micro measurements, in this process, on transitions the job's own actor collected: env step;
    per compute backend, actor inference (batch = envs per actor), learner update (batch =
    ``batch_size``) and a weight publication (``weights()`` into an actor); per replay memory,
    ``add`` of one step and of one INSERT message's transitions, ``sample(batch_size)`` and
    ``update_priorities(batch_size)``, on a memory filled to ``min(buffer_size, 20,000)``;
  * the sizes of the wire messages (INSERT, BATCH, priorities, weights);
  * per transport and placement, the runtime's real replay node measured message by message
    (`measure_replay_node`: the node in its own process, a client as the actor and one as the
    learner): INSERT, FETCH and SAMPLE round trips, the learner's sends, the in-network push round
    and the node's own handling time per message. Each transport is measured in a child process
    of its own under a time limit (``--transport-seconds``): one that hangs, kills its process or
    first starts a cluster for longer than that is left out of the profile with the reason;
  * calibration runs (`calibrate_placement`): one short real run locally and one per transport and
    placement over the transports of ``--calibrate`` (shm by default; the other transports get
    the calibrated loops' costs, pooled, with their own replay-node figures). Its learning curve splits it in two phases — before
    ``learning_starts`` the actor runs unthrottled (its time per env step), after it the learner
    trains every step (its time per update, everything on its critical path included). These
    in-situ figures carry what no micro measurement sees (loop bookkeeping, cache pollution by the
    learner, process scheduling); the model keeps them as the loops' own costs beyond the micro
    and replay-node figures, and adds the micro differences of other components to them.

  For tabular algorithms offline (SwiftRL): per compute backend and setting (``--dpus`` counts of
  the upmem plugin), ``fit_offline`` timed at two dataset sizes and fitted as
  ``seconds = fixed + per_update * updates``; a backend that also returns a hardware prediction
  (upmem's cost model) has it fitted the same way and kept apart, labelled ``modelled``.

Only the standard library at module level; numpy, torch and the runtime load when measuring.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlbench.errors import RlbenchError

SCHEMA = "rlbench.profile/1"
DEFAULT_JOBS = ("dqn:CartPole-v1", "qlearning:Taxi-v3")
DEFAULT_DATASETS = (100_000, 1_000_000)  # sizes a tabular job is profiled at (the fit extrapolates)
FIT_REPEATS = 5  # fit_offline runs per backend setting and dataset size (the median is kept)
FILL_ITEMS = 20_000  # replay memories are measured holding this many transitions (or their capacity)
# Hyperparameters that change how often things happen, not what one operation costs: a profile
# measured with any value of these serves every value (the model takes them from the plan's job).
SCHEDULE_HYPERPARAMETERS = frozenset({
    "train_every", "publish_every", "learning_starts", "total_steps", "epochs", "learning_rate", "gamma",
    "alpha", "tau", "target_update_every", "epsilon_start", "epsilon_end", "exploration_steps",
    "exploration_fraction", "per_beta_start", "per_beta_end", "per_eps"})
# Plugin run options that set a component's parallelism, and the values a profile measures (and a
# plan may choose). Keyed by the option's flag.
OPTION_SWEEPS: dict[str, tuple[Any, ...]] = {"--dpus": (64, 256, 1024, 2048)}
DEFAULT_CALIBRATED = ("shm",)  # transports with calibration runs (the rest: replay-node figures + pooled loop costs)
TRANSPORT_TIME_LIMIT_S = 15.0  # a transport whose measurements take longer is left out (with the reason)
TRANSPORT_CASE_S = 0.1  # seconds per transport benchmark case (size x mode)
CALIBRATION_PHASE1_S = 0.6  # unthrottled actor phase of a calibration run (before learning starts)
CALIBRATION_PHASE2_S = 1.2  # learner phase (trains every env step)
CURVE_CHUNKS = 4  # a calibration phase's rate: the median of this many stretches of its learning curve

Progress = Callable[[str], None]


class ProfileError(RlbenchError):
    """A profile that cannot be read, or lacks what a command needs."""


# ------------------------------------------------------------------------------------------- jobs
def _hashable(value: Any) -> Any:
    return tuple(_hashable(v) for v in value) if isinstance(value, (list, tuple)) else value


@dataclass(frozen=True)
class Job:
    """What is to be run: an algorithm on an environment, with hyperparameter overrides."""

    algo: str
    env: str
    hyperparameters: tuple[tuple[str, Any], ...] = ()
    num_envs: int = 1

    @classmethod
    def of(cls, algo: str, env: str, hyperparameters: dict[str, Any] | None = None, num_envs: int = 1) -> Job:
        items = tuple(sorted((k, _hashable(v)) for k, v in (hyperparameters or {}).items()))
        return cls(algo, env, items, num_envs)

    @classmethod
    def parse(cls, text: str) -> Job:
        algo, sep, env = text.partition(":")
        if not sep or not algo.strip() or not env.strip():
            raise RlbenchError(f"--job takes ALGO:ENV (e.g. dqn:CartPole-v1), got {text!r}")
        return cls.of(algo.strip(), env.strip())

    def overrides(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.hyperparameters}

    @property
    def key(self) -> str:
        """The profile's key: what changes an operation's cost (schedule hyperparameters left out)."""
        costly = [f"{k}={','.join(map(str, v)) if isinstance(v, tuple) else v}"
                  for k, v in self.hyperparameters if k not in SCHEDULE_HYPERPARAMETERS]
        return " ".join([self.algo, self.env, *costly, *([f"num_envs={self.num_envs}"] if self.num_envs != 1 else [])])


def resolved_hyperparameters(job: Job, registry: Any = None) -> Any:
    """The algorithm's Config with the job's overrides (validated as `rlbench run` does)."""
    from rlbench.config import apply_overrides
    from rlbench.validate import validate_hyperparameters

    registry = registry or _registry()
    algorithm = registry.get("algorithm", job.algo).create()
    hp = apply_overrides(algorithm.Config, job.overrides())
    validate_hyperparameters(hp)
    return hp


def _registry() -> Any:
    import rlbench

    return rlbench.get_registry()


# ---------------------------------------------------------------------------------- the document
def host_key(fingerprint: dict[str, Any]) -> str:
    """`<hostname>-<hash>`: a machine is known by its name and by what it is."""
    facts = "|".join(str(fingerprint.get(k)) for k in ("hostname", "cpu", "machine", "cores", "cores_usable",
                                                        "memory_bytes"))
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in str(fingerprint.get("hostname") or "host"))
    return f"{name}-{hashlib.sha256(facts.encode()).hexdigest()[:10]}"


def this_host_key() -> str:
    from rlbench.fingerprint import core_fingerprint

    return host_key(core_fingerprint())


def profiles_dir() -> Path:
    from rlbench.datasets import cache_dir

    return cache_dir().parent / "profiles"


def default_path() -> Path:
    """Where this machine's profile is cached."""
    return profiles_dir() / f"{this_host_key()}.json"


def load_profile(path: str | Path) -> dict[str, Any]:
    try:
        with open(path) as handle:
            document = json.load(handle)
    except FileNotFoundError:
        raise ProfileError(f"no profile at {path}; make one with `rlbench profile`") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProfileError(f"cannot read the profile {path}: {exc}") from None
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        found = document.get("schema") if isinstance(document, dict) else type(document).__name__
        raise ProfileError(f"{path} is not an rlbench profile (schema {found!r}, expected {SCHEMA!r})")
    if not isinstance(document.get("hosts"), dict) or not document["hosts"]:
        raise ProfileError(f"{path} holds no host")
    return document


def save_profile(document: dict[str, Any], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(document, indent=1, sort_keys=True, default=_json_default))
    os.replace(temporary, path)
    return path


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    return str(value)


def new_document(host: str, entry: dict[str, Any]) -> dict[str, Any]:
    return {"schema": SCHEMA, "hosts": {host: entry}}


def merge_profiles(documents: list[dict[str, Any]]) -> dict[str, Any]:
    """One document with every host; a host in several keeps, job by job, the newest measurement."""
    merged: dict[str, Any] = {"schema": SCHEMA, "hosts": {}}
    for document in sorted(documents, key=_newest):
        for key, entry in document["hosts"].items():
            previous = merged["hosts"].get(key)
            if previous is None:
                merged["hosts"][key] = json.loads(json.dumps(entry))
                continue
            jobs = {**previous.get("jobs", {}), **entry.get("jobs", {})}
            merged["hosts"][key] = {**previous, **entry, "jobs": jobs}
    return merged


def _newest(document: dict[str, Any]) -> float:
    return max((entry.get("created_unix", 0.0) for entry in document["hosts"].values()), default=0.0)


def add_host_entry(document: dict[str, Any] | None, host: str, entry: dict[str, Any]) -> dict[str, Any]:
    """The document with this host's new measurements merged in (jobs measured before are kept)."""
    return merge_profiles([d for d in (document, new_document(host, entry)) if d is not None])


# ---------------------------------------------------------------------------------- measuring
def _time_us(call: Callable[[], Any], *, seconds: float = 0.12, max_calls: int = 3000, warmup: int = 3) -> float:
    """Median microseconds per call over at most `seconds` (and at least 5 calls)."""
    for _ in range(warmup):
        call()
    clock = time.perf_counter_ns
    times: list[int] = []
    deadline = clock() + int(seconds * 1e9)
    while len(times) < max_calls:
        started = clock()
        call()
        finished = clock()
        times.append(finished - started)
        if finished >= deadline and len(times) >= 5:
            break
    return statistics.median(times) / 1e3


def insert_transitions() -> int:
    """Transitions per actor INSERT message in the distributed runtime (imported here, not at module
    level: the CLI imports this module to list its commands)."""
    from rlbench.runtime.distributed.roles import ACTOR_INSERT_TRANSITIONS

    return ACTOR_INSERT_TRANSITIONS


def profile_host(jobs: list[Job], *, datasets: tuple[int, ...] = DEFAULT_DATASETS,
                 calibrate: tuple[str, ...] = DEFAULT_CALIBRATED, transport_seconds: float = TRANSPORT_TIME_LIMIT_S,
                 progress: Progress = lambda line: None) -> tuple[str, dict[str, Any]]:
    """Measure every job on this machine; returns (host key, host entry)."""
    from rlbench import __version__
    from rlbench.fingerprint import machine_fingerprint
    from rlbench.machine_state import watch

    started = time.perf_counter()
    fingerprint = machine_fingerprint()
    key = host_key(fingerprint)
    registry = _registry()
    entry: dict[str, Any] = {"host": key, "fingerprint": fingerprint, "created_unix": time.time(),
                             "rlbench_version": __version__, "calibrated": list(calibrate), "jobs": {}}
    with watch(busy_processes=1) as machine:
        entry["power"] = measure_power()
        replay_jobs, sizes = [], {64}
        for job in jobs:
            algorithm = registry.get("algorithm", job.algo)
            registry.get("environment", job.env)  # unknown names fail before anything is measured
            t0 = time.perf_counter()
            if algorithm.capabilities.loop == "replay":
                samples = collect_samples(job, registry)
                figures = measure_replay_job(job, registry, progress, samples)
                sizes.update(figures["messages"].values())
                replay_jobs.append((job, figures, samples))
            else:
                figures = measure_tabular_job(job, registry, datasets, progress)
            figures["profiling_s"] = time.perf_counter() - t0
            entry["jobs"][job.key] = figures
        entry["transports"] = {}
        if replay_jobs:
            inputs = {job.key: samples.node_inputs() for job, _, samples in replay_jobs}
            nodes = measure_transports(registry, tuple(sorted(sizes)), inputs, time_limit=transport_seconds,
                                       progress=progress)
            for name, measured in nodes.items():
                entry["transports"][name] = measured["transport"]
                for job, figures, _ in replay_jobs:
                    for placement, node in measured.get("replay_node", {}).get(job.key, {}).items():
                        figures.setdefault("replay_node", {})[f"{name}/{placement}"] = node
            for job, figures, _ in replay_jobs:
                t0 = time.perf_counter()
                calibrate_job(job, figures, entry["transports"], registry, calibrate=calibrate, progress=progress)
                figures["profiling_s"] += time.perf_counter() - t0
    entry["machine_state"] = machine.report()
    entry["profiling_s"] = time.perf_counter() - started
    return key, entry


def measure_power(seconds: float = 0.5) -> dict[str, Any]:
    """Package watts idle and with one core busy, from RAPL; null with the reason without it."""
    from rlbench.energy import RaplMeter

    meter = RaplMeter()
    if not meter.available:
        return {"kind": None, "reason": meter.reason}
    meter.start()
    time.sleep(seconds)
    idle = meter.stop()["joules"] / seconds
    meter.start()
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
    busy = meter.stop()["joules"] / seconds
    return {"kind": "measured", "source": "rapl", "idle_w": idle, "per_busy_core_w": max(0.0, busy - idle)}


# -------------------------------------------------------------------------- replay-loop jobs
@dataclass
class JobSamples:
    """What a job's own actor produced, in the runtime's layout, to measure components on."""

    algorithm: Any
    hp: Any
    spec: Any
    transitions: dict[str, Any]  # name -> array, one row per transition
    batch: dict[str, Any]  # batch_size rows drawn from transitions
    weights: list[Any]  # the learner's published weights
    env_step_us: float
    torch_threads: int  # torch's intra-op threads in a fresh process (before any backend sets them)

    def rows(self, n: int) -> dict[str, Any]:
        import numpy as np

        return {name: np.resize(values, (n, *values.shape[1:])) for name, values in self.transitions.items()}

    @property
    def row_bytes(self) -> int:
        return sum(values[:1].nbytes for values in self.transitions.values())

    def node_inputs(self) -> NodeInputs:
        return NodeInputs(self.rows(insert_transitions()), self.weights, self.hp.batch_size, self.hp.buffer_size)


@dataclass
class NodeInputs:
    """What `measure_replay_node` sends, as plain data (it travels to a child process)."""

    insert: dict[str, Any]  # one INSERT message's transitions
    weights: list[Any]
    batch_size: int
    capacity: int


def collect_samples(job: Job, registry: Any, steps: int | None = None) -> JobSamples:
    """Step the job's environment with its actor (cpu backend) and keep the transitions."""
    import numpy as np
    import torch

    from rlbench.arrays import as_float32, to_host

    torch_threads = torch.get_num_threads()
    algorithm = registry.get("algorithm", job.algo).create()
    hp = resolved_hyperparameters(job, registry)
    env = registry.get("environment", job.env).create(num_envs=job.num_envs, seed=0)
    spec = env.spec
    cpu = registry.get("compute", "cpu").create()
    actor = algorithm.make_actor(spec, cpu, hp, 0)
    weights = algorithm.make_learner(spec, cpu, hp, 0).weights()
    actor.load_weights(weights, 0)
    steps = steps or max(600, min(3000, hp.batch_size * 4))
    rows: list[dict[str, Any]] = []
    env_times = []
    clock = time.perf_counter_ns
    obs = env.reset(seed=0)
    try:
        for step in range(0, steps, job.num_envs):
            actions = actor.act(obs, step)
            started = clock()
            result = env.step(actions)
            env_times.append(clock() - started)
            rows.append({"obs": to_host(obs), "action": to_host(actions), "reward": to_host(result.rewards),
                         "next_obs": to_host(result.final_observations),
                         "done": to_host(as_float32(result.terminated))})
            obs = result.observations
    finally:
        env.close()
    transitions = {name: np.concatenate([row[name] for row in rows]) for name in rows[0]}
    chosen = np.random.default_rng(0).integers(0, len(transitions["obs"]), hp.batch_size)
    return JobSamples(algorithm, hp, spec, transitions, {name: v[chosen] for name, v in transitions.items()},
                      [np.asarray(w) for w in weights], statistics.median(env_times) / 1e3, torch_threads)


def measure_replay_job(job: Job, registry: Any, progress: Progress, samples: JobSamples | None = None) -> dict[str, Any]:
    """Micro measurements of a replay-loop job: env, each compute backend, each replay memory."""
    t0 = time.perf_counter()
    samples = samples or collect_samples(job, registry)
    hp, chunk = samples.hp, insert_transitions()
    figures: dict[str, Any] = {
        "kind": "replay-loop", "algo": job.algo, "env": job.env, "env_id": samples.spec.id, "num_envs": job.num_envs,
        "hyperparameters": {k: getattr(hp, k) for k in ("batch_size", "train_every", "publish_every",
                                                        "learning_starts", "buffer_size")},
        "insert_transitions": chunk,
        "env_step_us": samples.env_step_us,
        "messages": {"insert": chunk * samples.row_bytes + 256,
                     "batch": hp.batch_size * (samples.row_bytes + 12) + 256,
                     "priorities": hp.batch_size * 16 + 128,
                     "weights": sum(w.nbytes for w in samples.weights) + 64 * len(samples.weights)},
        "compute": {}, "replay": {},
    }
    for component in registry.components("compute"):
        if all(component.capabilities.supports(job.algo, role) for role in samples.algorithm.capabilities.roles):
            figures["compute"][component.name] = _measured_or_why(component, _measure_compute, samples)
    for component in registry.components("replay"):
        figures["replay"][component.name] = _measured_or_why(component, _measure_memory, samples, chunk)
    progress(f"{job.key}: env, {len(figures['compute'])} compute backends, {len(figures['replay'])} replay memories "
             f"({time.perf_counter() - t0:.1f} s)")
    return figures


def _measured_or_why(component: Any, measure: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """The component's figures, or why it has none: its probe's reason, or what building it raised
    (a component that fails here would fail the run, so the planner leaves it out, saying why)."""
    probe = component.probe()
    if not probe.available:
        return {"available": False, "reason": probe.reason}
    try:
        return {"available": True, "device": component.capabilities.device, **measure(component, *args)}
    except Exception as exc:  # noqa: BLE001 - whatever it raised is the reason it is left out
        return {"available": False, "reason": f"{type(exc).__name__}: {exc}"}


def _cpu_share(call: Callable[[], Any], calls: int = 30) -> float:
    """CPU seconds per wall second while `call` runs (above 1: it uses several threads)."""
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        call()
    return (time.process_time() - cpu) / max(1e-9, time.perf_counter() - wall)


def _measure_compute(component: Any, samples: JobSamples) -> dict[str, Any]:
    import numpy as np
    import torch

    from rlbench.protocols import Sample

    algorithm, hp, spec = samples.algorithm, samples.hp, samples.spec
    # torch's thread count is per process and a backend may set it: each starts from the default a
    # run's fresh process has, as the roles do
    torch.set_num_threads(samples.torch_threads)
    compute = component.create()
    actor = algorithm.make_actor(spec, compute, hp, 0)
    learner = algorithm.make_learner(spec, compute, hp, 0)
    actor.load_weights(learner.weights(), 0)
    observations = samples.transitions["obs"][: spec.num_envs]
    sample = Sample(np.arange(hp.batch_size, dtype=np.int64), dict(samples.batch), np.ones(hp.batch_size, np.float32))
    return {"inference_us": _time_us(lambda: actor.act(observations, 10**9)),  # late in the run: epsilon at its end
            "learner_update_us": _time_us(lambda: learner.update(sample), seconds=0.5, max_calls=400),
            "learner_cpu_share": _cpu_share(lambda: learner.update(sample)),
            "publish_us": _time_us(lambda: actor.load_weights(learner.weights(), learner.updates))}


def _measure_memory(component: Any, samples: JobSamples, chunk: int) -> dict[str, Any]:
    import numpy as np

    hp = samples.hp
    memory = component.create(capacity=hp.buffer_size, alpha=hp.per_alpha, seed=0)
    fill = min(hp.buffer_size, FILL_ITEMS)
    block = samples.rows(min(fill, 4096))
    while len(memory) < fill:
        memory.add({name: values[: fill - len(memory)] for name, values in block.items()})
    one_step = samples.rows(samples.spec.num_envs)
    insert = samples.rows(chunk)
    rng = np.random.default_rng(0)
    indices = rng.integers(0, len(memory), hp.batch_size).astype(np.int64)
    priorities = rng.exponential(1.0, hp.batch_size) + 1e-3
    prioritized = component.capabilities.prioritized
    figures = {"prioritized": prioritized,
               "add_step_us": _time_us(lambda: memory.add(one_step)),
               "add_insert_us": _time_us(lambda: memory.add(insert)),
               "sample_us": _time_us(lambda: memory.sample(hp.batch_size, 0.4)),
               "update_us": _time_us(lambda: memory.update_priorities(indices, priorities)) if prioritized else 0.0}
    close = getattr(memory, "close", None)
    if close is not None:
        close()
    return figures


def measure_transports(registry: Any, sizes: tuple[int, ...], inputs: dict[str, NodeInputs], *,
                       time_limit: float = TRANSPORT_TIME_LIMIT_S, progress: Progress = lambda line: None
                       ) -> dict[str, dict[str, Any]]:
    """Every transport: its round trip and bandwidth at `sizes`, and the replay node's per-message
    costs over it for each job's inputs, both placements. Each transport is measured in a child
    process of its own under `time_limit`: a transport that hangs, crashes its process or takes
    longer (one that starts a cluster first) is left out with the reason, never the profile."""
    figures: dict[str, dict[str, Any]] = {}
    for component in registry.components("transport"):
        caps = component.capabilities
        entry = {"crosses_processes": caps.crosses_processes, "crosses_hosts": caps.crosses_hosts,
                 "reliable": caps.reliable, "available": False}
        probe = component.probe()
        if not caps.crosses_processes:
            figures[component.name] = {"transport": {**entry, "reason": "stays inside one process"}}
            continue
        if not probe.available:
            figures[component.name] = {"transport": {**entry, "reason": probe.reason}}
            continue
        t0 = time.perf_counter()
        fitting = tuple(size for size in sizes if size <= caps.max_message_bytes)
        measured, failure = run_isolated(_measure_one_transport, (component.name, fitting, inputs), time_limit)
        if failure:
            hint = " (`rlbench profile --transport-seconds S` allows longer)" if "did not finish" in failure else ""
            measured = {"transport": {**entry, "reason": failure + hint}}
        figures[component.name] = measured
        progress(f"transport {component.name}: " + (failure or "round trips, bandwidth and replay node")
                 + f" ({time.perf_counter() - t0:.1f} s)")
    return figures


def _measure_one_transport(name: str, sizes: tuple[int, ...], inputs: dict[str, NodeInputs]) -> dict[str, Any]:
    """In the child process: `rlbench bench transport`'s measurement, then the replay node's."""
    import rlbench
    from rlbench.bench.transport import benchmark_transports

    caps = rlbench.get_registry().get("transport", name).capabilities
    entry = {"crosses_processes": caps.crosses_processes, "crosses_hosts": caps.crosses_hosts, "reliable": caps.reliable}
    measured = benchmark_transports([name], sizes, TRANSPORT_CASE_S)["transports"][name]
    cases = [{k: case[k] for k in ("size", "p50_us", "p99_us", "msg_per_s", "mb_per_s")}
             for case in measured.get("cases", [])]
    result: dict[str, Any] = {"transport": {**entry, "available": bool(cases), "cases": cases,
                                            "reason": "" if cases else measured.get("reason", "not measured")},
                              "replay_node": {}}
    for key, job_inputs in inputs.items():
        nodes = result["replay_node"][key] = {}
        for placement in ("server", "in-network"):
            try:
                nodes[placement] = measure_replay_node(job_inputs, name, placement)
            except Exception as exc:  # noqa: BLE001 - a run would fail the same way: left out, saying why
                nodes[placement] = {"failed": f"{type(exc).__name__}: {exc}"}
    return result


def run_isolated(function: Callable[..., Any], args: tuple[Any, ...], time_limit: float) -> tuple[Any, str]:
    """`function(*args)` in a spawned process leading its own session: (its result, "") or (None,
    why not). Past `time_limit`, or when it ends without a result, the session (the child and what
    it started) is killed."""
    import multiprocessing
    import queue
    import signal

    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    child = context.Process(target=_isolated_entry, args=(function, args, results))  # not daemonic: it spawns
    child.start()
    deadline = time.monotonic() + time_limit
    outcome: tuple[str, Any] | None = None
    try:
        while outcome is None and time.monotonic() < deadline:
            try:
                outcome = results.get(timeout=0.2)
            except queue.Empty:
                if not child.is_alive():
                    try:
                        outcome = results.get(timeout=0.5)  # it may have put its result just before exiting
                    except queue.Empty:
                        outcome = ("error", f"its measuring process died (exit code {child.exitcode})")
    finally:
        child.join(2)
        try:
            os.killpg(child.pid, signal.SIGKILL)  # what it started and left behind goes with it
        except (ProcessLookupError, PermissionError):
            pass
        child.join(5)
        results.close()
        results.join_thread()
    if outcome is None:
        return None, f"its measurement did not finish within {time_limit:g} s"
    status, value = outcome
    return (value, "") if status == "ok" else (None, str(value))


def _isolated_entry(function: Callable[..., Any], args: tuple[Any, ...], results: Any) -> None:
    os.setsid()
    try:
        results.put(("ok", function(*args)))
    except BaseException as exc:  # noqa: BLE001 - the parent reports it; this process ends anyway
        results.put(("error", f"{type(exc).__name__}: {exc}"))


def measure_replay_node(inputs: NodeInputs, transport: str, placement: str, *, rounds: int = 60) -> dict[str, Any]:
    """Per-message costs of the runtime's real replay node (prioritized memory) over `transport`:
    it runs in its own process (rlbench.kit.access.replay_node), one client speaks as an actor and
    one as the learner. Round trips and sends as the roles see them, and the node's own handling
    time per message (its report's serve.* and push.BATCH), all medians in microseconds.

    The one place replay-node costs are measured: re-point it here if the runtime changes how."""
    import numpy as np

    from rlbench.kit.access import replay_node
    from rlbench.metrics import Histogram

    chunk = len(inputs.insert["obs"])
    priorities = np.random.default_rng(0).exponential(1.0, inputs.batch_size) + 1e-3
    figures: dict[str, Any] = {"method": "replay node in its own process (rlbench.kit.access), medians",
                               "transport": transport, "placement": placement}
    clock = time.perf_counter_ns

    def timed(call: Callable[[], Any], n: int = rounds) -> float:
        times = []
        for _ in range(n):
            started = clock()
            call()
            times.append(clock() - started)
        return statistics.median(times) / 1e3

    with replay_node(transport, placement=placement, replay="prioritized", capacity=inputs.capacity,
                     batch_size=inputs.batch_size) as node:
        fill = max(2 * inputs.batch_size, 2048)
        figures["insert_rtt_us"] = timed(lambda: node.actor.add(inputs.insert), max(rounds, -(-fill // chunk)))
        versions = iter(range(1, 1 << 30))
        figures["publish_send_us"] = timed(lambda: node.learner.publish_params(inputs.weights, next(versions)))
        figures["fetch_rtt_us"] = timed(lambda: node.actor.fetch_params(-1))
        updates = iter(range(1 << 30))
        if placement == "server":
            figures["sample_rtt_us"] = timed(lambda: node.learner.sample(inputs.batch_size, 0.4))
            batch = node.learner.sample(inputs.batch_size, 0.4)
            figures["priorities_send_us"] = timed(lambda: node.learner.update_priorities(
                batch.indices, priorities, learner_updates=next(updates)))
        else:
            node.learner.credit(1, 0.4)
            batch = node.learner.wait_pushed(30.0)

            def round_trip() -> None:  # give one credit back with the priorities, wait for the next push
                node.learner.update_priorities(batch.indices, priorities, learner_updates=next(updates), credit=1,
                                               beta=0.4)
                node.learner.wait_pushed(30.0)

            figures["push_round_us"] = timed(round_trip)
            node.learner.update_priorities(batch.indices, priorities, learner_updates=next(updates), credit=rounds,
                                           beta=0.4)
            time.sleep(0.05)  # the node pushes them all; each is then waiting when asked for
            figures["push_ready_us"] = timed(lambda: node.learner.wait_pushed(30.0))
            figures["priorities_send_us"] = timed(lambda: node.learner.update_priorities(
                batch.indices, priorities, learner_updates=next(updates)))
        histograms = node.report().get("histograms", {})
    serve = {}
    for name, key in (("serve.INSERT", "insert_us"), ("serve.UPDATE_PRIORITIES", "priorities_us"),
                      ("serve.PUBLISH_PARAMS", "publish_us"), ("serve.FETCH_PARAMS", "fetch_us"),
                      ("push.BATCH", "batch_us")):
        if name in histograms:
            serve[key] = Histogram.from_dict(histograms[name]).summary()["p50"]
    figures["node"] = serve
    return figures


# ----------------------------------------------------------------------------- calibration runs
def _learning_curve_phases(result: dict[str, Any], learning_starts: int, steps: int) -> tuple[float | None, float | None]:
    """Seconds per env step before and after learning starts, from the episodes' (step, time)."""
    points = [(p["step"], p["time_s"]) for p in result.get("learning_curve") or []]

    def seconds_per_step(low: float, high: float) -> float | None:
        """The median over CURVE_CHUNKS consecutive stretches: a burst of load on a shared machine
        slows one stretch, not the figure."""
        chosen = [(s, t) for s, t in points if low <= s <= high]
        if len(chosen) < 3 or chosen[-1][1] - chosen[0][1] < 0.05:
            return None
        chunks = min(CURVE_CHUNKS, (len(chosen) - 1) // 2)
        bounds = [round(i * (len(chosen) - 1) / chunks) for i in range(chunks + 1)]
        rates = [(chosen[b][1] - chosen[a][1]) / (chosen[b][0] - chosen[a][0])
                 for a, b in itertools.pairwise(bounds) if chosen[b][0] > chosen[a][0]]
        return statistics.median(rates) if rates and statistics.median(rates) > 0 else None

    free = seconds_per_step(0.25 * learning_starts, 0.95 * learning_starts)
    learning = seconds_per_step(learning_starts + 0.2 * (steps - learning_starts), steps)
    return free, learning


def latency_us(result: dict[str, Any], *names: str, statistic: str = "p50") -> float | None:
    """A latency statistic of the first of `names` the result recorded (names differ across runtimes)."""
    latency = result.get("latency") or {}
    for name in names:
        entry = latency.get(name)
        if entry and entry.get("count"):
            return float(entry[statistic])
    return None


def _calibration_budget(figures: dict[str, Any], free_us: float, update_us: float) -> tuple[int, int]:
    """(learning_starts, steps) so the free phase and the learning phase each last long enough."""
    hp = figures["hyperparameters"]
    cap = max(hp["batch_size"], min(hp["buffer_size"], 60_000))
    learning_starts = int(min(cap, max(2_000, CALIBRATION_PHASE1_S / (free_us * 1e-6))))
    learning_steps = int(min(6_000, max(400, CALIBRATION_PHASE2_S / ((free_us + update_us) * 1e-6))))
    return learning_starts, learning_starts + learning_steps


def calibrate_placement(job: Job, figures: dict[str, Any], placement: str, transport: str = "shm", *,
                        compute: str = "cpu", actor_bound: bool = False) -> dict[str, Any]:
    """In-situ costs of a placement from one short real run (1 actor, prioritized replay).

    Learner-bound (the default): the run trains every env step once learning starts. Its learning
    curve splits it in two: before ``learning_starts`` the actor runs unthrottled (its time per env
    step, with everything the loop does around inference and the env step), after it the learner
    is the bottleneck (its time per update, everything on its critical path included). When too
    few episodes end for a fit, the run's latency histograms stand in (they miss the loop's
    bookkeeping; the method says so).

    Actor-bound (distributed only): the learner trains rarely enough (train_every k) to leave the
    actor the bottleneck while weights keep changing; the learning phase gives the actor's time per
    env step with its weight fetches and a working learner beside it."""
    import rlbench
    from rlbench.config import RunConfig

    cpu, memory = figures["compute"][compute], figures["replay"]["prioritized"]
    free_estimate = (cpu["inference_us"] + figures["env_step_us"] + memory["add_step_us"]) / job.num_envs + 10.0
    update_estimate = cpu["learner_update_us"] + memory["sample_us"] + memory["update_us"] + cpu["publish_us"]
    every = 1
    if actor_bound:  # the learner's share of an env step a quarter of the actor's: the actor binds
        every = max(8, math.ceil(4 * update_estimate / free_estimate))
        learning_starts = max(figures["hyperparameters"]["batch_size"], 1_000)
        steps = learning_starts + int(min(200_000, CALIBRATION_PHASE2_S / (free_estimate * 1e-6)))
    else:
        learning_starts, steps = _calibration_budget(figures, free_estimate, update_estimate)
    overrides = {**job.overrides(), "learning_starts": learning_starts, "train_every": every,
                 "publish_every": figures["hyperparameters"]["publish_every"]}
    config = RunConfig(algo=job.algo, env=job.env, num_envs=job.num_envs, placement=placement, transport=transport,
                       replay="prioritized", compute=compute, actors=1, steps=steps, seed=0, eval_episodes=0,
                       hyperparameters=overrides)
    result = rlbench.run(config)
    free, learning = _learning_curve_phases(result, learning_starts, steps)
    local = placement == "local"
    base = {"placement": placement, "transport": None if local else transport, "compute": compute,
            "train_every": every, "status": result["status"], "status_reason": result.get("status_reason"),
            "learning_starts": learning_starts, "steps": steps, "wall_s": result["timing"]["wall_s"]}
    if actor_bound:
        if learning is None:
            return {**base, "failed": "too few episodes ended to time the actor"}
        return {**base, "method": "learning curve of an actor-bound calibration run",
                "actor_learning_us": learning * 1e6, "fetch_us": latency_us(result, "weights.FETCH")}
    learner_timed = {"update": latency_us(result, "learner.update"),
                     "sample": latency_us(result, "replay.sample" if local else "replay.SAMPLE"),
                     "priorities": latency_us(result, "replay.update_priorities" if local else "replay.UPDATE_PRIORITIES"),
                     "publish": latency_us(result, "weights.publish" if local else "weights.PUBLISH")}
    actor_timed = {"inference": latency_us(result, "actor.inference"), "env": latency_us(result, "env.step"),
                   "add": latency_us(result, "replay.add") if local else None}
    method = "learning curve of a calibration run"
    if free is None:
        free = sum(v or 0.0 for v in actor_timed.values()) * 1e-6 / job.num_envs
        method = "latency histograms of a calibration run (too few episodes for the learning curve)"
    timed_update_us = sum(v or 0.0 for v in learner_timed.values())
    if local:  # one process: an update adds to the step's time
        update_us = max(timed_update_us, ((learning or 0.0) - free) * 1e6)
    else:  # the learner's own period; never below what it timed itself
        update_us = max(timed_update_us, (learning or 0.0) * 1e6)
    return {**base, "method": method, "free_step_us": free * 1e6, "update_us": update_us,
            "learner_timed": learner_timed, "actor_timed": actor_timed,
            "fetch_us": None if local else latency_us(result, "weights.FETCH")}


def calibrate_job(job: Job, figures: dict[str, Any], transports: dict[str, Any], registry: Any, *,
                  calibrate: tuple[str, ...], progress: Progress) -> None:
    """The in-situ calibration runs of a replay-loop job: local with each available compute
    backend (a backend's threads or device calls cost in the loop what no micro measurement
    shows), then each placement over each transport of `calibrate` that was measured usable,
    learner-bound and actor-bound (the other transports are derived by the model from their
    replay-node figures)."""
    figures["calibration"] = {}
    if not (figures["compute"].get("cpu", {}).get("available") and figures["replay"].get("prioritized", {}).get("available")):
        progress(f"{job.key}: no calibration run (it needs the cpu backend and the prioritized memory)")
        return
    algorithm = registry.get("algorithm", job.algo)
    placements = [p for p in ("server", "in-network") if p in algorithm.capabilities.placements]
    usable = [name for name in calibrate if transports.get(name, {}).get("available")]
    runs: list[tuple[str, dict[str, Any]]] = [("local", {"placement": "local"})]
    runs += [(f"local/{name}", {"placement": "local", "compute": name})
             for name, c in figures["compute"].items() if name != "cpu" and c.get("available")]
    for placement in placements:
        for name in usable:
            if "failed" in (figures.get("replay_node") or {}).get(f"{name}/{placement}", {"failed": ""}):
                continue
            runs.append((f"{name}/{placement}", {"placement": placement, "transport": name}))
            runs.append((f"{name}/{placement}/actors", {"placement": placement, "transport": name, "actor_bound": True}))
    for key, settings in runs:
        t0 = time.perf_counter()
        try:
            figures["calibration"][key] = calibrate_placement(job, figures, **settings)
        except RlbenchError as exc:
            figures["calibration"][key] = {"failed": str(exc)}
        progress(f"{job.key}: calibration run {key} ({time.perf_counter() - t0:.1f} s)")


# ----------------------------------------------------------------------------------- tabular jobs
def _modelled_seconds(measured: Any) -> tuple[float | None, str, dict[str, float]]:
    """(total seconds, what, breakdown) of the part of an engine's report labelled modelled."""
    if isinstance(measured, dict):
        seconds = measured.get("seconds")
        if measured.get("kind") == "modelled" and isinstance(seconds, dict) and "total" in seconds:
            parts = {k: float(v) for k, v in seconds.items() if k != "total"}
            return float(seconds["total"]), str(measured.get("what", "")), parts
        for value in measured.values():
            found = _modelled_seconds(value)
            if found[0] is not None:
                return found
    return None, "", {}


def _measured_breakdown(measured: Any) -> dict[str, float]:
    """The measured seconds breakdown an engine reports (the emulator's), if any."""
    if isinstance(measured, dict):
        seconds = measured.get("seconds")
        if measured.get("kind") == "measured" and isinstance(seconds, dict):
            return {k: float(v) for k, v in seconds.items() if k != "total"}
        for value in measured.values():
            found = _measured_breakdown(value)
            if found:
                return found
    return {}


def linear_fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(intercept, slope) by least squares, neither below 0 (the other one refitted alone)."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    variance = sum((x - mean_x) ** 2 for x, _ in points)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / variance if variance > 0 else 0.0
    intercept = mean_y - slope * mean_x
    if slope <= 0:  # within noise of a fixed cost
        return mean_y, 0.0
    if intercept < 0:  # within noise of a pure per-update cost
        return 0.0, sum(x * y for x, y in points) / sum(x * x for x, _ in points)
    return intercept, slope


def tabular_settings(registry: Any, component: Any) -> list[dict[str, Any]]:
    """The option sets a tabular backend is measured (and planned) with: its defaults, and each
    parallelism option of OPTION_SWEEPS at each listed value."""
    settings: list[dict[str, Any]] = []
    for option in registry.options_for("compute", component.name):
        for value in OPTION_SWEEPS.get(option.flag, ()):
            settings.append({option.param: value})
    return settings or [{}]


def measure_tabular_job(job: Job, registry: Any, sizes: tuple[int, ...], progress: Progress) -> dict[str, Any]:
    """fit_offline of every tabular backend and setting at each dataset size."""
    from rlbench import datasets

    algorithm = registry.get("algorithm", job.algo).create()
    hp = resolved_hyperparameters(job, registry)
    env = registry.get("environment", job.env).create(num_envs=1, seed=0)
    spec = env.spec
    env.close()
    t0 = time.perf_counter()
    data = {size: datasets.get(job.env, size, behaviour="random", seed=0) for size in sizes}
    figures: dict[str, Any] = {"kind": "tabular-offline", "algo": job.algo, "env": job.env, "env_id": spec.id,
                               "epochs": hp.epochs, "sizes": list(sizes), "behaviour": "random",
                               "dataset_collect_s": time.perf_counter() - t0, "settings": []}
    for component in registry.components("compute"):
        if not component.capabilities.supports(job.algo, "tabular"):
            continue
        probe = component.probe()
        for options in tabular_settings(registry, component):
            setting: dict[str, Any] = {"compute": component.name, "options": options,
                                       "device": component.capabilities.device}
            figures["settings"].append(setting)
            if not probe.available:
                setting.update(available=False, reason=probe.reason)
                continue
            try:
                setting.update(available=True, **_measure_fit(algorithm, spec, component.create(**options), hp, data))
            except Exception as exc:  # noqa: BLE001 - e.g. a DPU count the emulator refuses: left out, saying why
                setting.update(available=False, reason=f"{type(exc).__name__}: {exc}")
    progress(f"{job.key}: fit_offline of {len(figures['settings'])} backend settings at {', '.join(map(str, sizes))} "
             f"transitions ({time.perf_counter() - t0:.1f} s)")
    return figures


def _measure_fit(algorithm: Any, spec: Any, compute: Any, hp: Any, data: dict[int, Any]) -> dict[str, Any]:
    points, modelled_points = [], []
    modelled_what, breakdown, modelled_breakdown = "", {}, {}
    for dataset in data.values():
        runs = []
        for _ in range(FIT_REPEATS):
            learner = algorithm.make_learner(spec, compute, hp, 0)
            started = time.perf_counter()
            measured = learner.fit_offline(dataset.arrays, epochs=hp.epochs)
            runs.append((time.perf_counter() - started, measured))
        seconds, measured = sorted(runs, key=lambda r: r[0])[FIT_REPEATS // 2]  # the median run: a fit lasts ms
        updates = len(dataset) * hp.epochs
        points.append((updates, seconds))
        total, modelled_what, modelled_breakdown = _modelled_seconds(measured)
        if total is not None:
            modelled_points.append((updates, total))
        breakdown = _measured_breakdown(measured)
    fixed, per_update = linear_fit(points)
    figures: dict[str, Any] = {"points": [{"updates": u, "seconds": s} for u, s in points],
                               "fixed_s": fixed, "per_update_s": per_update, "breakdown": breakdown}
    if modelled_points:
        m_fixed, m_per_update = linear_fit(modelled_points)
        figures["modelled"] = {"kind": "modelled", "what": modelled_what, "fixed_s": m_fixed,
                               "per_update_s": m_per_update, "breakdown": modelled_breakdown,
                               "points": [{"updates": u, "seconds": s} for u, s in modelled_points]}
    return figures
