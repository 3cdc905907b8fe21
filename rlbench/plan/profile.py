"""The profile: what each primitive costs on one machine, measured, for the jobs a plan is made for.

A profile document (JSON, ``"schema": "rlbench.profile/1"``) holds one entry per host, keyed by
`host_key(machine_fingerprint())` (host name and a hash of CPU model, core counts and memory), so
profiles of several machines can be merged (`rlbench profile --merge A B -o C`) and a plan can
place a job on any of them. It is cached at ``$RLBENCH_CACHE/profiles/<host key>.json`` (default
``~/.cache/rlbench/profiles/``, beside the datasets' cache), which later commands reuse.

What a host entry holds (all times in microseconds, medians unless said otherwise). Every figure
that is measured by timing many calls or several runs has its spread beside it (an entry's
``spread`` table: the half range of its stretches' or repeats' values, relative to the figure),
and every group of figures the machine state it was measured in (``machine_state``, or a
calibration's ``contended``): `contended_figures` lists the groups someone else's work disturbed,
and `rlbench plan` refuses such a profile unless told `--allow-contended`.

- ``transports``: round trip (p50) and one-way messages/s of every available transport that
  crosses processes, at the message sizes the profiled jobs send (`rlbench bench transport`'s
  measurement, echo server in a spawned process): shown by `rlbench profile`; the planner uses it
  for availability, the model the replay node's per-message figures below (the same transport at
  the job's own message sizes, codec and node included). Transports NOT_PROFILED_BY_DEFAULT
  (ray: it starts a cluster first) are left out with the reason unless named (``--transports``).
- ``power``: package watts idle and per busy core from RAPL where it is readable; otherwise null
  with the reason (the planner then uses a rated figure labelled ``modelled``).
- ``jobs``: one entry per job (algorithm, environment, the hyperparameters that change an
  operation's cost). For replay-loop algorithms (DQN, DDPG):

  * micro measurements, in this process, on transitions the job's own actor collected: env step;
    per compute backend, actor inference (batch = envs per actor), learner update (batch =
    ``batch_size``, and each data-parallel learner's share of it), a weight publication
    (``weights()`` into an actor), the learner's parameter count and device (``learner_device``: torch's
    device and threads; backends with the same one run the same learner); per replay memory, ``add`` of
    one step and of one INSERT message's transitions, ``sample(batch_size)``,
    ``update_priorities(batch_size)`` and the two alternated as the replay node does them per
    update (``cycle_us``: a memory may defer work from one to the other), on a memory filled to
    ``min(buffer_size, 20,000)`` and built as a run builds it (`transitions.make_memory`: told
    ``frames=`` where it stores an image's frames once). A backend or memory that cannot run the job is
    left out with the reason, never measured: a backend the validator refuses (an image job on one
    without convolutions), a memory whose full buffer would not fit the host's memory
    (`footprint_refusal`: an Atari transition stored whole is 56 KB, a million of them 53 GiB);
  * the sizes of the wire messages (INSERT, BATCH, priorities, weights), each encoded as the runtime
    sends it from the job's own transitions: an image job's INSERT carries each frame once and its
    BATCH each row's k + 1 frames (a memory that stores frames once) or both stacks whole (any other:
    each memory's ``batch_bytes``); the transports are timed at these sizes, round trip and one-way
    stream (the model's link bound);
  * ``allreduce``: policy data-parallel's collectives among N idle learner processes (gloo: the
    gradient all-reduce and the step's agreement), per update, for each learner count N a plan
    considers (``by_learners``);
  * per transport and placement, the runtime's real replay node measured message by message
    (`measure_replay_node`: the node in its own process, a client as the actor and one as the
    learner): INSERT, FETCH and SAMPLE round trips, the learner's sends, the in-network push round
    and the node's own handling time per message. Each transport is measured in a child process
    of its own under a time limit (``--transport-seconds``): one that hangs, kills its process or
    first starts a cluster for longer than that is left out of the profile with the reason;
  * ``calibration``: real runs of the job (`calibration_settings` says which and what each is
    for), each repeated until its spread is known (`calibrate_job`, in rounds) and read in its steady
    window the way `rlbench plan --validate` reads its runs (rlbench.plan.measure): the steady
    rate, the actor's rate alone during warm-up, and from the roles' time splits what the learner
    spends per update (compute, sends, its loop, CPU) and what actors and the replay node spend
    per env step. These in-situ figures carry what no micro measurement sees (loop bookkeeping,
    cache pollution, waking a sleeping peer, processes sharing cores); the model keeps them as
    the loops' own costs and adds the micro differences of other components to them. A run's
    warm-up and steady window are sized in env steps for CartPole's pace and capped in seconds
    (CALIBRATION_WARM_UP_MAX_S, CALIBRATION_STEADY_MAX_S) for a job a hundred times slower per step,
    never under CALIBRATION_EPISODES of the job's episodes; its learner-bound runs train every
    `calibration_train_every` env steps: an Atari job (a CNN update of 40-100 ms every 4 env steps
    here) is calibrated at its own k = 4 on warm-ups of ~900 steps and windows of ~650, never its
    preset's learning_starts of 80,000, which a profile could not wait for (docs/planner.md).

  For tabular algorithms offline (SwiftRL): per compute backend and setting (``--upmem-dpus`` counts of
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
from rlbench.plan import measure  # standard library only

SCHEMA = "rlbench.profile/3"  # /3: the all-reduce at each learner count; /2: steady windows, spreads, machine states
DEFAULT_JOBS = ("dqn:CartPole-v1", "qlearning:Taxi-v3")
DEFAULT_DATASETS = (100_000, 300_000)  # sizes a tabular job is profiled at (the fit extrapolates; collecting a
# million Taxi transitions took 15 s of the profile's two minutes, and a fit of 300k lasts tens of ms, well timed)
FIT_REPEATS = 3  # fit_offline runs per backend setting and dataset size (the median is kept)
FILL_ITEMS = 20_000  # replay memories are measured holding this many transitions (or their capacity)
DATA_PARALLEL_LEARNERS = (2, 4)  # learner counts of policy data-parallel a plan considers (where they split the batch)
# Hyperparameters that change how often things happen, not what one operation costs: a profile
# measured with any value of these serves every value (the model takes them from the plan's job).
SCHEDULE_HYPERPARAMETERS = frozenset({
    "train_every", "publish_every", "learning_starts", "total_steps", "epochs", "learning_rate", "gamma",
    "alpha", "tau", "target_update_every", "epsilon_start", "epsilon_end", "exploration_steps",
    "exploration_fraction", "per_beta_start", "per_beta_end", "per_eps"})
# Plugin run options that set a component's parallelism, and the values a profile measures (and a
# plan may choose). Keyed by the option's flag.
OPTION_SWEEPS: dict[str, tuple[Any, ...]] = {"--upmem-dpus": (64, 256, 1024, 2048)}
DEFAULT_CALIBRATED = ("shm",)  # transports with calibration runs (the rest: replay-node figures + pooled loop costs)
TRANSPORT_TIME_LIMIT_S = 30.0  # a transport whose measurements take longer is left out (with the reason): an
# image job's node figures alone take 5-10 s a transport on a busy host (its messages are megabytes)
# Transports a profile leaves out unless named (`rlbench profile --transports`), and why.
NOT_PROFILED_BY_DEFAULT = {
    "ray": "not profiled by default: it starts a Ray cluster first, longer than the profile's two minutes allow; "
           "`rlbench profile --transports ray --transport-seconds 90` measures it (a plan then proposes it)"}
TRANSPORT_CASE_S = 0.1  # seconds per transport benchmark case (size x mode)
CALIBRATION_FREE_S = 0.4  # a calibration run's warm-up: long enough to time the actor alone
CALIBRATION_STEADY_S = 1.5  # a calibration run's steady window (after warm-up and the limiter's slack) ...
CALIBRATION_STEADY_STEPS = 1_200  # ... and at least this many env steps (enough episodes end in it) ...
CALIBRATION_STEADY_MAX_S = 4.0  # ... unless they take longer than this at the rate the micro figures suggest
# (an Atari job's ~100 env steps/s: 1,200 steps are 12 s a run; its lives end every ~30 steps, so 4 s hold
# a dozen episodes)
CALIBRATION_WARM_UP_STEPS = 2_000  # a calibration run's learning_starts at least (where its actor is not timed
CALIBRATION_WARM_UP_MAX_S = 1.0  # alone), unless its actor alone takes longer than this for them
CALIBRATION_EPISODES = 24  # episodes of the job's actor a capped window or warm-up holds at least (a rate
# needs measure.MIN_POINTS episode ends, three in each half)
LEARNER_BOUND = 2.0  # a learner-bound calibration run's updates take at least this many times its actor's steps
SPLIT_STEADY_STEPS = 400  # the steady window of a run read only for its learner's time split per update
# (a transport's wait, lock-step): an average over hundreds of updates, which needs no long window for a rate
CALIBRATION_REPEATS = 2  # undisturbed runs per calibration setting that agree within ...
CALIBRATION_AGREEMENT = 0.10  # ... (max - min) / median; more runs until they do, up to
CALIBRATION_MAX_REPEATS = 3
PROFILE_BUDGET_S = 115.0  # calibration rounds past CALIBRATION_REPEATS run a setting only where it ends before this
# (seconds from the profile's start): two minutes, less a margin for the runs' own spread
# replay memories whose work is the node's own thread's (the host's memory, a file): their micro figures
# hold in a run; a memory on another device runs that device's threads or calls beside the roles
HOST_SIDE = ("host", "disk")
ACTOR_HEAVY_SHARE = 0.25  # an actor-heavy calibration run trains so rarely that the learner's work per env
# step is about this share of the actor's

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
    from rlbench.config import RunConfig, run_hyperparameters
    from rlbench.validate import validate_hyperparameters

    registry = registry or _registry()
    algorithm = registry.get("algorithm", job.algo).create()
    hp = run_hyperparameters(algorithm, RunConfig(algo=job.algo, env=job.env, hyperparameters=job.overrides()), registry)
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
    if isinstance(document, dict) and str(document.get("schema", "")).startswith("rlbench.profile/") \
            and document.get("schema") != SCHEMA:
        raise ProfileError(f"{path} was made by another rlbench ({document['schema']}; this one reads {SCHEMA}): "
                           "run `rlbench profile` again")
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


def contended_figures(entry: dict[str, Any], keys: list[str] | None = None) -> list[str]:
    """Which figures of a host entry (of the jobs `keys`, else all) someone else's work disturbed
    while they were measured, each as "what: why" (rlbench.plan.measure.contention)."""
    found = []
    for name, transport in (entry.get("transports") or {}).items():
        why = measure.contention(transport.get("machine_state"))
        if why:
            found.append(f"transport {name}: {why}")
    for key, job in (entry.get("jobs") or {}).items():
        if keys is not None and key not in keys:
            continue
        for group, state in (job.get("machine_state") or {}).items():
            why = measure.contention(state)
            if why:
                found.append(f"{key} {group} figures: {why}")
        for world, reduce in ((job.get("allreduce") or {}).get("by_learners") or {}).items():
            why = measure.contention(reduce.get("machine_state"))
            if why:
                found.append(f"{key} all-reduce among {world}: {why}")
        for name, run in (job.get("calibration") or {}).items():
            if run.get("contended"):
                found.append(f"{key} calibration {name}: {run['contended']}")
    if not found and "jobs" in entry and not any("machine_state" in job for job in entry["jobs"].values()):
        why = measure.contention(entry.get("machine_state"))  # a profile without per-group states
        if why:
            found.append(f"the whole profile: {why}")
    return found


# ---------------------------------------------------------------------------------- measuring
def _timed(call: Callable[[], Any], *, seconds: float = 0.12, max_calls: int = 3000, warmup: int = 3
           ) -> tuple[float, float]:
    """(median microseconds per call, spread) over at most `seconds` (and at least 5 calls); the
    spread is `spread_of`'s."""
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
    return spread_of(times)


