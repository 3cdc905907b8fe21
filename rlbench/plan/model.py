"""The performance model: env steps/s and updates/s of a mapping, predicted from a profile.

A mapping is a job (algorithm, environment, hyperparameters) put on components: replay memory m,
compute backend c, placement p (local / server / in-network), transport T, A actor processes, a
distribution policy with N learners (single-learner: N = 1; data-parallel: N > 1), one host. Every
figure comes from the host's profile (`rlbench.plan.profile`): micro measurements of each component,
the real replay node's per-message costs over each transport, and calibration runs of the job on
the calibrated components (prioritized replay, cpu, the first transport of `--calibrate`, one
actor), each read in its steady window. The micro figures say how components differ; the
calibration runs say what a loop costs beyond its parts. Nothing is a constant of this module
except the rated power used where no meter exists (labelled ``modelled``).

Notation (per env step = per transition; n envs per actor step; times in microseconds):
  k = train_every (env steps per update), B = batch_size, b = B / N (each learner's share),
  P = publish_every, C = transitions per actor INSERT, cores = the host's usable cores.
  inf(c), env, learn(c, b), load(c): actor inference, env step, a learner update on b transitions,
  loading new weights into an actor; add1(m), addC(m): the memory's add of one step and of one
  INSERT; cycle(m): update_priorities(B) and sample(B) alternated, what the replay node does for
  each update (a memory may defer work from one call to the other); Δx = x(this mapping) -
  x(the calibrated mapping).

Samples per insert. The runtime fixes samples-per-insert to B/k (locally by training every k env
steps, distributed by its rate limiter, which holds actors that run ahead and a learner that runs
ahead), so in the steady state updates/s = env steps/s / k whichever side is the bottleneck: every
constraint below is written in env steps/s, X, and U = X / k.

Local (one process, everything in sequence; PEARL's iteration with nothing overlapped):
  step   = (inf(c) + env + add1(m)) / n + o_step
  update = learn(c, B) + cycle(m) + load(c) / P + o_update
  X = 1 / (step + update / k)
  o_step, o_update: the loop's own costs, from two calibration runs, one learner-heavy (k = 1) and
  one actor-heavy (k = K): 1/X_1 = s + u and 1/X_K = s + u / K give the in-situ cost per step s
  and per update u, less the micro figures. Why two: an update evicts the actor's working set
  from the caches, so a step costs more while the learner works than in the warm-up before it
  (measured here: 49 us against 44); a run with one k cannot tell that apart from the update's
  own cost. Another compute backend c differs by its micro figures (in one process nothing runs
  beside its threads: its local run measured within 1 % of cpu's here).

Distributed (actors, a replay node and N learners are separate processes; PEARL's iteration,
t = t_sample + max(t_update + t_insert, t_learn), in rate form, extended):
  X = min(A / a, k / l, 1 / v, CPU bound)
  The learner's period per update (every term measured; the calibration run of placement p over
  transport T0 splits its steady period into the learner's own time-split lines):
    l = (learn(c, b) rho + wait + weights + loop) x turns + group
    rho    = the calibration learner's compute per update / learn(cpu, B) measured alone: in a run
             the learner shares caches and, now and then, its core with the node and the actors.
    wait   = wait_cal + Δcrit: what the learner waits for its batch. wait_cal is what the
             calibration learner timed (its SAMPLE round trips or push waits, and its priority
             sends, per update); waking the node, which sleeps while the learner computes, is in it.
             crit, what lies on that path, server: the node handles the learner's priorities and,
             every P updates, its weights just before the SAMPLE that follows them on the same
             connection, so crit = sample_rtt_busy(T) + prio_send(T) + node_prio(T)
             + node_publish(T)/P + cycle(m), the round trip timed after a millisecond of the
             client's work (the node idle meanwhile, as in a run: waking it is the transport's own
             cost, ~80 us for a sleeping shm peer); in-network the node draws the next batch while the learner learns (the
             overlap that makes in-network pay), so the learner waits only for the push and for
             what the round takes beyond its own work: crit = push_ready(T) + prio_send(T)
             + max(0, push_round(T) + Δcycle(m) - own). With N learners the node serves their
             requests one after another: each waits for (N - 1) / 2 others' node work on average.
             A transport with a server run of its own (the profile's `T/server/wait`) sets the
             server Δcrit by that run's wait less the calibrated run's, in place of the micro round
             trips' difference (the publishing every P and the memory's cycle still added): alone,
             a tcp SAMPLE after a millisecond's work took 47 us against shm's 96, where in runs the
             learner waited 170-177 us per update over tcp against 105 over shm. In a run the
             learner's priorities reach the node just before its SAMPLE and an actor holds the
             other core, which the micro figure, asked of an idle node, leaves out; the run
             measures what that costs each transport.
    weights = weights_cal + Δ(publish_send(T) / P): the learner's weight sends (learner 0's).
    loop   = the calibration learner's own loop line.
    backend: a compute backend c other than cpu with its own calibration run (server, one actor)
             changes the learner's compute by its in-situ ratio to cpu's, and the wait, the loop
             and the actor's free step by their differences: its threads or device calls run beside
             the other roles there, which its micro figures do not show (measured here: the fpga
             backend's OpenCL threads on two cores, in-network 702 env steps/s against cpu's ~820,
             where its local run was within 1 % of cpu's). Without its run: its micro figures.
             A backend whose learner is cpu's torch learner (the profile's learner_device: the
             fpga backend's) has its learner's micro figures read from cpu's (`learner_figures`),
             and its in-situ compute ratio is 1: two measurements of one learner differ only by the
             host's noise.
    memory: a replay memory on a device (not the host's memory or a file) with its own calibration
             run (server, one actor) sets a server learner's wait by that run's less the cpu run's,
             in place of Δcycle(m), and its compute by their ratio: the device's threads run beside
             the node, the learner and the actor, which its micro figures, timed alone, do not show
             (fpga replay, measured here: the learner waited 266-342 us per update where the micro
             cycle said 125, and computed 1,103-1,184 us where the model said 835). In-network the
             node draws the batch while the learner learns: its micro cycle stays.
    group  = the collectives of policy data-parallel, per update: group_cal + ring(N) -
             ring(N_cal). ring(n) is gloo's all-reduce and agreement among n idle processes, measured
             for each learner count (the profile's micro figure): where processes outnumber cores a
             ring step waits for its peer to get a core, so the ring grows much faster than its N - 1
             steps (measured here on 2 cores: 0.8-1.1 ms among 2, 6.8-8.0 ms among 4). The
             calibration run (2 learners, learner-bound) measured the collectives in situ: the ring,
             and lock-step on top (whichever learner the actor, the node or the other learner delays
             on a busy core makes the others wait at the all-reduce). The lock-step part is kept as
             measured; the ring's part grows as measured. Measured twice here, learners 2 -> 4: in-situ
             collectives 2.55 -> 9.1 ms and 2.23 -> 8.93 ms; this rule gives 8.3-9.6 and 8.4-9.2 ms,
             the ring's N - 1 steps 7.65 and 6.68 ms, the micro figures' ratio 16-19 ms. Without the
             calibration run: ring(N). The run is the mapping's transport's where it has one
             (`T/server/data-parallel-2`; its wait is then as measured, no transport term added),
             else the calibrated transport's: lock-step costs each transport its own (two learners
             over tcp or uds waited 100-150 us per update more than over shm and spent 380-960 more
             in the collectives, where one learner over them waited 28-68 more). The run also
             gives the learners' compute, wait and loop in lock-step (compute = learn(c, b) x its
             compute / learn(cpu, B/2)): measured here, each of two learners took ~4.0 ms on its
             half of a 1,024 batch against 2.9 ms alone (two learners alone side by side: 2.25 ms
             each), and their collectives 2.3 ms against 1.0 ms between idle processes.
    turns  = t(N, others) / t(N_cal, others_cal), t(n, o) = max(1, (n + o) / cores): learners need a
             core each, and when they and the cores the other roles keep runnable (o: the node's and
             the actors' work, and their polling) outnumber the cores, the scheduler gives each learner
             a share of one, and what it does on a core while the others run (computing, its loop, the
             node's reply) waits its turn. Over what the calibration run took (N_cal = 1, or 2 for
             data-parallel, o_cal its node's and actors' measured CPU). The collectives are not
             stretched: in them every learner is blocked on the ring's messages, not competing for a
             core, and their growth with N is ring(N), measured. Measured here, 4 data-parallel
             learners on 2 cores: compute 2.7 ms per update against 1.25 ms at 2. A poll-mode
             transport's pollers are runnable while they poll (they yield, then nap, so they take a
             core only while no one else wants it, and the CPU bound leaves them out): at 4 dpdk actors
             in-network the learner's compute rose from 1.26 to 1.88 ms per update.
  The actor's period per env step, running free:
    a = a_cal + Δinf(c) / n + Δinsert_send(T) / C + f (fetch_rtt(T) + load(c)) / C
    a_cal: the calibration actor's rate alone, in its warm-up (its loop, copies, the INSERT it
    keeps in flight while it steps: one INSERT is pipelined, so only its sending costs the
    actor); f = min(1, A C / (k P)) the share of INSERTs after which an actor finds new weights
    to FETCH (a round trip it waits for).
  The replay node's work per env step (its own process, one event loop):
    v = (node_insert(T) + ΔaddC(m)) / C + f node_fetch(T) / C
        + N (node_batch(T) + node_prio(T) + Δcycle(m)) / k + node_publish(T) / (k P)
  The CPU bound: the roles share the host's cores; while they run free each is on a CPU for its
  work: a per env step for the actor that made it, N (l - wait - group) / k for the learners
  (waiting for the node or for the other learners is off the CPU), v for the node, which also polls
  while idle (node_idle cores, calibrated). D = a + N (l - wait - group) / k + v:
    X_cpu = y (cores - node_idle) / D,   y (1 + kappa(A + N) y) = 1
  Polling, for the learners' turns: a poll-mode transport (dpdk) spins after each message, yields,
  then naps, where a blocking one sleeps in the kernel. The node polls p(T) cores in the learner's
  rhythm and each waiting actor w(T) (the calibration run's node idling, moved by the profile's
  measurements of this transport against the calibrated one: for 0.2 s a client asks the node after
  each millisecond of work, as a learner does, and the node's CPU beyond its handling is its
  polling; then a client waits 0.2 s for a push that does not come, as a held actor waits; measured
  here, a dpdk node ~0.8 cores when it has a core to itself, a dpdk client ~0.2, shm's ~0.05 and
  ~0.03). An actor waits when it is not stepping: A - a X of them at rate X.
  kappa(p): when p processes are runnable on fewer cores, the scheduler time-slices them and each
  slice starts with cold caches, so work costs more CPU than with a core each: 1 + kappa u at a
  share u of the cores' time in use (the busier the cores, the more often more processes are
  runnable than there are cores; at the CPU bound u = y, so y (1 + kappa y) = 1), the more the more
  processes share a core. The saturated calibration run (cores actors, actor-heavy, every core
  busy) measures it: y = X_measured / X_cpu(kappa = 0), kappa = (1 - y) / y^2, for every p above
  the cores (0 while p <= cores); runs at two counts are interpolated linearly in p (the profile
  makes one: two cost more than the profile's two minutes allow, and measured here 4 actors only
  ~10 % below the one-count kappa's prediction). That is the knee EMC2'20 measures: the actor count where
  the actors' supply A / a stops being the bound (a learner, the node or the CPU binds instead).
  The bottleneck named is the bound that binds, with its largest term.

Bytes, at image scale. An Atari job's messages are large (its INSERT of 128 steps carries each frame
once, 0.87 MB; a BATCH of 32 carries each row's k + 1 frames, 1.13 MB; PARAMS, the Nature CNN's
weights, 6.7 MB every P updates), so how fast a transport moves bytes matters beside its round
trips. Every message's handling is in the terms above at its own size (the replay node is timed
with the job's own transitions); two terms read the transport's one-way stream rate, measured by
the profile at each of the job's message sizes (`stream_us`):
  link   a bound of its own on the replay node's link, each direction the time the transport takes
         to stream what crosses it per env step: into the node INSERT / C + N prio / k + PARAMS / (k P),
         out of it N BATCH(m) / k + f PARAMS / C. X_link = 1 / that. It binds where bytes set the pace
         (a fast learner's batches), which the round trips, timed one message at a time, do not show.
  batch  a memory that stores an image's stacks whole sends a larger BATCH than the memory the node
         was timed with (obs and next_obs, 1.8 MB, against k + 1 frames a row): the difference, at
         the transport's rate, is added to its cycle(m) (on the node, and on a server learner's path).
A vector job's messages are a few KB and neither term moves its predictions.

Not modelled: other processes' use of the cores (the profile and every validation run record it:
`machine_state`; `rlbench plan` refuses a contended profile unless told otherwise); the learner slowing a little as busier actors share its core (up to ~10 % at 2 actors, k = 4).

Tabular offline (SwiftRL): fit_offline on backend c (with its options, e.g. DPUs) over a dataset
of D transitions for E epochs: seconds = fixed(c) + per_update(c) * D * E, both fitted from the
profile's two dataset sizes; updates/s = D E / seconds; env steps/s is not defined. A backend
whose device is emulated here (upmem) is predicted twice, never mixed: what runs here (the
emulator's wall time, measurable, so validated) and the hardware's time from the plugin's own
cost model (`modelled`, fitted the same way, never validated here).

Energy. Where RAPL was readable when profiling, power = idle + per busy core x busy cores, from
those measured watts (energy is still a prediction). Without a meter, a rated figure per busy core
(DEFAULT_WATTS_PER_CORE, or `--watts cpu=W`) is used and every figure it gives is labelled
``modelled``. samples/J = samples/s / watts.

Spread. Each prediction carries a relative spread: the spreads the profile recorded for the
figures of its binding bound, weighted by each term's share of it (root sum of squares).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace
from typing import Any

DEFAULT_WATTS_PER_CORE = 10.0  # rated package power per busy core, an assumption (no meter here)
KNEE_GAIN = 0.05  # an actor that adds less than this share of throughput is past the knee (measured sweeps)


@dataclass(frozen=True)
class Mapping:
    """One way to run a job: components, placement, policy, actors, host (and dataset, offline)."""

    algo: str
    env: str
    compute: str
    placement: str = "local"
    replay: str | None = None
    transport: str | None = None
    actors: int = 1
    num_envs: int = 1
    host: str = ""
    dataset: int | None = None
    options: tuple[tuple[str, str, Any], ...] = ()  # (kind, param, value) of plugins' run options
    hyperparameters: tuple[tuple[str, Any], ...] = ()
    policy: str = "single-learner"
    learners: int = 1

    @property
    def family(self) -> tuple[Any, ...]:
        """Everything but the actor count (the knee is found within a family)."""
        return (self.host, self.placement, self.transport, self.replay, self.compute, self.options, self.dataset,
                self.policy, self.learners)

    def option_text(self) -> str:
        return ",".join(f"{param}={value}" for _, param, value in self.options)

    def label(self) -> str:
        parts = [self.placement]
        if self.transport:
            parts.append(self.transport)
        if self.replay:
            parts.append(self.replay)
        parts.append(self.compute + (f"[{self.option_text()}]" if self.options else ""))
        if self.learners > 1:
            parts.append(f"{self.policy} x{self.learners}")
        if self.dataset is not None:
            parts.append(f"dataset {self.dataset:,}")
        elif self.placement != "local":
            parts.append(f"{self.actors} actor{'s' if self.actors > 1 else ''}")
        return " ".join(parts)

    def config(self, **budget: Any) -> Any:
        """The RunConfig that runs this mapping (`budget`: steps, seconds, eval_episodes, ...)."""
        from rlbench.config import RunConfig

        options: dict[str, dict[str, Any]] = {}
        for kind, param, value in self.options:
            options.setdefault(kind, {})[param] = value
        hyperparameters = {k: list(v) if isinstance(v, tuple) else v for k, v in self.hyperparameters}
        return RunConfig(algo=self.algo, env=self.env, replay=self.replay, compute=self.compute,
                         transport=self.transport or "shm", placement=self.placement, actors=self.actors,
                         num_envs=self.num_envs, dataset=self.dataset, hyperparameters=hyperparameters,
                         options=options, policy=self.policy, learners=self.learners, **budget)


@dataclass(frozen=True)
class Term:
    """One term of a bound: microseconds per env step (or per update, inside the learner's period)
    and the relative spread of the measurement it comes from."""

    name: str
    us: float
    spread: float = 0.0


@dataclass
class Prediction:
    env_steps_per_s: float | None  # None for offline learning (no env steps)
    updates_per_s: float
    samples_per_s: float
    bottleneck: str
    bounds: dict[str, float] = field(default_factory=dict)  # constraint -> the rate it allows
    busy_cores: float = 1.0
    watts: float | None = None
    energy_kind: str | None = None  # "from measured power (rapl)" or "modelled"; None: not predicted
    samples_per_joule: float | None = None
    modelled: dict[str, Any] | None = None  # a hardware prediction kept apart (kind "modelled")
    seconds: float | None = None  # offline: the predicted fit_offline time
    spread: float = 0.0  # relative spread of the prediction (from the profile's spreads)
    terms: list[Term] = field(default_factory=list)  # the binding bound's terms, per env step
    learner_terms: list[Term] = field(default_factory=list)  # distributed: the learner's, whichever bound binds
    actor_supply: float | None = None  # env steps/s one actor supplies running free
    demand: float | None = None  # env steps/s the rest of the mapping takes at most (its tightest other bound)

    @property
    def throughput(self) -> float:
        return self.env_steps_per_s if self.env_steps_per_s is not None else self.updates_per_s


class ModelError(Exception):
    """The profile lacks a figure this mapping needs (the planner then leaves the mapping out)."""


# ----------------------------------------------------------------------------------- schedule
@dataclass(frozen=True)
class Schedule:
    """The job's hyperparameters that set how often things happen (from the plan's job, not the profile)."""

    batch_size: int
    train_every: int = 1
    publish_every: int = 1
    learning_starts: int = 0
    epochs: int = 1


def schedule_of(hp: Any) -> Schedule:
    return Schedule(batch_size=getattr(hp, "batch_size", 1), train_every=getattr(hp, "train_every", 1),
                    publish_every=getattr(hp, "publish_every", 1), learning_starts=getattr(hp, "learning_starts", 0),
                    epochs=getattr(hp, "epochs", 1))


# -------------------------------------------------------------------------------------- power
@dataclass(frozen=True)
class Power:
    idle_w: float
    per_core_w: float
    kind: str  # "from measured power (rapl)" | "modelled"

    @classmethod
    def of(cls, host: dict[str, Any], watts: dict[str, float] | None = None) -> Power:
        measured = host.get("power") or {}
        if measured.get("kind") == "measured" and not (watts and "cpu" in watts):
            return cls(measured["idle_w"], measured["per_busy_core_w"], "from measured power (rapl)")
        return cls(0.0, (watts or {}).get("cpu", DEFAULT_WATTS_PER_CORE), "modelled")

    def apply(self, prediction: Prediction) -> Prediction:
        prediction.watts = self.idle_w + self.per_core_w * prediction.busy_cores
        prediction.energy_kind = self.kind
        prediction.samples_per_joule = prediction.samples_per_s / prediction.watts if prediction.watts > 0 else None
        return prediction


# ------------------------------------------------------------------------------ figure access
def _figure(table: dict[str, Any], name: str | None, what: str) -> dict[str, Any]:
    entry = table.get(name or "")
    if not entry:
        raise ModelError(f"{what} {name!r} is not in the profile")
    if not entry.get("available"):
        raise ModelError(f"{what} {name!r}: {entry.get('reason') or 'unavailable when profiled'}")
    return entry


def _spread(entry: dict[str, Any], name: str) -> float:
    value = (entry.get("spread") or {}).get(name, 0.0)
    return value if isinstance(value, (int, float)) and math.isfinite(value) else 0.0


def _cores(host: dict[str, Any]) -> float:
    fingerprint = host.get("fingerprint") or {}
    return float(fingerprint.get("cores_usable") or fingerprint.get("cores") or 1)


def learn_us(compute: dict[str, Any], batch: int, full_batch: int) -> float:
    """A learner update on `batch` transitions: measured at that batch size (a data-parallel share)."""
    if batch == full_batch:
        return compute["learner_update_us"]
    measured = (compute.get("learner_update_by_batch") or {}).get(str(batch))
    if measured is None:
        raise ModelError(f"no learner update on {batch} transitions in the profile (run `rlbench profile` again)")
    return measured


def cycle_us(memory: dict[str, Any]) -> float:
    """What one update costs the memory in the replay node: priorities then a batch, alternated."""
    if "cycle_us" in memory:
        return memory["cycle_us"]
    return memory["sample_us"] + (memory["update_us"] if memory["prioritized"] else 0.0)


@dataclass(frozen=True)
class _Parts:
    """A job's micro figures for one replay memory and one compute backend."""

    inference: float
    env: float
    learn: float
    learn_share: float  # CPU cores busy while the learner updates (torch threads)
    load: float  # new weights into an actor
    add_step: float
    add_insert: float
    cycle: float
    prioritized: bool
    spreads: dict[str, float]