def spread_of(times_ns: list[int]) -> tuple[float, float]:
    """(median in microseconds, spread) of consecutive timings: they are cut into STRETCHES stretches
    and the spread is the half range of the stretches' medians relative to the median, so a burst of
    someone else's load shows in the spread rather than in the figure."""
    middle = statistics.median(times_ns)
    n = len(times_ns)
    if n < 2 * measure.STRETCHES or middle <= 0:
        return middle / 1e3, 0.0
    bounds = [round(i * n / measure.STRETCHES) for i in range(measure.STRETCHES + 1)]
    medians = [statistics.median(times_ns[a:b]) for a, b in itertools.pairwise(bounds)]
    return middle / 1e3, (max(medians) - min(medians)) / 2 / middle


def _timed_into(figures: dict[str, Any], name: str, call: Callable[[], Any], **timing: Any) -> float:
    """Time `call` into figures[name], its spread into figures["spread"][name]; returns the figure."""
    value, spread = _timed(call, **timing)
    figures[name] = value
    figures.setdefault("spread", {})[name] = spread
    return value


def insert_transitions() -> int:
    """Transitions per actor INSERT message in the distributed runtime (imported here, not at module
    level: the CLI imports this module to list its commands)."""
    from rlbench.runtime.distributed.roles import ACTOR_INSERT_TRANSITIONS

    return ACTOR_INSERT_TRANSITIONS


def profile_host(jobs: list[Job], *, datasets: tuple[int, ...] = DEFAULT_DATASETS,
                 calibrate: tuple[str, ...] = DEFAULT_CALIBRATED, transport_seconds: float = TRANSPORT_TIME_LIMIT_S,
                 transports: tuple[str, ...] | None = None,
                 progress: Progress = lambda line: None) -> tuple[str, dict[str, Any]]:
    """Measure every job on this machine; returns (host key, host entry). `transports`: measure only
    these (None: every one but those NOT_PROFILED_BY_DEFAULT)."""
    from rlbench import __version__
    from rlbench.fingerprint import machine_fingerprint
    from rlbench.machine_state import watch

    started = time.perf_counter()
    fingerprint = machine_fingerprint()
    key = host_key(fingerprint)
    cores = int(fingerprint.get("cores_usable") or fingerprint.get("cores") or 1)
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
            with watch(busy_processes=1) as micro:
                if algorithm.capabilities.loop == "replay":
                    samples = collect_samples(job, registry)
                    figures = measure_replay_job(job, registry, progress, samples)
                    sizes.update(figures["messages"].values())
                    replay_jobs.append((job, figures, samples))
                else:
                    figures = measure_tabular_job(job, registry, datasets, progress)
            figures["machine_state"] = {"micro": micro.report()}
            if algorithm.capabilities.loop == "replay":
                figures["allreduce"] = _measure_job_allreduce(figures, registry, progress, job)
            figures["profiling_s"] = time.perf_counter() - t0
            entry["jobs"][job.key] = figures
        entry["transports"] = {}
        if replay_jobs:
            inputs = {job.key: samples.node_inputs() for job, _, samples in replay_jobs}
            nodes = measure_transports(registry, tuple(sorted(sizes)), inputs, time_limit=transport_seconds,
                                       only=transports, progress=progress)
            for name, measured in nodes.items():
                entry["transports"][name] = measured["transport"]
                for job, figures, _ in replay_jobs:
                    for placement, node in measured.get("replay_node", {}).get(job.key, {}).items():
                        figures.setdefault("replay_node", {})[f"{name}/{placement}"] = node
            for job, figures, _ in replay_jobs:
                t0 = time.perf_counter()
                calibrate_job(job, figures, entry["transports"], registry, calibrate=calibrate, progress=progress,
                              cores=cores, deadline=started + PROFILE_BUDGET_S)
                figures["profiling_s"] += time.perf_counter() - t0
    entry["machine_state"] = machine.report()
    entry["profiling_s"] = time.perf_counter() - started
    return key, entry