def learner_figures(job: dict[str, Any], compute: str) -> dict[str, Any]:
    """The figures a backend's learner is read from: cpu's where the profile found its learner to be
    the same torch learner (same device and threads: the fpga backend has no OpenCL training
    kernels), its own otherwise. Two measurements of one learner differ only by the host's noise,
    which would rank the backends by it: one profile read the fpga backend's update on 64
    transitions at 1,671 us against cpu's 968."""
    own = _figure(job["compute"], compute, "compute backend")
    cpu = job["compute"].get("cpu") or {}
    same = compute != "cpu" and own.get("learner_device") and own.get("learner_device") == cpu.get("learner_device")
    return cpu if same and cpu.get("available") else own


def _parts(job: dict[str, Any], replay: str | None, compute: str, batch: int | None = None) -> _Parts:
    c = _figure(job["compute"], compute, "compute backend")
    learner = learner_figures(job, compute)
    m = _figure(job["replay"], replay, "replay memory")
    full = job["hyperparameters"]["batch_size"]
    learn = learn_us(learner, batch or full, full)
    spreads = {"inference": _spread(c, "inference_us"), "learn": _spread(learner, "learner_update_us"),
               "env": _spread(job, "env_step_us"), "cycle": _spread(m, "cycle_us")}
    return _Parts(c["inference_us"], job["env_step_us"], learn, learner.get("learner_cpu_share", 1.0), c["publish_us"],
                  m["add_step_us"], m["add_insert_us"], cycle_us(m), m["prioritized"], spreads)