def _measure_job_allreduce(figures: dict[str, Any], registry: Any, progress: Progress, job: Job) -> dict[str, Any]:
    """The collectives of the job's cpu learner among N idle processes, for each learner count N a
    data-parallel plan considers (the batch splits), keyed by N; else why not."""
    cpu = figures["compute"].get("cpu") or {}
    if "data-parallel" not in {c.name for c in registry.components("policy")}:
        return {"available": False, "reason": "no data-parallel policy is registered"}
    counts = learner_counts(figures["hyperparameters"]["batch_size"])
    if not cpu.get("available") or not counts:
        return {"available": False, "reason": "the cpu learner is unavailable or the batch does not split"}
    by_learners = {}
    for world in counts:
        t0 = time.perf_counter()
        measured = measure_allreduce(cpu["parameters"], world)
        progress(f"{job.key}: gloo all-reduce of {cpu['parameters']:,} parameters among {world} processes "
                 + (f"{measured['allreduce_us']:.0f} us + agreement {measured['agreement_us']:.0f} us"
                    if measured.get("available") else f"failed: {measured['reason']}")
                 + f" ({time.perf_counter() - t0:.1f} s)")
        by_learners[str(world)] = measured
    return {"available": True, "by_learners": by_learners}


def _work_for(seconds: float) -> None:
    """Keep this core busy for `seconds` (a spin: what a busy core or a learner's update looks like)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


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
    _work_for(seconds)
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
    env_step_spread: float
    torch_threads: int  # torch's intra-op threads in a fresh process (before any backend sets them)
    episode_steps: float = math.inf  # env steps per episode the job's actor ran, on average (inf: none ended)

    def rows(self, n: int) -> dict[str, Any]:
        import numpy as np

        return {name: np.resize(values, (n, *values.shape[1:])) for name, values in self.transitions.items()}

    @property
    def row_bytes(self) -> int:
        return sum(values[:1].nbytes for values in self.transitions.values())

    @property
    def frames(self) -> int:
        """What a memory that stores frames once is told, and an actor's INSERTs carry (transitions.frames_of)."""
        from rlbench.runtime.transitions import frames_of

        return frames_of(self.spec)

    def node_inputs(self) -> NodeInputs:
        return NodeInputs(self.rows(insert_transitions()), self.weights, self.hp.batch_size, self.hp.buffer_size,
                          self.frames)


@dataclass
class NodeInputs:
    """What `measure_replay_node` sends, as plain data (it travels to a child process)."""

    insert: dict[str, Any]  # one INSERT message's transitions (consecutive steps of the job's actor)
    weights: list[Any]
    batch_size: int
    capacity: int
    frames: int = 0  # an image job's frames per observation: INSERTs carry each frame once, the memory stores it once


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
    ended = float(np.count_nonzero(transitions["done"]))
    return JobSamples(algorithm, hp, spec, transitions, {name: v[chosen] for name, v in transitions.items()},
                      [np.asarray(w) for w in weights], *spread_of(env_times), torch_threads,
                      len(transitions["done"]) / ended if ended else math.inf)


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
        "frames": samples.frames,
        "episode_steps": samples.episode_steps if math.isfinite(samples.episode_steps) else None,
        "env_step_us": samples.env_step_us,
        "spread": {"env_step_us": samples.env_step_spread},
        "messages": message_bytes(samples, chunk),
        "compute": {}, "replay": {},
    }
    for component in registry.components("compute"):
        algorithm_caps = samples.algorithm.capabilities
        if all(component.capabilities.supports(job.algo, role, algorithm_caps.needs_of(role))
               for role in algorithm_caps.roles):
            refusal = _refusal(job, registry, compute=component.name)
            figures["compute"][component.name] = {"available": False, "reason": refusal} if refusal else \
                _measured_or_why(component, _measure_compute, samples)
    for component in registry.components("replay"):
        refusal = footprint_refusal(component, samples)
        figures["replay"][component.name] = {"available": False, "reason": refusal} if refusal else \
            _measured_or_why(component, _measure_memory, samples, chunk)
    progress(f"{job.key}: env, {len(figures['compute'])} compute backends, {len(figures['replay'])} replay memories "
             f"({time.perf_counter() - t0:.1f} s)")
    return figures


def message_bytes(samples: JobSamples, chunk: int) -> dict[str, int]:
    """Bytes of the job's messages on the wire, each encoded as the runtime sends it from the job's own
    transitions: an actor's INSERT of `chunk` consecutive steps (an image job's: each frame once), the
    BATCH of a memory that stores frames once (each row's k + 1 frames; a memory of whole stacks sends
    its own size, its ``batch_bytes``), the learner's priorities and the policy's weights (PARAMS)."""
    from rlbench.runtime.distributed import messages
    from rlbench.runtime.distributed.replay_client import _insert as insert_arrays  # the actor's INSERT, as it is built

    hp = samples.hp
    insert = messages.encoded_bytes(messages.Op.INSERT, insert_arrays(samples.rows(chunk), None, chunk, samples.frames))
    return {"insert": insert, "batch": batch_bytes(samples.batch, samples.frames),
            "priorities": hp.batch_size * 16 + 128,
            "weights": messages.encoded_bytes(messages.Op.PARAMS, messages.weights_arrays(samples.weights, 0))}


def batch_bytes(batch: dict[str, Any], frames: int) -> int:
    """Bytes of a BATCH of these transitions as the replay node sends it (ReplayNode._batch): from a memory
    that stores frames once (`frames` > 0), each row's k + 1 frames (``stacks``), else obs and next_obs whole."""
    import numpy as np

    from rlbench.runtime.distributed import messages

    rows = len(batch["reward"])
    arrays = {"indices": np.zeros(rows, np.int64), "weights": np.zeros(rows, np.float32), **batch,
              "step": np.int64(0)}
    if frames:
        obs = batch["obs"]
        per_row = obs.shape[1] + 1 if frames > 1 else 2
        del arrays["obs"], arrays["next_obs"]
        arrays["stacks"] = np.zeros((rows, per_row, *obs.shape[2 if frames > 1 else 1:]), obs.dtype)
    return messages.encoded_bytes(messages.Op.BATCH, arrays)


def _refusal(job: Job, registry: Any, **components: str) -> str:
    """The validator's refusal of a local run of the job on these components ("" where it accepts it, or
    where only availability stops it: a probe says why then): e.g. an image job on a compute backend
    without convolutions."""
    from rlbench.config import RunConfig
    from rlbench.errors import InvalidCombinationError
    from rlbench.validate import validate

    try:
        validate(RunConfig(algo=job.algo, env=job.env, num_envs=job.num_envs, **components), registry)
    except InvalidCombinationError as exc:
        return str(exc)
    except RlbenchError:
        return ""
    return ""


def footprint_refusal(component: Any, samples: JobSamples) -> str:
    """Why a replay memory cannot hold the job's buffer on this host ("" where it can): what it stores per
    transition (each field as given; a memory that stores frames once keeps one frame per step of a
    stream, measured on the job's own transitions), times buffer_size, against the host's memory. A
    memory that stores an Atari transition whole keeps 56 KB of it: a million need 53 GiB. Measured
    anyway, it would be built at that capacity (an OpenCL device buffer of that size) or filled for
    the profile alone past what it can hold; on disk (memmap) a buffer past the host's memory pages
    every sample in from the disk, which a profile of 20,000 transitions in the page cache cannot time."""
    from rlbench.fingerprint import core_fingerprint

    frames = samples.frames if component.capabilities.frames else 0
    per_transition = samples.row_bytes
    if frames:
        from rlbench.kit.frames import pack

        observations = samples.transitions["obs"]
        distinct, _, _ = pack(observations, samples.transitions["next_obs"], frames)
        per_transition += distinct[:1].nbytes * len(distinct) / len(observations) - 2 * observations[:1].nbytes
    needed = per_transition * samples.hp.buffer_size
    memory = core_fingerprint().get("memory_bytes")
    if not memory or needed <= memory:
        return ""
    how = "its frames once" if frames else "each transition whole"
    return (f"stores {how} ({per_transition:,.0f} B a transition here): the job's buffer of "
            f"{samples.hp.buffer_size:,} transitions would take {needed / 2**30:,.1f} GiB, more than this host's "
            f"{memory / 2**30:,.1f} GiB of memory; " + ("a memory that stores frames once holds it, or "
                                                       if not frames and samples.frames else "")
            + "a smaller --hp buffer_size fits")


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


def learner_counts(batch_size: int) -> tuple[int, ...]:
    """The data-parallel learner counts a plan considers for a global batch: those that split it."""
    return tuple(n for n in DATA_PARALLEL_LEARNERS if batch_size % n == 0)


def learner_parameters(learner: Any) -> int:
    """How many numbers one gradient all-reduce of the learner carries: the parameters its torch
    optimizers step (what rlbench.runtime.policies.data_parallel averages)."""
    import torch

    return sum(p.numel() for value in vars(learner).values() if isinstance(value, torch.optim.Optimizer)
               for group in value.param_groups for p in group["params"] if p.requires_grad)


def _measure_compute(component: Any, samples: JobSamples) -> dict[str, Any]:
    """A compute backend's micro figures, numpy's BLAS and the OpenMP runtimes on one thread as in a
    role's process (rlbench.runtime.launchers.local: its CPUs, one): the cpu backend's CNN engine runs
    its convolutions as BLAS matmuls, which on two threads of a busy two-core host read 30-100 ms a
    forward instead of 0.8 (a thread waits for its peer to get a core)."""
    import threadpoolctl

    with threadpoolctl.threadpool_limits(limits=1):
        return _compute_figures(component, samples)