def _calibration(job: dict[str, Any], key: str, *figures: str) -> dict[str, Any] | None:
    """A calibration setting's combined figures, or None when it was not run, failed or lacks one of
    `figures` (its rate unless named)."""
    run = (job.get("calibration") or {}).get(key)
    if not run or "failed" in run or any(name not in run for name in figures or ("env_steps_per_s",)):
        return None
    return run


def _calibrated_publish_every(job: dict[str, Any]) -> int:
    return job["hyperparameters"]["publish_every"]


# ------------------------------------------------------------------------------------- local
@dataclass(frozen=True)
class LocalCosts:
    """The local loop's in-situ costs per env step and per update, and where they come from."""

    step: float
    update: float
    step_spread: float
    update_spread: float


def local_costs(job: dict[str, Any]) -> LocalCosts:
    """s and u of the local loop with the calibrated components (cpu, prioritized): from the
    learner-heavy and actor-heavy calibration runs (two equations, 1/X_i = s + u / k_i: the
    learner-heavy run trains every k_1 env steps, 1 but for a job whose update outweighs an actor's
    step many times, rlbench.plan.profile.calibration_train_every); without the actor-heavy one, the
    learner-heavy run's warm-up stands in for s."""
    heavy = _calibration(job, "local")
    if heavy is None:
        raise ModelError("the profile has no local calibration run of this job (run `rlbench profile` again)")
    light = _calibration(job, "local/actor-heavy")
    period_1, k_1 = 1e6 / heavy["env_steps_per_s"], heavy.get("train_every", 1)
    spread_1 = _spread(heavy, "env_steps_per_s")
    if light is not None and light["train_every"] > k_1:
        period_k, k = 1e6 / light["env_steps_per_s"], light["train_every"]
        update = (period_1 - period_k) / (1 / k_1 - 1 / k)
        step = period_1 - update / k_1
        if step > 0 and update > 0:
            spread_k = _spread(light, "env_steps_per_s")
            return LocalCosts(step, update, spread_k, (period_1 * spread_1 + period_k * spread_k) / update)
    if "free_step_us" not in heavy:
        raise ModelError("the local calibration run did not time the loop's steps (run `rlbench profile` again)")
    step = heavy["free_step_us"]
    return LocalCosts(step, max(period_1 - step, 0.0) * k_1, _spread(heavy, "free_step_us"), spread_1)


def _micro_step(parts: _Parts, n: int) -> float:
    return (parts.inference + parts.env + parts.add_step) / n


def _micro_update(parts: _Parts, publish_every: int) -> float:
    return parts.learn + parts.cycle + parts.load / publish_every


def predict_local(mapping: Mapping, job: dict[str, Any], schedule: Schedule) -> Prediction:
    p = _parts(job, mapping.replay, mapping.compute)
    ref = _parts(job, "prioritized", "cpu")
    costs = local_costs(job)
    n, k, every = job["num_envs"], schedule.train_every, schedule.publish_every
    o_step = costs.step - _micro_step(ref, n)
    o_update = costs.update - _micro_update(ref, _calibrated_publish_every(job))
    step_terms = [Term("actor inference", p.inference / n, p.spreads["inference"]), Term("env step", p.env / n, p.spreads["env"]),
                  Term("replay add", p.add_step / n), Term("actor loop", o_step, costs.step_spread)]
    update_terms = [Term("learner update", p.learn / k, costs.update_spread),
                    Term("replay sample+priorities", p.cycle / k, p.spreads["cycle"]),
                    Term("weights publish", p.load / every / k), Term("learner loop", o_update / k, costs.update_spread)]
    # a calibration can say the loop costs less than its parts measured alone; never below half of them
    step = max(0.5 * _micro_step(p, n), sum(t.us for t in step_terms))
    update = max(0.5 * _micro_update(p, every), k * sum(t.us for t in update_terms))
    per_step = step + update / k
    x = 1e6 / per_step
    terms = step_terms + update_terms
    busy = 1.0 + max(0.0, p.learn_share - 1.0) * (p.learn / k) / per_step  # torch's extra threads
    return Prediction(env_steps_per_s=x, updates_per_s=x / k, samples_per_s=x / k * schedule.batch_size,
                      bottleneck=f"one process: {_largest(terms)}", bounds={"one process": x}, busy_cores=busy,
                      spread=_combined_spread(terms), terms=terms)


# ------------------------------------------------------------------------------- distributed
def _node(job: dict[str, Any], transport: str, placement: str) -> dict[str, Any]:
    entry = (job.get("replay_node") or {}).get(f"{transport}/{placement}")
    if not entry:
        raise ModelError(f"no replay-node figures for {transport} ({placement}) in the profile")
    if "failed" in entry:
        raise ModelError(f"the replay node over {transport} ({placement}) failed when profiled: {entry['failed']}")
    return entry


def _batch_cost(job: dict[str, Any], transport: str, node: dict[str, Any]) -> float:
    """The node's cost of building and sending one batch (measured as push.BATCH, in-network)."""
    cost = node["node"].get("batch_us")
    if cost is None:
        pushed = (job.get("replay_node") or {}).get(f"{transport}/in-network") or {}
        cost = (pushed.get("node") or {}).get("batch_us")
    return cost if cost is not None else node.get("sample_rtt_us", 0.0) / 2


def _insert_send(node: dict[str, Any]) -> float:
    """What an INSERT costs the actor that sends it: it keeps one in flight while it steps, so the
    round trip less the node's handling (the wire, the codec, the reply's receive)."""
    return max(0.0, node["insert_rtt_us"] - node["node"].get("insert_us", 0.0))


@dataclass(frozen=True)
class DistributedCalibration:
    """What a placement's calibration runs measured, as the model uses it."""

    transport: str
    period: float  # the learner's period per update (1 / steady updates/s)
    compute: float  # its compute line per update
    wait: float  # its wait for each batch and its priority send, per update
    weights: float
    loop: float
    free_step: float  # the actor's step running alone (warm-up)
    node_idle: float  # cores the node uses polling while idle
    others: float  # cores the run's other roles (its actor and node) kept busy: their work and polling
    spreads: dict[str, float]
    kappa_points: tuple[tuple[int, float], ...]  # (processes, kappa) measured by the saturated runs

    def kappa(self, processes: int, cores: float) -> float:
        """Extra CPU per unit of work with `processes` runnable on `cores` (module docstring)."""
        if processes <= cores or not self.kappa_points:
            return 0.0
        if len(self.kappa_points) == 1:
            return self.kappa_points[0][1]
        (p1, k1), (p2, k2) = self.kappa_points[0], self.kappa_points[-1]
        return max(0.0, k1 + (k2 - k1) * (processes - p1) / (p2 - p1))


def distributed_calibration(job: dict[str, Any], placement: str, cores: float) -> DistributedCalibration:
    """The placement's learner-bound calibration run (one learner, one actor) as the model uses it."""
    runs = [(key, run) for key, run in (job.get("calibration") or {}).items()
            if key.count("/") == 1 and run.get("placement") == placement and not key.startswith("local")]
    run = next((r for _, r in runs if "failed" not in r and "learner_compute_us" in r and "env_steps_per_s" in r), None)
    if run is None:
        raise ModelError(f"the profile has no {placement} calibration run of this job (run `rlbench profile` again)")
    k = run.get("train_every", 1)
    period = 1e6 * k / run["env_steps_per_s"]
    free = run.get("free_step_us")
    if free is None:
        raise ModelError(f"the {placement} calibration run did not time its actor alone (run `rlbench profile` again)")
    node_idle = max(0.0, run.get("node_cores", 0.0) - run.get("node_cpu_us", 0.0) * run["env_steps_per_s"] / 1e6) \
        if "node_cores" in run else 0.0
    weights, loop = run.get("learner_weights_us", 0.0), run.get("learner_loop_us", 0.0)
    # the wait as the learner timed it; where it did not, what its period leaves
    wait = run.get("learner_wait_us", max(0.0, period - run["learner_compute_us"] - weights - loop))
    spreads = {"period": _spread(run, "env_steps_per_s"), "compute": _spread(run, "learner_compute_us"),
               "wait": _spread(run, "learner_wait_us"), "free_step": _spread(run, "free_step_us")}
    calibrated = DistributedCalibration(run["transport"], period, run["learner_compute_us"], wait, weights, loop,
                                        free, node_idle, _others_busy(run), spreads, ())
    return replace(calibrated, kappa_points=_kappa_points(job, calibrated, cores))