def _compute_figures(component: Any, samples: JobSamples) -> dict[str, Any]:
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
    # what the learner is: backends whose learners are torch on one device and thread count run the same
    # learner, and the model reads them from one measurement (rlbench.plan.model.learner_figures)
    device = getattr(compute, "torch_device", None)
    learner_device = f"{device()} x{torch.get_num_threads()} threads" if device is not None else None

    def batch_of(size: int) -> Any:
        return Sample(np.arange(size, dtype=np.int64), {k: v[:size] for k, v in samples.batch.items()},
                      np.ones(size, np.float32))

    sample = batch_of(hp.batch_size)
    figures: dict[str, Any] = {}
    _timed_into(figures, "inference_us", lambda: actor.act(observations, 10**9))  # late: epsilon at its end
    _timed_into(figures, "learner_update_us", lambda: learner.update(sample), seconds=0.5, max_calls=400)
    figures["learner_cpu_share"] = _cpu_share(lambda: learner.update(sample))
    _timed_into(figures, "publish_us", lambda: actor.load_weights(learner.weights(), learner.updates))
    # a data-parallel learner updates on its share of the global batch: its cost at each share
    figures["learner_update_by_batch"] = {str(hp.batch_size): figures["learner_update_us"]}
    for learners in learner_counts(hp.batch_size):
        share = batch_of(hp.batch_size // learners)
        value, spread = _timed(lambda: learner.update(share), seconds=0.25, max_calls=400)
        figures["learner_update_by_batch"][str(hp.batch_size // learners)] = value
        figures["spread"][f"learner_update_by_batch.{hp.batch_size // learners}"] = spread
    figures["parameters"] = learner_parameters(learner)
    figures["learner_device"] = learner_device
    return figures


def _measure_memory(component: Any, samples: JobSamples, chunk: int) -> dict[str, Any]:
    import numpy as np

    from rlbench.runtime.transitions import make_memory

    hp = samples.hp
    memory = make_memory(component, samples.spec, capacity=hp.buffer_size, alpha=hp.per_alpha, seed=0, options={})
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

    def learner_cycle() -> None:  # what the replay node does for each update: its priorities, then a batch
        if prioritized:
            memory.update_priorities(indices, priorities)
        memory.sample(hp.batch_size, 0.4)

    # what the node sends per batch drawn from it: an image's stacks as it stores them (frames once or whole)
    stores_frames = samples.frames if component.capabilities.frames else 0
    figures: dict[str, Any] = {"prioritized": prioritized, "stores_frames": bool(stores_frames),
                               "batch_bytes": batch_bytes(samples.batch, stores_frames)}
    _timed_into(figures, "add_step_us", lambda: memory.add(one_step))
    _timed_into(figures, "add_insert_us", lambda: memory.add(insert))
    _timed_into(figures, "sample_us", lambda: memory.sample(hp.batch_size, 0.4))
    if prioritized:
        _timed_into(figures, "update_us", lambda: memory.update_priorities(indices, priorities))
    else:
        figures["update_us"] = 0.0
    # A memory may defer work from one call to the next (the fpga memory applies priority updates in
    # its next sample): the pair, alternated, is what one update costs the node.
    _timed_into(figures, "cycle_us", learner_cycle)
    close = getattr(memory, "close", None)
    if close is not None:
        close()
    return figures


def measure_transports(registry: Any, sizes: tuple[int, ...], inputs: dict[str, NodeInputs], *,
                       time_limit: float = TRANSPORT_TIME_LIMIT_S, only: tuple[str, ...] | None = None,
                       progress: Progress = lambda line: None) -> dict[str, dict[str, Any]]:
    """Every transport (`only`: these; otherwise all but NOT_PROFILED_BY_DEFAULT): its round trip and
    bandwidth at `sizes`, and the replay node's per-message costs over it for each job's inputs, both
    placements, with the machine's state meanwhile. Each transport is measured in a child process
    of its own under `time_limit`: a transport that hangs, crashes its process or takes longer (one
    that starts a cluster first) is left out with the reason, never the profile."""
    from rlbench.machine_state import watch

    figures: dict[str, dict[str, Any]] = {}
    for component in registry.components("transport"):
        caps = component.capabilities
        entry = {"crosses_processes": caps.crosses_processes, "crosses_hosts": caps.crosses_hosts,
                 "reliable": caps.reliable, "available": False}
        if only is not None and component.name not in only:
            figures[component.name] = {"transport": {**entry, "reason": "not measured: not among "
                                                     f"`rlbench profile --transports {','.join(only)}`"}}
            continue
        if only is None and component.name in NOT_PROFILED_BY_DEFAULT:
            figures[component.name] = {"transport": {**entry, "reason": NOT_PROFILED_BY_DEFAULT[component.name]}}
            continue
        probe = component.probe()
        if not caps.crosses_processes:
            figures[component.name] = {"transport": {**entry, "reason": "stays inside one process"}}
            continue
        if not probe.available:
            figures[component.name] = {"transport": {**entry, "reason": probe.reason}}
            continue
        t0 = time.perf_counter()
        fitting = tuple(size for size in sizes if size <= caps.max_message_bytes)
        with watch(busy_processes=2) as machine:
            measured, failure = run_isolated(_measure_one_transport, (component.name, fitting, inputs), time_limit)
        if failure:
            hint = " (`rlbench profile --transport-seconds S` allows longer)" if "did not finish" in failure else ""
            measured = {"transport": {**entry, "reason": failure + hint}}
        measured["transport"]["machine_state"] = machine.report()
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


ALLREDUCE_ROUNDS = 200  # all-reduces timed per measurement, at most: they stop after ALLREDUCE_SECONDS
ALLREDUCE_SECONDS = 3.0  # (and ALLREDUCE_MIN_ROUNDS): a Nature CNN's 6.7 MB among 4 processes on two cores
ALLREDUCE_MIN_ROUNDS = 20  # takes tens of ms a round, an MLP's ~1-8 ms


def measure_allreduce(parameters: int, world: int = 2, *, time_limit: float = 30.0) -> dict[str, Any]:
    """What policy data-parallel's collectives cost a learner per update, measured: `world` processes
    in a gloo group (as `rlbench.runtime.policies.data_parallel` builds it) all-reduce a flat float32
    gradient of `parameters` numbers, and the step's agreement (three float64), ALLREDUCE_ROUNDS
    times; medians in microseconds, rank 0's view. Each measuring process is one more busy
    process: on a machine with fewer cores than `world` plus the caller, the figure includes waiting
    for a core (it is labelled with the machine state)."""
    from rlbench.machine_state import watch

    with watch(busy_processes=world) as machine:
        measured, failure = _allreduce_group(parameters, world, ALLREDUCE_ROUNDS, time_limit)
    if failure:
        return {"available": False, "reason": failure, "world": world, "parameters": parameters}
    return {"available": True, "world": world, "parameters": parameters, "backend": "gloo",
            **measured, "machine_state": machine.report()}


def _allreduce_group(parameters: int, world: int, rounds: int, time_limit: float) -> tuple[Any, str]:
    """(rank 0's figures, "") or (None, why not). The ranks are forked by the local launcher's fork
    server, as a run's learners are: it has imported torch, which spawned ranks each imported again
    (about two thirds of a 6 s measurement among 4 on two cores). Past `time_limit`, or once a rank
    ended without a result, every rank is killed."""
    import socket

    from rlbench.runtime.launchers.local import role_context

    with socket.socket() as probe:  # a free port for the group's store
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = role_context()
    results = context.Queue()
    ranks = [context.Process(target=_allreduce_rank, args=(rank, world, port, parameters, rounds, results),
                             daemon=True) for rank in range(world)]
    for process in ranks:
        process.start()

    def gone() -> str:
        return next((f"rank {rank} died (exit code {process.exitcode})" for rank, process in enumerate(ranks)
                     if process.exitcode not in (None, 0)), "")

    finished = False
    try:
        figures, why = _await_outcome(results, time_limit, gone)
        finished = not why
        return figures, why
    finally:
        for process in ranks:
            process.join(2 if finished else 0)
            if process.is_alive():
                process.kill()
            process.join(5)
        results.close()
        results.join_thread()


def _allreduce_rank(rank: int, world: int, port: int, parameters: int, rounds: int, results: Any) -> None:
    """One rank of the measuring group: rank 0 puts its figures; any rank puts why it failed."""
    try:
        figures = _allreduce_timings(rank, world, port, parameters, rounds)
        if rank == 0:
            results.put(("ok", figures))
    except BaseException as exc:  # noqa: BLE001 - the measuring process reports it; this rank ends anyway
        results.put(("error", f"rank {rank}: {type(exc).__name__}: {exc}"))


def _allreduce_timings(rank: int, world: int, port: int, parameters: int, rounds: int) -> dict[str, Any]:
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, is_master=rank == 0, timeout=datetime.timedelta(seconds=20))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=20))
    try:
        gradient = torch.ones(parameters, dtype=torch.float32)
        agreement = torch.ones(3, dtype=torch.float64)
        clock = time.perf_counter_ns
        timings: dict[str, list[int]] = {"allreduce": [], "agreement": []}
        deadline = clock() + int(ALLREDUCE_SECONDS * 1e9)
        for round_ in range(rounds + 5):
            # rank 0 says in the agreement when time is up, so every rank stops after the same round
            agreement[0] = 1.0 if rank == 0 and clock() > deadline and round_ >= ALLREDUCE_MIN_ROUNDS + 5 else 0.0
            started = clock()
            dist.all_reduce(agreement)
            middle = clock()
            if agreement[0] > 0:
                break
            dist.all_reduce(gradient)
            gradient.div_(world)
            if round_ >= 5:  # the first rounds set up the connections
                timings["agreement"].append(middle - started)
                timings["allreduce"].append(clock() - middle)
        allreduce, allreduce_spread = spread_of(timings["allreduce"])
        agreement_us, _ = spread_of(timings["agreement"])
        return {"allreduce_us": allreduce, "agreement_us": agreement_us, "spread": {"allreduce_us": allreduce_spread}}
    finally:
        dist.destroy_process_group()


def run_isolated(function: Callable[..., Any], args: tuple[Any, ...], time_limit: float) -> tuple[Any, str]:
    """`function(*args)` in a spawned process leading its own session: (its result, "") or (None,
    why not). Past `time_limit`, or when it ends without a result, the session (the child and what
    it started) is killed."""
    import multiprocessing
    import signal

    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    child = context.Process(target=_isolated_entry, args=(function, args, results))  # not daemonic: it spawns
    child.start()
    try:
        return _await_outcome(results, time_limit, lambda: "" if child.is_alive() else
                              f"its measuring process died (exit code {child.exitcode})")
    finally:
        child.join(2)
        try:
            os.killpg(child.pid, signal.SIGKILL)  # what it started and left behind goes with it
        except (ProcessLookupError, PermissionError):
            pass
        child.join(5)
        results.close()
        results.join_thread()


def _await_outcome(results: Any, time_limit: float, gone: Callable[[], str]) -> tuple[Any, str]:
    """What measuring processes put on `results`, ("ok", figures) or ("error", why): (figures, "") or
    (None, why not). `gone()` names a process that ended without its result ("" while none has)."""
    import queue

    deadline = time.monotonic() + time_limit
    outcome: tuple[str, Any] | None = None
    while outcome is None and time.monotonic() < deadline:
        try:
            outcome = results.get(timeout=0.2)
        except queue.Empty:
            why = gone()
            if why:
                try:
                    outcome = results.get(timeout=0.5)  # it may have put its result just before it ended
                except queue.Empty:
                    outcome = ("error", why)
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