def _others_busy(run: dict[str, Any]) -> float:
    """Cores a calibration run's roles other than its learners kept busy: the node (its work and its
    polling, as its process's CPU over its window) and the actors (their CPU per env step)."""
    rate = run.get("env_steps_per_s", 0.0)
    node = run.get("node_cores", run.get("node_cpu_us", 0.0) * rate / 1e6)
    return node + run.get("actors_cpu_us", 0.0) * rate / 1e6


@dataclass(frozen=True)
class GroupCalibration:
    """What the data-parallel calibration run (two learners, learner-bound) measured per update."""

    learners: int
    transport: str  # the run's: its wait and lock-step are this transport's
    compute: float  # each learner's compute on its share
    group: float  # its all-reduce and agreement, waiting for the other learner included
    wait: float
    loop: float
    others: float  # cores its actor and node kept busy
    spreads: dict[str, float]


def group_calibration(job: dict[str, Any], transport: str, calibrated: str) -> GroupCalibration | None:
    """The data-parallel calibration run over `transport` where it measured, else over the
    `calibrated` transport; None where neither did."""
    for over in (transport, calibrated):
        run = _calibration(job, f"{over}/server/data-parallel-2", "learner_compute_us", "learner_allreduce_us")
        if run is not None:
            return GroupCalibration(run.get("learners", 2), over, run["learner_compute_us"], run["learner_allreduce_us"],
                                    run.get("learner_wait_us", 0.0), run.get("learner_loop_us", 0.0), _others_busy(run),
                                    {"compute": _spread(run, "learner_compute_us"),
                                     "group": _spread(run, "learner_allreduce_us")})
    return None


def _polling(job: dict[str, Any], transport: str, placement: str, calibrated: DistributedCalibration) -> tuple[float, float]:
    """(cores the node polls, cores a waiting client polls) over `transport`: the calibration run's
    node polling, moved by the profile's polling measurements of this transport against the
    calibrated one (a poll-mode transport spins after each message, then naps, where a blocking one
    sleeps in the kernel)."""
    nodes = job.get("replay_node") or {}

    def polled(name: str) -> float:
        return (nodes.get(f"{name}/{placement}") or {}).get("node_poll_cores", 0.0)

    def waiting(name: str) -> float:
        return (nodes.get(f"{name}/in-network") or {}).get("client_wait_cores", 0.0)

    node_poll = max(0.0, calibrated.node_idle + polled(transport) - polled(calibrated.transport))
    return node_poll, waiting(transport) - waiting(calibrated.transport)


def _turns(learners: int, others: float, cores: float) -> float:
    """How much longer each of `learners` runnable learners takes for anything that needs a core, when
    they and the other roles' busy cores outnumber the cores: the scheduler gives each learner
    cores / (learners + others) of a core (at least a whole one)."""
    return max(1.0, (learners + others) / cores)


def _kappa_points(job: dict[str, Any], calibrated: DistributedCalibration,
                  cores: float) -> tuple[tuple[int, float], ...]:
    """(processes, kappa) of each saturated calibration run: the kappa under which the CPU bound is
    what it measured."""
    points = []
    for key, run in (job.get("calibration") or {}).items():
        if "/saturated" not in key or "failed" in run or "env_steps_per_s" not in run:
            continue
        mapping = Mapping(job["algo"], job["env"], "cpu", placement="server", replay="prioritized",
                          transport=run["transport"], actors=run["actors"])
        schedule = Schedule(job["hyperparameters"]["batch_size"], run["train_every"], _calibrated_publish_every(job))
        try:
            cpu_bound = _distributed_bounds(mapping, job, schedule, cores, replace(calibrated, kappa_points=()))["cpu"]
        except ModelError:
            continue
        points.append((run["actors"] + 1, kappa_of(run["env_steps_per_s"] / cpu_bound)))
    return tuple(sorted(points))


@dataclass(frozen=True)
class BackendDeltas:
    """What a compute backend changes in a distributed run against cpu, from its own calibration run
    (server, learner-bound, one actor): its threads or device calls run beside the other roles
    there, which neither its micro figures nor a local run (where nothing runs beside it) show."""

    calibrated: bool = False
    compute_ratio: float = 1.0  # the learner's compute, against cpu's in the same placement
    wait: float = 0.0
    loop: float = 0.0
    free_step: float = 0.0  # the actor's step running alone


def _against_cpu_server_run(job: dict[str, Any], suffix: str,
                            figures: tuple[str, ...]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(a component's own calibration run, the key ending in `suffix`; the cpu server run over the
    same transport), both measured and with every one of `figures`; None where either is not."""
    key = next((key for key in job.get("calibration") or {} if key.endswith(suffix)), None)
    if key is None:
        return None
    own, cpu = _calibration(job, key, *figures), _calibration(job, key.split("/")[0] + "/server", *figures)
    return None if own is None or cpu is None else (own, cpu)


def backend_deltas(job: dict[str, Any], compute: str) -> BackendDeltas:
    if compute == "cpu":
        return BackendDeltas()
    pair = _against_cpu_server_run(job, f"/server/{compute}", ("learner_compute_us", "free_step_us"))
    if pair is None:
        return BackendDeltas()
    own, cpu = pair
    # cpu's own torch learner: its two runs' compute differ by the host's drift between them (one
    # profile read 0.91 of cpu's, with cpu's runs 17 % apart, and ranked 40 fpga mappings first)
    same_learner = learner_figures(job, compute) is job["compute"].get("cpu")
    return BackendDeltas(True, 1.0 if same_learner else own["learner_compute_us"] / cpu["learner_compute_us"],
                         own.get("learner_wait_us", 0.0) - cpu.get("learner_wait_us", 0.0),
                         own.get("learner_loop_us", 0.0) - cpu.get("learner_loop_us", 0.0),
                         own["free_step_us"] - cpu["free_step_us"])


@dataclass(frozen=True)
class ReplayDeltas:
    """What a replay memory on a device changes in a server run against the cpu server run over the
    same transport, from its own calibration run (server, learner-bound, one actor): its device's
    threads run beside the node, the learner and the actor there, and its micro figures, timed alone,
    leave that out (fpga replay: the learner waited 266-342 us per update and computed 1,103-1,184 us
    in a run where the model, from the micro cycle, said 125 and 835)."""

    wait: float  # the learner's wait for its batch, less the cpu run's (in place of the micro cycle's difference)
    compute_ratio: float  # the learner's compute over the cpu run's: the device's threads share its core


def replay_deltas(job: dict[str, Any], replay: str) -> ReplayDeltas | None:
    """The memory's `ReplayDeltas`; None where it has no run of its own (its micro cycle then stands)."""
    pair = _against_cpu_server_run(job, f"/server/replay-{replay}", ("learner_wait_us", "learner_compute_us"))
    if pair is None:
        return None
    own, cpu = pair
    return ReplayDeltas(own["learner_wait_us"] - cpu["learner_wait_us"],
                        own["learner_compute_us"] / cpu["learner_compute_us"])


def transport_wait(job: dict[str, Any], transport: str, calibrated: DistributedCalibration) -> float | None:
    """The learner's wait per update at a server over `transport` in its own run (`T/server/wait`, or
    a full `T/server` calibration), less the calibrated run's; None where it has none (or is the
    calibrated transport): the micro round trips' difference then stands."""
    if transport == calibrated.transport:
        return None
    run = _calibration(job, f"{transport}/server/wait", "learner_wait_us") \
        or _calibration(job, f"{transport}/server", "learner_wait_us")
    return None if run is None else run["learner_wait_us"] - calibrated.wait


def _critical(node: dict[str, Any], placement: str, memory_cycle: float, own: float, publish_every: int) -> float:
    """What lies on the learner's path to its next batch, beyond its own work (module docstring: crit)."""
    if placement == "server":
        rtt = node.get("sample_rtt_busy_us", node["sample_rtt_us"])  # asked after work, as a learner asks
        return (rtt + node["priorities_send_us"] + node["node"].get("priorities_us", 0.0)
                + node["node"].get("publish_us", 0.0) / publish_every + memory_cycle)
    return node["push_ready_us"] + node["priorities_send_us"] + max(0.0, node["push_round_us"] + memory_cycle - own)


def _ring_us(job: dict[str, Any], learners: int) -> float:
    """The collectives per update among `learners` idle processes: the profile's micro figure."""
    reduce = job.get("allreduce") or {}
    measured = (reduce.get("by_learners") or {}).get(str(learners)) or {}
    if not measured.get("available"):
        why = measured.get("reason") or reduce.get("reason") or f"not measured among {learners}; profile again"
        raise ModelError(f"no all-reduce among {learners} learners for policy data-parallel: {why}")
    return measured["allreduce_us"] + measured.get("agreement_us", 0.0)


def core_each_ceiling(job: dict[str, Any], compute: str, batch: int, learners: int) -> tuple[float, float, float] | None:
    """Data-parallel's most with a core for each learner, whatever this host has: (the speed-up over
    one learner, an update on the whole batch us, a learner's update on its share plus the collectives
    among `learners` us) = learn(B) / (learn(B / N) + ring(N)), from the profile's micro figures
    (modelled). None where the profile lacks one. An update's cost that does not shrink with the batch
    (the optimizer step, the loop) and the collectives bound it: near N only for a model whose update
    is mostly per-sample compute."""
    try:
        figures = learner_figures(job, compute)
        whole = learn_us(figures, batch, batch)
        share = learn_us(figures, batch // learners, batch) + _ring_us(job, learners)
    except (ModelError, KeyError):
        return None
    return whole / share, whole, share


def _group_us(job: dict[str, Any], learners: int, grouped: GroupCalibration | None) -> float:
    """A learner's collectives per update: as the data-parallel calibration run measured them, plus
    how much longer the ring itself takes among `learners` idle processes than among the run's
    (both measured; module docstring: group)."""
    if learners <= 1:
        return 0.0
    ring = _ring_us(job, learners)
    if grouped is None:
        return ring
    return grouped.group + max(0.0, ring - _ring_us(job, grouped.learners))


def stream_us(transports: dict[str, Any] | None, transport: str, size: float) -> float | None:
    """Microseconds `transport` takes to stream a message of `size` bytes one way: its one-way stream's
    bytes/s measured at the size nearest this one (the profile times each transport at the job's
    message sizes); None where no size within a factor of two was measured (a 64-byte stream's rate
    says nothing of a megabyte's)."""
    cases = [c for c in ((transports or {}).get(transport) or {}).get("cases") or [] if c.get("mb_per_s")]
    if not cases or size <= 0:
        return None
    nearest = min(cases, key=lambda c: abs(math.log(c["size"] / size)))
    if abs(math.log(nearest["size"] / size)) > math.log(2):
        return None
    return size / nearest["mb_per_s"]  # bytes / (1e6 bytes/s) = microseconds


def link_terms(mapping: Mapping, job: dict[str, Any], schedule: Schedule,
               transports: dict[str, Any] | None) -> dict[str, list[Term]]:
    """The bytes the replay node's link carries per env step, each direction as the time the transport
    takes to stream them (`stream_us`): into the node the actors' INSERTs (one per C transitions),
    the learners' priorities and the weights learner 0 publishes; out of it the batches (this memory's:
    an image's stacks as it stores them) and the weights actors fetch. Sizes the profile did not
    stream are left out (a profile made before it timed the job's sizes has no link bound)."""
    messages = job.get("messages") or {}
    chunk, k, every = job["insert_transitions"], schedule.train_every, schedule.publish_every
    learners, transport = mapping.learners, mapping.transport
    fetch_share = min(1.0, mapping.actors * chunk / (k * every))
    memory = (job.get("replay") or {}).get(mapping.replay or "") or {}
    batch = memory.get("batch_bytes", messages.get("batch", 0))

    def term(name: str, size: float, per_step: float) -> list[Term]:
        us = stream_us(transports, transport, size)
        return [] if us is None else [Term(name, us * per_step)]

    return {"into the node": [*term("INSERTs", messages.get("insert", 0), 1 / chunk),
                              *term("priorities", messages.get("priorities", 0), learners / k),
                              *term("weights published", messages.get("weights", 0), 1 / (k * every))],
            "out of the node": [*term("batches", batch, learners / k),
                                *term("weights fetched", messages.get("weights", 0), fetch_share / chunk)]}


def _batch_transfer_extra(job: dict[str, Any], replay: str | None, transport: str,
                          transports: dict[str, Any] | None) -> float:
    """Microseconds more per batch for a memory whose BATCH is larger than the one the replay node was
    timed with (the prioritized memory's): an image job's stacks stored whole (obs and next_obs, 1.8 MB
    for Atari) against each row's k + 1 frames (1.1 MB), streamed at the transport's measured rate."""
    memory = (job.get("replay") or {}).get(replay or "") or {}
    timed = ((job.get("replay") or {}).get("prioritized") or {}).get("batch_bytes")
    extra = memory.get("batch_bytes", 0) - (timed or 0)
    if not timed or extra <= 0:
        return 0.0
    whole, measured = stream_us(transports, transport, memory["batch_bytes"]), stream_us(transports, transport, timed)
    return max(0.0, whole - measured) if whole is not None and measured is not None else 0.0


def _distributed_bounds(mapping: Mapping, job: dict[str, Any], schedule: Schedule, cores: float,
                        calibrated: DistributedCalibration, transports: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every bound of a distributed mapping, in env steps/s, with the terms behind each (`transports`:
    the host's measured transports, for the link and the bytes of a memory's batches)."""
    n, chunk = job["num_envs"], job["insert_transitions"]
    k, every, actors, learners = schedule.train_every, schedule.publish_every, mapping.actors, mapping.learners
    full = job["hyperparameters"]["batch_size"]
    if full % learners:
        raise ModelError(f"batch {full} does not split into {learners} learners")
    p = _parts(job, mapping.replay, mapping.compute, batch=full // learners)
    ref = _parts(job, "prioritized", "cpu")
    node = _node(job, mapping.transport, mapping.placement)
    ref_node = _node(job, calibrated.transport, mapping.placement)
    # the memory's work per update against the calibrated one's, and the bytes more its batches carry
    d_cycle = p.cycle - ref.cycle + _batch_transfer_extra(job, mapping.replay, mapping.transport, transports)
    fetch_share = min(1.0, actors * chunk / (k * every))
    backend = backend_deltas(job, mapping.compute)
    # the learner's period per update
    rho = calibrated.compute / ref.learn if ref.learn > 0 else 1.0
    # its work on a core of its own: a calibrated backend's in-situ ratio to cpu's, else its micro figure
    share = p.learn if not backend.calibrated else \
        _parts(job, mapping.replay, "cpu", batch=full // learners).learn * backend.compute_ratio
    cpu_compute = share * rho
    compute, spreads = cpu_compute, dict(calibrated.spreads)
    wait_cal, loop_cal = calibrated.wait + backend.wait, calibrated.loop + backend.loop
    grouped = group_calibration(job, mapping.transport, calibrated.transport) if learners > 1 else None
    queue_cal = 0.0
    if grouped is not None:  # learners in lock-step, as the data-parallel calibration ran them
        share = learn_us(_figure(job["compute"], "cpu", "compute backend"), full // grouped.learners, full)
        compute = p.learn * grouped.compute / share
        wait_cal, loop_cal = grouped.wait, grouped.loop
        spreads.update(compute=grouped.spreads["compute"])
        group_node = _node(job, grouped.transport, "server")
        queue_cal = (grouped.learners - 1) / 2 * (_batch_cost(job, grouped.transport, group_node)
                                                    + group_node["node"].get("priorities_us", 0.0))
    # a replay memory on a device, at a server: its own run's in-situ figures (ReplayDeltas)
    memory = replay_deltas(job, mapping.replay) if mapping.placement == "server" else None
    if memory is not None:
        compute *= memory.compute_ratio
    weights = max(0.0, calibrated.weights + node["publish_send_us"] / every
                  - ref_node["publish_send_us"] / _calibrated_publish_every(job))
    loop = loop_cal
    group = _group_us(job, learners, grouped)
    own = compute + weights + loop + node["priorities_send_us"]
    ref_own = calibrated.compute + calibrated.weights + calibrated.loop + ref_node["priorities_send_us"]
    queue = (learners - 1) / 2 * (_batch_cost(job, mapping.transport, node) + node["node"].get("priorities_us", 0.0))
    # the memory's cost on the learner's path: its own run's where it has one, else its micro cycle
    cycle_on_path, every_cal = d_cycle if memory is None else 0.0, _calibrated_publish_every(job)
    # the transport's: measured in its own lock-step run where that is the one read, else its own server
    # run's wait where it has one, else its micro round trips'
    if grouped is not None and grouped.transport == mapping.transport:
        moved: float | None = 0.0
    else:
        moved = transport_wait(job, mapping.transport, calibrated) if mapping.placement == "server" else None
    if moved is None:
        crit = _critical(node, mapping.placement, cycle_on_path, own, every) \
            - _critical(ref_node, mapping.placement, 0.0, ref_own, every_cal)
    else:  # its run measured it at the calibrated P: what this mapping's P and memory move on the path
        crit = moved + _critical(node, mapping.placement, cycle_on_path, own, every) \
            - _critical(node, mapping.placement, 0.0, own, every_cal)
    wait = max(0.0, wait_cal + (memory.wait if memory else 0.0) + queue - queue_cal + crit)
    learner_terms = [Term("update", compute / k, spreads["compute"]),
                     Term("waiting for the replay node", wait / k, spreads["wait"]),
                     Term("weight sends", weights / k), Term("loop", loop / k),
                     Term("all-reduce", group / k, grouped.spreads["group"] if grouped else 0.0)]
    # the actor running free
    fetch = fetch_share * (node["fetch_rtt_us"] + p.load) / chunk
    actor_terms = [Term("actor alone", calibrated.free_step + backend.free_step, calibrated.spreads["free_step"]),
                   Term("inference", 0.0 if backend.calibrated else (p.inference - ref.inference) / n,
                        p.spreads["inference"]),
                   Term("INSERT sends", (_insert_send(node) - _insert_send(ref_node)) / chunk),
                   Term("weight fetches", fetch)]
    a = max(0.2 * calibrated.free_step, sum(t.us for t in actor_terms))
    # the replay node
    node_terms = [Term("INSERTs", (node["node"].get("insert_us", 0.0) + p.add_insert - ref.add_insert) / chunk),
                  Term("FETCHes", fetch_share * node["node"].get("fetch_us", 0.0) / chunk),
                  Term("batches and priorities", learners * (_batch_cost(job, mapping.transport, node)
                                                             + node["node"].get("priorities_us", 0.0) + d_cycle) / k),
                  Term("weights", node["node"].get("publish_us", 0.0) / (k * every))]
    v = max(1e-3, sum(t.us for t in node_terms))
    # polling: the node's in the learner's rhythm, and each actor's while it waits (for its INSERT's
    # reply, which the rate limiter holds while the learner is the bound): a poller is runnable, and the
    # learners take turns with it
    node_poll, client_wait = _polling(job, mapping.transport, mapping.placement, calibrated)

    def polling(x: float) -> float:  # cores the node and the waiting actors poll at x env steps/s
        return node_poll + client_wait * max(0.0, actors - a * x / 1e6)

    def others_at(x: float) -> float:  # cores the actors and the node keep runnable at x env steps/s
        return polling(x) + (a + v) * x / 1e6

    # learners take turns on the cores when they and the others' busy cores outnumber them: the period
    # stretches by the turns this mapping takes over those its calibration run took
    turns_cal = _turns(grouped.learners, grouped.others, cores) if grouped else _turns(1, calibrated.others, cores)
    unstretched = sum(t.us for t in learner_terms)
    running = min(1e6 / unstretched, 1e6 * actors / a, 1e6 / v)  # the rate before the cores are counted
    turns = _turns(learners, others_at(running), cores) / turns_cal
    if turns > 1.0 + 1e-9:
        learner_terms.append(Term("taking turns on the cores", (unstretched - group / k) * (turns - 1.0)))
    learner = sum(t.us for t in learner_terms) * k
    # the cores: each role is on a CPU for its work; waiting (for the node, for the other learners'
    # all-reduce) is off it
    learner_cpu = learners * (cpu_compute + weights + loop) / k + learners * max(0.0, p.learn_share - 1.0) * cpu_compute / k
    demand = a + learner_cpu + v
    # polling takes the cores only while no one else wants them (a poller yields, then naps): the
    # calibration run's node idling is what stays off the roles' work
    capacity = max(0.1, cores - calibrated.node_idle)
    kappa = calibrated.kappa(actors + learners, cores)
    used = saturation(kappa)  # the share of the cores' time the roles get at the CPU bound
    cpu_terms = [Term("actors", a / used, calibrated.spreads["free_step"]),
                 Term("learners", learner_cpu / used, calibrated.spreads["compute"]),
                 Term("replay node", v / used)]
    return {"actors": 1e6 * actors / a, "learner": 1e6 * k / learner, "node": 1e6 / v,
            "cpu": 1e6 * capacity / sum(t.us for t in cpu_terms),
            "terms": {"actors": actor_terms, "learner": learner_terms, "node": node_terms, "cpu": cpu_terms},
            "a": a, "v": v, "demand": demand, "kappa": kappa, "capacity": capacity,
            "polling": polling}


def saturation(kappa: float) -> float:
    """y in (0, 1]: how much of the cores' time the roles' own work gets at the CPU bound, where work
    costs 1 + kappa y (it costs more the busier the cores: y (1 + kappa y) = 1)."""
    return 1.0 if kappa <= 0 else (math.sqrt(1 + 4 * kappa) - 1) / (2 * kappa)


def kappa_of(saturation_measured: float) -> float:
    """The kappa under which the CPU bound is `saturation_measured` (measured / kappa-free) of its
    kappa-free value: the inverse of `saturation`."""
    y = saturation_measured
    return 0.0 if y >= 1 else (1 - y) / (y * y)


def predict_distributed(mapping: Mapping, job: dict[str, Any], host: dict[str, Any], schedule: Schedule) -> Prediction:
    cores = _cores(host)
    calibrated = distributed_calibration(job, mapping.placement, cores)
    transports = host.get("transports")
    bounds = _distributed_bounds(mapping, job, schedule, cores, calibrated, transports)
    actors, k = mapping.actors, schedule.train_every
    who = "learners" if mapping.learners > 1 else "learner"
    named = {f"actors ({actors})": bounds["actors"], who: bounds["learner"], "replay node": bounds["node"],
             f"CPU ({cores:g} cores)": bounds["cpu"]}
    keys = dict(zip(named, ("actors", "learner", "node", "cpu")))
    # the link: a bound of its own, not a term of the others (each message's handling, at its size, is in
    # the roles' terms already); it binds where bytes, not round trips, set the pace
    for direction, link in link_terms(mapping, job, schedule, transports).items():
        if link:
            name = f"{mapping.transport} link {direction}"
            named[name], keys[name] = 1e6 / sum(t.us for t in link), name
            bounds["terms"][name] = link
    name = min(named, key=named.get)
    x = named[name]
    terms = bounds["terms"][keys[name]]
    detail = name if keys[name] == "actors" else f"{name}: {_largest(terms)}"
    used = x * bounds["demand"] / 1e6 / bounds["capacity"]  # the share of the cores the roles' work takes
    busy = min(cores, x * bounds["demand"] * (1 + bounds["kappa"] * used) / 1e6 + bounds["polling"](x))
    others = min(v for key, v in named.items() if keys[key] != "actors")
    return Prediction(env_steps_per_s=x, updates_per_s=x / k, samples_per_s=x / k * schedule.batch_size,
                      bottleneck=detail, bounds=named, busy_cores=busy, spread=_combined_spread(terms), terms=terms,
                      learner_terms=bounds["terms"]["learner"], actor_supply=1e6 / bounds["a"], demand=others)


# ----------------------------------------------------------------------------------- shared
def predict(mapping: Mapping, job: dict[str, Any], host: dict[str, Any], schedule: Schedule,
            power: Power) -> Prediction:
    if job["kind"] == "tabular-offline":
        return power.apply(predict_tabular(mapping, job, schedule))
    if mapping.placement == "local":
        return power.apply(predict_local(mapping, job, schedule))
    return power.apply(predict_distributed(mapping, job, host, schedule))


def _largest(terms: list[Term]) -> str:
    positive = [t for t in terms if t.us > 0]
    total = sum(t.us for t in positive)
    if not positive or total <= 0:
        return terms[0].name if terms else ""
    top = max(positive, key=lambda t: t.us)
    return f"{top.name} {top.us / total:.0%}"


def _combined_spread(terms: list[Term]) -> float:
    total = sum(max(0.0, t.us) for t in terms)
    if total <= 0:
        return 0.0
    return math.sqrt(sum((max(0.0, t.us) * t.spread) ** 2 for t in terms)) / total


def predict_tabular(mapping: Mapping, job: dict[str, Any], schedule: Schedule) -> Prediction:
    setting = tabular_setting(job, mapping.compute, mapping.options)
    if not setting.get("available"):
        raise ModelError(f"compute {mapping.compute}: {setting.get('reason') or 'unavailable when profiled'}")
    updates = (mapping.dataset or 0) * schedule.epochs
    seconds = setting["fixed_s"] + setting["per_update_s"] * updates
    rate = updates / seconds if seconds > 0 else 0.0
    breakdown = setting.get("breakdown") or {}
    bottleneck = ("emulator: " + _largest([Term(k, v) for k, v in breakdown.items()])) if breakdown \
        else "TD updates on the " + setting["device"]
    if setting["fixed_s"] > setting["per_update_s"] * updates:
        bottleneck += " (fixed costs dominate at this size)"
    modelled = None
    if setting.get("modelled"):
        m = setting["modelled"]
        m_seconds = m["fixed_s"] + m["per_update_s"] * updates
        modelled = {"kind": "modelled", "what": m["what"], "seconds": m_seconds,
                    "updates_per_s": updates / m_seconds if m_seconds > 0 else None,
                    "bottleneck": _largest([Term(k, v) for k, v in m["breakdown"].items()]) if m.get("breakdown") else ""}
    return Prediction(env_steps_per_s=None, updates_per_s=rate, samples_per_s=rate, bottleneck=bottleneck,
                      bounds={"fit_offline": rate}, busy_cores=1.0, modelled=modelled, seconds=seconds,
                      spread=setting.get("spread", 0.0))


def tabular_setting(job: dict[str, Any], compute: str, options: tuple[tuple[str, str, Any], ...]) -> dict[str, Any]:
    wanted = {param: value for _, param, value in options}
    for setting in job.get("settings", []):
        if setting["compute"] == compute and setting["options"] == wanted:
            return setting
    raise ModelError(f"compute {compute} with {wanted or 'its defaults'} is not in the profile")


def limiter_lead(schedule: Schedule, actors: int) -> float:
    """The transitions a distributed run's rate limiter lets actors run ahead of the learner (the
    runtime's own figure, rlbench.runtime.distributed.roles.rate_limiter_for)."""
    from rlbench.runtime.distributed.roles import rate_limiter_for

    return rate_limiter_for(schedule, actors).insert_lead


def slack_steps(schedule: Schedule, actors: int) -> float:
    """Env steps a distributed run's actors make beyond the learner's pace before they are held: the
    rate limiter's slack, and each actor's INSERT the node holds with the next one filling as the
    actor steps (2 C each). An Atari run's 3 actors: 776 + 768, where its window is ~600 steps: a
    window that started after the limiter's slack alone measured the actors running free (173 env
    steps/s where its learners' compute allowed 12)."""
    from rlbench.runtime.distributed.roles import ACTOR_INSERT_TRANSITIONS

    return limiter_lead(schedule, actors) + 2 * actors * ACTOR_INSERT_TRANSITIONS


def warm_up_steps(mapping: Mapping, schedule: Schedule) -> float:
    """Env steps before a run of `mapping` is in its steady state: learning_starts (at least one
    batch), and distributed the actors' slack (`slack_steps`), which they fill at their own pace."""
    start = max(schedule.learning_starts, schedule.batch_size)
    return start if mapping.placement == "local" else start + slack_steps(schedule, mapping.actors)


def knee(rates: list[tuple[int, float]], gain: float = KNEE_GAIN) -> int | None:
    """The actor count beyond which one more actor adds less than `gain` of throughput (None: it
    still grows at the largest count given). For measured sweeps; a plan's knee is `supply_knee`."""
    for (count, rate), (_, following) in itertools.pairwise(sorted(rates)):
        if following < rate * (1 + gain):
            return count
    return None


def supply_knee(curve: list[tuple[int, Prediction]], gain: float = KNEE_GAIN) -> int | None:
    """The actor count past which more actors do not pay: the fewest whose measured supply (A x one
    actor's free rate) meets what the rest of the mapping takes (its tightest other bound at that
    count), or before which one more actor adds less than `gain` (more actors share the cores: the
    CPU bound falls as they are added). None: supply is still short and growing at the largest count."""
    ordered = sorted(curve, key=lambda item: item[0])
    for (actors, prediction), following in itertools.zip_longest(ordered, ordered[1:]):
        if prediction.actor_supply is None or prediction.demand is None:
            return None
        if actors * prediction.actor_supply >= prediction.demand:
            return actors
        if following is not None and following[1].throughput < prediction.throughput * (1 + gain):
            return actors
    return None


def with_actors(mapping: Mapping, actors: int) -> Mapping:
    return replace(mapping, actors=actors)