BUSY_LEARNER_S = 0.001  # the work between a learner's requests when its round trip is timed as in a run
NODE_FIGURE_S = 0.4  # a replay-node figure is timed over 60 messages, or as many as this takes (10 at least)
NODE_MIN_ROUNDS = 10
POLL_WINDOW_S = 0.2  # how long the node's polling (and a waiting client's) is measured


def _handled_s(before: dict[str, Any], after: dict[str, Any]) -> float:
    """The node's time handling messages between two of its reports (its serve.* and push.* histograms)."""
    def total(report: dict[str, Any]) -> int:
        return sum(h.get("total", 0) for name, h in report.get("histograms", {}).items()
                   if name.startswith(("serve.", "push.")))
    return max(0, total(after) - total(before)) / 1e9


def measure_replay_node(inputs: NodeInputs, transport: str, placement: str, *, rounds: int = 60) -> dict[str, Any]:
    """Per-message costs of the runtime's real replay node (prioritized memory) over `transport`:
    it runs in its own process (rlbench.kit.access.replay_node), one client speaks as an actor and
    one as the learner. Round trips and sends as the roles see them, and the node's own handling
    time per message (its report's serve.* and push.BATCH), all medians in microseconds. SAMPLE is
    timed back to back and, as a learner sends it, after BUSY_LEARNER_S of work each
    (`sample_rtt_busy_us`: the node's waiting spin has lapsed by then and it must be woken).

    The one place replay-node costs are measured: re-point it here if the runtime changes how."""
    import numpy as np

    from rlbench.kit.access import replay_node
    from rlbench.metrics import Histogram
    from rlbench.runtime.distributed.roles import PUSH_CREDIT

    chunk = len(inputs.insert["obs"])
    priorities = np.random.default_rng(0).exponential(1.0, inputs.batch_size) + 1e-3
    figures: dict[str, Any] = {"method": "replay node in its own process (rlbench.kit.access), medians",
                               "transport": transport, "placement": placement}
    clock = time.perf_counter_ns

    def timed(call: Callable[[], Any], n: int = rounds, at_least: int = NODE_MIN_ROUNDS,
              before: Callable[[], Any] = lambda: None) -> float:
        """The median of `n` calls, or of those made in NODE_FIGURE_S (`at_least` of them): an image job's
        messages take milliseconds each (a 6.7 MB PARAMS over udp 50 ms), a vector job's microseconds."""
        times: list[int] = []
        deadline = clock() + int(NODE_FIGURE_S * 1e9)
        while len(times) < n and (len(times) < at_least or clock() < deadline):
            before()
            started = clock()
            call()
            times.append(clock() - started)
        return statistics.median(times) / 1e3

    with replay_node(transport, placement=placement, replay="prioritized", capacity=inputs.capacity,
                     batch_size=inputs.batch_size, frames=inputs.frames) as node:
        fill = -(-max(2 * inputs.batch_size, 2048) // chunk)  # INSERTs before the memory serves batches
        figures["insert_rtt_us"] = timed(lambda: node.actor.add(inputs.insert), max(rounds, fill), fill)
        versions = iter(range(1, 1 << 30))
        figures["publish_send_us"] = timed(lambda: node.learner.publish_params(inputs.weights, next(versions)))
        figures["fetch_rtt_us"] = timed(lambda: node.actor.fetch_params(-1))
        updates = iter(range(1 << 30))
        if placement == "server":
            figures["sample_rtt_us"] = timed(lambda: node.learner.sample(inputs.batch_size, 0.4))

            # as a learner asks: after an update's worth of work, the node idle meanwhile
            figures["sample_rtt_busy_us"] = timed(lambda: node.learner.sample(inputs.batch_size, 0.4), rounds // 2,
                                                  before=lambda: _work_for(BUSY_LEARNER_S))
            indices = np.array(node.learner.sample(inputs.batch_size, 0.4).indices)  # a copy: the view is reused
            figures["priorities_send_us"] = timed(lambda: node.learner.update_priorities(
                indices, priorities, learner_updates=next(updates)))
        else:
            node.learner.credit(1, 0.4)
            indices = np.array(node.learner.wait_pushed(30.0).indices)  # a copy: the receive buffer is reused

            def round_trip() -> None:  # give one credit back with the priorities, wait for the next push
                node.learner.update_priorities(indices, priorities, learner_updates=next(updates), credit=1,
                                               beta=0.4)
                node.learner.wait_pushed(30.0)

            figures["push_round_us"] = timed(round_trip)
            ready = []
            deadline = time.perf_counter() + NODE_FIGURE_S
            while len(ready) < rounds and (len(ready) < NODE_MIN_ROUNDS or time.perf_counter() < deadline):
                # no more ahead than a run's node pushes: an image job's batches (1.1 MB each for Atari) past
                # the transport's queue for a peer that has not read drop the peer
                node.learner.update_priorities(indices, priorities, learner_updates=next(updates), credit=PUSH_CREDIT,
                                               beta=0.4)
                time.sleep(0.02)  # the node pushes them; each is then waiting when asked for
                ready += [timed(lambda: node.learner.wait_pushed(30.0), 1, 1) for _ in range(PUSH_CREDIT)]
            figures["push_ready_us"] = statistics.median(ready)
            figures["priorities_send_us"] = timed(lambda: node.learner.update_priorities(
                indices, priorities, learner_updates=next(updates)))
        # what polling costs the node in a run's rhythm: a client asks after each millisecond of work, as
        # a learner does, and the node's CPU beyond its handling of those messages is its polling (a
        # poll-mode transport spins after each message, then naps; a blocking one sleeps in the kernel)
        ask = (lambda: node.learner.sample(inputs.batch_size, 0.4)) if placement == "server" else round_trip
        before, started = node.report(), time.perf_counter()
        while time.perf_counter() < started + POLL_WINDOW_S:
            _work_for(BUSY_LEARNER_S)
            ask()
        paced_s, report = time.perf_counter() - started, node.report()
        figures["node_poll_cores"] = max(0.0, report.get("cpu_s", 0.0) - before.get("cpu_s", 0.0)
                                         - _handled_s(before, report)) / paced_s
        if placement == "in-network":  # a client waiting for what does not come, as a held actor waits
            cpu_started, started = time.thread_time(), time.perf_counter()
            node.learner.channel.next_push(POLL_WINDOW_S)
            figures["client_wait_cores"] = (time.thread_time() - cpu_started) / (time.perf_counter() - started)
        histograms = report.get("histograms", {})
    serve = {}
    for name, key in (("serve.INSERT", "insert_us"), ("serve.UPDATE_PRIORITIES", "priorities_us"),
                      ("serve.PUBLISH_PARAMS", "publish_us"), ("serve.FETCH_PARAMS", "fetch_us"),
                      ("push.BATCH", "batch_us")):
        if name in histograms:
            serve[key] = Histogram.from_dict(histograms[name]).summary()["p50"]
    figures["node"] = serve
    return figures


# ----------------------------------------------------------------------------- calibration runs
@dataclass(frozen=True)
class Calibration:
    """One calibration setting: a real run of the job on the calibrated components (prioritized
    replay, 1 actor unless said), what it is for in the model, and its budget's shape."""

    key: str
    placement: str
    transport: str | None = None
    compute: str = "cpu"
    replay: str = "prioritized"
    actors: int = 1
    train_every: int = 1
    free_phase: bool = True  # its warm-up lasts long enough to time the actor alone
    learners: int = 1  # more: policy data-parallel
    split_only: bool = False  # the model reads only its learner's time split: a short steady window


def calibration_settings(job: Job, figures: dict[str, Any], transports: dict[str, Any], registry: Any, *,
                         calibrate: tuple[str, ...], cores: int) -> list[Calibration]:
    """The calibration runs of a replay-loop job, each for a term of the model (rlbench.plan.model):
    - `local` (learner-heavy: one update per env step, or per `calibration_train_every`) and
      `local/actor-heavy` (one update per many env steps): two equations for the local loop's
      in-situ cost per env step and per update;
    - `T/server`, `T/in-network` for each transport T of `calibrate` that was measured usable:
      learner-bound, one actor; the learner's period, the split of it, each role's CPU;
    - `T/server/NAME` (the first of them) for each other compute backend: what its threads or device
      calls cost beside the other roles (an OpenCL device's threads compete with them for the cores);
    - `T/server/replay-NAME` for each replay memory on a device (not the host's memory or a file):
      what its device's work beside the other roles does to the learner's wait for a batch and to its
      compute, which its micro figures, timed alone, do not show;
    - `U/server/wait` for each other transport U measured usable: the learner's wait for its batch
      over U in a run, which its round trips timed alone do not give (tcp's measured 47 us alone
      against shm's 96, and 170-177 in runs against shm's 105). Only that wait is read; two runs,
      as every setting: one run's wait was 54 us off what the validation then measured;
    - `T/server/saturated-A`, A = cores actors, actor-heavy, so every core is busy: how much dearer
      each role's work gets when processes outnumber cores;
    - `T/server/data-parallel-2` for each of them that serves and each other transport U measured
      usable (where the policy is registered and the batch splits): two learners in lock-step,
      learner-bound; their compute, their all-reduce and what they wait for each other (a learner a
      busy core delays makes the other wait at the all-reduce), per update. One per transport because
      lock-step costs each its own: two learners over tcp or uds paid 0.5-1.1 ms per update more
      than over shm (wait and all-reduce), where one learner over them paid 28-68 us more.
    The runs read only for their learner's split (`U/server/wait`, the data-parallel ones) have a
    short steady window (SPLIT_STEADY_STEPS): the profile's two minutes hold them. The learner-bound
    runs train every `calibration_train_every` env steps."""
    free, update = _step_and_update_us(job, figures)
    heavy = max(8, math.ceil(update / (ACTOR_HEAVY_SHARE * free)))
    k = calibration_train_every(job, figures)
    runs = [Calibration("local", "local", train_every=k),
            Calibration("local/actor-heavy", "local", train_every=max(heavy, 2 * k), free_phase=False)]
    algorithm = registry.get("algorithm", job.algo)
    placements = [p for p in ("server", "in-network") if p in algorithm.capabilities.placements]
    nodes = figures.get("replay_node") or {}
    usable = [name for name in calibrate if transports.get(name, {}).get("available")]
    for name in usable:
        runs += [Calibration(f"{name}/{placement}", placement, name, train_every=k) for placement in placements
                 if "failed" not in nodes.get(f"{name}/{placement}", {"failed": ""})]
    served = [name for name in usable if "failed" not in nodes.get(f"{name}/server", {"failed": ""})]
    if served and "server" in placements:
        runs += [Calibration(f"{served[0]}/server/{name}", "server", served[0], compute=name, train_every=k)
                 for name, c in figures["compute"].items() if name != "cpu" and c.get("available")]
        runs += [Calibration(f"{served[0]}/server/replay-{name}", "server", served[0], replay=name, train_every=k)
                 for name, m in figures["replay"].items() if m.get("available") and m.get("device") not in HOST_SIDE]
        others = [name for name, measured in transports.items() if name not in usable and measured.get("available")
                  and "failed" not in nodes.get(f"{name}/server", {"failed": ""})]
        runs += [Calibration(f"{name}/server/wait", "server", name, train_every=k, free_phase=False, split_only=True)
                 for name in others]
        runs.append(Calibration(f"{served[0]}/server/saturated-{max(2, cores)}", "server", served[0],
                                actors=max(2, cores), train_every=heavy, free_phase=False))
        parallel = "data-parallel" in {c.name for c in registry.components("policy")}
        if parallel and 2 in learner_counts(figures["hyperparameters"]["batch_size"]):
            runs += [Calibration(f"{name}/server/data-parallel-2", "server", name, train_every=k, learners=2,
                                 free_phase=False, split_only=True) for name in [*served, *others]]
    return runs


def _step_and_update_us(job: Job, figures: dict[str, Any]) -> tuple[float, float]:
    """(an actor's step, a learner's update) with the calibrated components, from the micro figures."""
    cpu, memory = figures["compute"]["cpu"], figures["replay"]["prioritized"]
    free = (cpu["inference_us"] + figures["env_step_us"] + memory["add_step_us"]) / job.num_envs + 10.0
    update = cpu["learner_update_us"] + memory["sample_us"] + memory["update_us"] + \
        cpu["publish_us"] / figures["hyperparameters"]["publish_every"]
    return free, update


def calibration_train_every(job: Job, figures: dict[str, Any]) -> int:
    """Env steps per update of the learner-bound calibration runs: 1 (as many updates as the learner
    can make), or up to the job's own train_every while its updates still take LEARNER_BOUND times an
    actor's steps: an Atari job's 40 ms CNN update at one per env step would run at 25 env steps/s,
    and its calibration runs at ~100 (its lives end every ~30 steps: a window needs hundreds)."""
    free, update = _step_and_update_us(job, figures)
    return max(1, min(figures["hyperparameters"]["train_every"], int(update / (LEARNER_BOUND * free))))


def _calibration_budget(job: Job, figures: dict[str, Any], setting: Calibration,
                        cores: int) -> tuple[int, int, float]:
    """(learning_starts, steps, slack) of a calibration run: a warm-up long enough to time the actor
    alone (CALIBRATION_FREE_S) where the setting needs it, then the actors' slack (model.slack_steps), then a
    steady window of about CALIBRATION_STEADY_S at the rate the micro figures suggest. The floors in
    env steps (CALIBRATION_WARM_UP_STEPS, CALIBRATION_STEADY_STEPS: enough CartPole episodes end in
    them) give way to their caps in seconds for a job far slower per step (an image job's CNN update):
    the job's own learning_starts is never waited for (an Atari preset's 80,000)."""
    from rlbench.plan.model import Schedule, slack_steps

    hp = figures["hyperparameters"]
    free, update = _step_and_update_us(job, figures)
    cap = max(hp["batch_size"], min(hp["buffer_size"], 60_000))
    # enough episodes end in a window to time it (the job's actor's episodes: an Atari life lasts ~30 steps)
    episodes = CALIBRATION_EPISODES * (figures.get("episode_steps") or 0)
    warm_up = max(hp["batch_size"], min(CALIBRATION_WARM_UP_STEPS, max(CALIBRATION_WARM_UP_MAX_S / (free * 1e-6),
                                                                       episodes / (0.95 - 0.25))))
    learning_starts = int(min(cap, max(warm_up, CALIBRATION_FREE_S / (free * 1e-6)))) if setting.free_phase \
        else int(warm_up)
    per_step = update / setting.train_every + (free if setting.placement == "local" else 0.0)
    if setting.placement != "local":  # the actors' supply, or the cores they share with the learner
        per_step = max(per_step, free / setting.actors, (free + update / setting.train_every) / cores)
    at_least = min(CALIBRATION_STEADY_STEPS, max(CALIBRATION_STEADY_MAX_S / (per_step * 1e-6), episodes))
    steady = int(min(200_000, max(at_least, CALIBRATION_STEADY_S / (per_step * 1e-6))))
    if setting.split_only:  # the data-parallel ones too: their micro-figure rate is far off lock-step on shared cores
        steady = int(min(SPLIT_STEADY_STEPS, max(at_least, CALIBRATION_STEADY_S / (per_step * 1e-6))))
    schedule = Schedule(batch_size=hp["batch_size"], train_every=setting.train_every,
                        publish_every=hp["publish_every"], learning_starts=learning_starts)
    lead = 0.0 if setting.placement == "local" else slack_steps(schedule, setting.actors)
    steps = int(learning_starts + lead + steady / (1 - measure.SETTLE))
    return learning_starts, steps, lead


def calibration_run(job: Job, figures: dict[str, Any], setting: Calibration, *, seed: int = 0,
                    cores: int = 1) -> dict[str, Any]:
    """One real run of a calibration setting, read the way validation reads runs (rlbench.plan.measure):
    its steady rate and spread, the actor's rate alone in the warm-up, each role's costs (distributed),
    and whether someone else used the machine meanwhile."""
    import rlbench
    from rlbench.config import RunConfig
    from rlbench.runner import stop_series_if_signalled

    learning_starts, steps, lead = _calibration_budget(job, figures, setting, cores)
    overrides = {**job.overrides(), "learning_starts": learning_starts, "train_every": setting.train_every}
    config = RunConfig(algo=job.algo, env=job.env, num_envs=job.num_envs, placement=setting.placement,
                       transport=setting.transport or "shm", replay=setting.replay, compute=setting.compute,
                       actors=setting.actors, steps=steps, seed=seed, eval_episodes=0, hyperparameters=overrides,
                       policy="data-parallel" if setting.learners > 1 else "single-learner", learners=setting.learners)
    result = stop_series_if_signalled(rlbench.run(config))
    state = result.get("machine_state") or {}
    run: dict[str, Any] = {"seed": seed, "status": result["status"], "wall_s": result["timing"]["wall_s"],
                           "steps": result["throughput"]["env_steps"], "contended": measure.contention(state),
                           "machine": measure.machine_note(state)}
    if result["status"] != "complete":
        return {**run, "failed": f"the run ended {result['status']}: {result.get('status_reason')}"}
    steady = measure.steady_rate(result, measure.window_start(learning_starts + lead, steps))
    if steady is None and setting.split_only and result["throughput"].get("env_steps_per_s"):
        # its split is what the model reads: the whole run's rate only tells its repeats apart
        steady = measure.Steady(result["throughput"]["env_steps_per_s"], math.inf, 0, steps, 0.0, 0)
    if steady is None:
        return {**run, "failed": "too few episodes ended in the steady window to time it"}
    run.update(env_steps_per_s=steady.rate, spread=steady.spread, episodes=steady.episodes)
    if setting.free_phase:
        alone = measure.steady_rate(result, int(0.25 * learning_starts), end_step=int(0.95 * learning_starts))
        if alone is not None:
            run["free_step_us"] = 1e6 * setting.actors / alone.rate
    if setting.placement != "local":
        run.update(measure.flat_role_costs(result))
    return run


def calibration_entry(setting: Calibration, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """A setting's figures from its runs: each the median of the runs kept (`measure.kept`: the
    undisturbed ones, where there are any), its spread the larger of their half range and the steady
    windows' own spread. Runs left out stay in the entry, saying why."""
    good = measure.kept(runs, "env_steps_per_s")
    entry: dict[str, Any] = {"placement": setting.placement, "transport": setting.transport, "compute": setting.compute,
                             "replay": setting.replay,
                             "actors": setting.actors, "train_every": setting.train_every, "learners": setting.learners,
                             "method": "steady windows of repeated calibration runs (rlbench.plan.measure)",
                             "runs": runs, "repeats": len(good), "left_out": len(runs) - len(good),
                             "contended": "; ".join(sorted({r["contended"] for r in good if r["contended"]}))}
    if not good:
        return {**entry, "failed": runs[-1].get("failed", "no run measured")}
    entry["spread"] = {}
    names = sorted({name for r in good for name, value in r.items() if isinstance(value, (int, float))
                    and name not in ("seed", "steps", "wall_s", "spread", "episodes")})
    for name in names:
        values = [r[name] for r in good if r.get(name) is not None]
        if values:
            entry[name], entry["spread"][name] = measure.combine(values)
    within = [r["spread"] for r in good if math.isfinite(r["spread"])]
    if within:
        entry["spread"]["env_steps_per_s"] = max(entry["spread"]["env_steps_per_s"], statistics.median(within))
    return entry


def calibrate_job(job: Job, figures: dict[str, Any], transports: dict[str, Any], registry: Any, *,
                  calibrate: tuple[str, ...], progress: Progress, cores: int = 1,
                  deadline: float = math.inf) -> None:
    """Every calibration setting of a replay-loop job (`calibration_settings`), run in rounds: a round
    runs once each setting that still needs a run, in order, until CALIBRATION_REPEATS undisturbed
    runs of it agree within CALIBRATION_AGREEMENT or it has CALIBRATION_MAX_REPEATS (`measure.enough`).
    Rounds, not each setting's runs back to back, because the model reads settings against each
    other (a backend's compute over cpu's, the local rate the default is predicted from against the
    distributed ones) and this host's pace moves by 20-30 % within a minute (docs/planner.md): in
    rounds every setting's runs sample the same stretches of it. Rounds past CALIBRATION_REPEATS run
    a setting only where its last run's time still fits before `deadline` (time.perf_counter), and
    say so where it does not."""
    figures["calibration"] = {}
    if not (figures["compute"].get("cpu", {}).get("available") and figures["replay"].get("prioritized", {}).get("available")):
        progress(f"{job.key}: no calibration run (it needs the cpu backend and the prioritized memory)")
        return
    settings = calibration_settings(job, figures, transports, registry, calibrate=calibrate, cores=cores)
    runs: dict[str, list[dict[str, Any]]] = {setting.key: [] for setting in settings}
    failed: dict[str, str] = {}
    last_s: dict[str, float] = {}
    for round_ in range(CALIBRATION_MAX_REPEATS):
        for setting in settings:
            done = runs[setting.key]
            if setting.key in failed or measure.enough([(r.get("env_steps_per_s"), r["contended"]) for r in done],
                                                       CALIBRATION_REPEATS, CALIBRATION_MAX_REPEATS,
                                                       CALIBRATION_AGREEMENT):
                continue
            if round_ >= CALIBRATION_REPEATS and time.perf_counter() + last_s[setting.key] > deadline:
                progress(f"{job.key}: calibration {setting.key}: no run more (the profile's {PROFILE_BUDGET_S:.0f} s "
                         "budget): its spread is its runs' half range")
                continue
            t0 = time.perf_counter()
            try:
                run = calibration_run(job, figures, setting, seed=len(done), cores=cores)
            except RlbenchError as exc:
                failed[setting.key] = str(exc)
                continue
            done.append(run)
            last_s[setting.key] = time.perf_counter() - t0
            progress(f"{job.key}: calibration run {setting.key} #{len(done)} ({last_s[setting.key]:.1f} s"
                     + (f", {run['env_steps_per_s']:,.0f} env steps/s" if "env_steps_per_s" in run else f": {run['failed']}")
                     + (f"; contended: {run['contended']}" if run["contended"] else "") + ")")
    for setting in settings:
        figures["calibration"][setting.key] = ({"failed": failed[setting.key], "placement": setting.placement}
                                               if setting.key in failed else calibration_entry(setting, runs[setting.key]))


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
