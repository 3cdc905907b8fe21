"""The performance model: env steps/s and updates/s of a mapping, predicted from a profile.

A mapping is a job (algorithm, environment, hyperparameters) put on components: replay memory m,
compute backend c, placement p (local / server / in-network), transport T, A actor processes, one
host. Every figure comes from the host's profile (`rlbench.plan.profile`); nothing is a constant
of this module except the rated power used where no meter exists (labelled ``modelled``).

Notation (per env step = per transition; n envs per actor step; times in microseconds):
  k = train_every (env steps per learner update), B = batch_size, P = publish_every,
  C = transitions per actor INSERT message, cores = the host's usable cores (its fingerprint).
  inf(c), env, learn(c), pub(c): actor inference, env step, learner update, weight publication;
  add1(m), addC(m), sample(m), prio(m): the memory's add of one step / of one INSERT, sample(B),
  update_priorities(B) (0 for a uniform memory). Differences d(x) are taken against the
  calibration's components (prioritized replay, cpu).

Samples per insert. The runtime fixes samples-per-insert to B/k (locally by training every k env
steps, distributed by its rate limiter, which holds actors that run ahead and a learner that runs
ahead), so in the steady state updates/s = env steps/s / k whichever side is the bottleneck: every
constraint below is written in env steps/s, and U = X / k.

Local (one process, everything in sequence; PEARL's iteration with nothing overlapped):
  step   = (inf(c) + env + add1(m)) / n + o_step
  update = learn(c) + sample(m) + prio(m) + pub(c) / P + o_update
  X = 1 / (step + update / k)
  o_step, o_update: the loop's own costs, from the local calibration run with backend c (its time
  per step before learning starts, and per update after, minus the micro costs above) —
  bookkeeping, copies, the cache misses an update leaves behind for the next inference, and what
  a backend's threads or device calls cost inside a loop (cpu's run stands in for a backend
  without its own).

Distributed (actors, a replay node and the learner are separate processes, PEARL's iteration
extended): with f = min(1, A C / (k P)) the share of INSERTs after which an actor finds new
weights to FETCH,
  actor    a = (inf(c) + env) / n + o_actor + (insert_rtt - node_insert + f (fetch_rtt + o_fetch)) / C
  learner  server:     l = learn(c) + o_learner + sample_rtt + d(sample(m)) + prio_send + pub_send / P
           in-network: own = learn(c) + o_learner + prio_send + pub_send / P
                       l = own + push_ready + max(0, push_round + d(sample(m)) - own)
           (in-network the node samples and pushes the next batch while the learner learns; the
           learner waits only for what the round takes beyond its own work)
  node     v = (node_insert + d(addC(m)) + f node_fetch) / C
               + (node_batch + d(sample(m)) + node_prio(m) + node_publish / P) / k
  X = min(A / a, k / l, 1 / v, cores / (a + l_cpu / k + v))
  This is PEARL's iteration time, t = t_sample + max(t_update + t_insert, t_learn), in rate form:
  the replay node's work per update (v k: inserts, priority updates, batches) and the learner's
  (l) run in different processes, so the slower one sets the pace (the max); sampling sits on the
  learner's path in server placement (sample_rtt in l) and beside it in-network (overlap).
  (l_cpu also counts the learner's extra torch threads: learn(c) x (its CPU share - 1).)
  The transport's costs are per message, from a real replay node measured in isolation
  (insert_rtt, fetch_rtt, sample_rtt, push_round, push_ready, *_send; node_*: the node's handling
  time per message). o_actor and o_learner are the loops' own costs, from the calibration runs
  (median over transports, per placement for the learner); o_fetch is what a FETCH costs an actor
  in a working run beyond its isolated round trip (an actor-bound calibration run, where weights
  change between INSERTs: its time per step less the unthrottled one, per fetch). A backend c
  other than cpu adds its loop excess (d(o_step), d(o_update) of the local calibrations). The last bound is CPU contention: the
  actors, the replay node and the learner share the host's cores, each busy for its per-step
  demand (l_cpu = l minus the time the learner only waits for the node), so beyond `cores`
  processes adding actors adds no throughput. That is the knee EMC2'20 measures: the actor count
  where X(A + 1) < 1.05 X(A). The bottleneck named is the bound that binds.
  Before learning starts (warm-up, learning_starts env steps) the learner idles and f = 0:
  X_warm = min(A / a, 1 / v, cores / (a + v)), with the update terms left out. A distributed run's
  rate limiter also lets actors run its slack ahead of the learner (`insert_lead`, the runtime's
  own figure), which a short run fills at X_warm too. A run's average over S steps with L of warm-up
  and slack is S / (L / X_warm + (S - L) / X) (`run_average`).

Not modelled: other processes' use of the cores (the profile and every validation run record it:
`machine_state`; the plan warns when its profile was measured contended), and the CPU a blocked
role burns busy-polling before it sleeps (shm, dpdk). On a shared machine both slow distributed
mappings well below their prediction; a local mapping, one process, holds much better.

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
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass, field, replace
from typing import Any

DEFAULT_WATTS_PER_CORE = 10.0  # rated package power per busy core, an assumption (no meter here)
KNEE_GAIN = 0.05  # an actor that adds less than this share of throughput is past the knee
PUSH_CREDIT_DEFAULT = 2


@dataclass(frozen=True)
class Mapping:
    """One way to run a job: components, placement, actors, host (and dataset, for offline tabular)."""

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

    @property
    def family(self) -> tuple[Any, ...]:
        """Everything but the actor count (the knee is found within a family)."""
        return (self.host, self.placement, self.transport, self.replay, self.compute, self.options, self.dataset)

    def option_text(self) -> str:
        return ",".join(f"{param}={value}" for _, param, value in self.options)

    def label(self) -> str:
        parts = [self.placement]
        if self.transport:
            parts.append(self.transport)
        if self.replay:
            parts.append(self.replay)
        parts.append(self.compute + (f"[{self.option_text()}]" if self.options else ""))
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
                         options=options, **budget)


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
    warm_env_steps_per_s: float | None = None  # before learning starts
    modelled: dict[str, Any] | None = None  # a hardware prediction kept apart (kind "modelled")
    seconds: float | None = None  # offline: the predicted fit_offline time

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


def _cores(host: dict[str, Any]) -> float:
    fingerprint = host.get("fingerprint") or {}
    return float(fingerprint.get("cores_usable") or fingerprint.get("cores") or 1)


@dataclass(frozen=True)
class _Parts:
    """A job's micro figures for one replay memory and one compute backend, and the reference's."""

    inference: float
    env: float
    learn: float
    learn_share: float  # CPU cores busy while the learner updates (torch threads)
    publish: float
    add_step: float
    add_insert: float
    sample: float
    prio: float
    prioritized: bool
    reference: dict[str, float]


def _parts(job: dict[str, Any], replay: str | None, compute: str) -> _Parts:
    c = _figure(job["compute"], compute, "compute backend")
    m = _figure(job["replay"], replay, "replay memory")
    rc = _figure(job["compute"], "cpu", "compute backend")
    rm = _figure(job["replay"], "prioritized", "replay memory")
    reference = {"inference": rc["inference_us"], "learn": rc["learner_update_us"], "publish": rc["publish_us"],
                 "add_step": rm["add_step_us"], "add_insert": rm["add_insert_us"], "sample": rm["sample_us"],
                 "prio": rm["update_us"]}
    return _Parts(c["inference_us"], job["env_step_us"], c["learner_update_us"], c.get("learner_cpu_share", 1.0),
                  c["publish_us"], m["add_step_us"],
                  m["add_insert_us"], m["sample_us"], m["update_us"] if m["prioritized"] else 0.0, m["prioritized"],
                  reference)


# ------------------------------------------------------------------------- calibrated overheads
def local_overheads(job: dict[str, Any], compute: str = "cpu") -> tuple[float, float]:
    """(o_step, o_update): the local loop's costs beyond the micro figures, from the local
    calibration run with this compute backend (with cpu's where the backend has none)."""
    runs = job.get("calibration") or {}
    run, compute = (runs[f"local/{compute}"], compute) if "free_step_us" in runs.get(f"local/{compute}", {}) \
        else (runs.get("local") or {}, "cpu")
    if "free_step_us" not in run:
        return 0.0, 0.0
    ref = _parts(job, "prioritized", compute)
    n = job["num_envs"]
    calibrated_every = job["hyperparameters"]["publish_every"]
    step = run["free_step_us"] - (ref.inference + ref.env + ref.add_step) / n
    update = run["update_us"] - (ref.learn + ref.sample + ref.prio + ref.publish / calibrated_every)
    return step, update


def compute_excess(job: dict[str, Any], compute: str) -> tuple[float, float]:
    """What a compute backend costs in a loop beyond its micro figures, compared with cpu's (its
    threads, its device calls): the difference of the local calibrations' overheads."""
    step, update = local_overheads(job, compute)
    cpu_step, cpu_update = local_overheads(job, "cpu")
    return step - cpu_step, update - cpu_update


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


def _learner_comm(node: dict[str, Any], placement: str, own: float, d_sample: float, publish_every: int) -> float:
    """What the learner spends on the replay node per update, given `own` (its compute and sends)."""
    if placement == "server":
        return node["sample_rtt_us"] + d_sample
    return node["push_ready_us"] + max(0.0, node["push_round_us"] + d_sample - own)


def distributed_overheads(job: dict[str, Any]) -> dict[str, float]:
    """o_actor and o_learner per placement: what the calibration runs took beyond the micro and
    replay-node figures (median over the calibrated transports)."""
    ref = _parts(job, "prioritized", "cpu")
    n, chunk = job["num_envs"], job["insert_transitions"]
    every = job["hyperparameters"]["publish_every"]
    actor, learner = [], {"server": [], "in-network": []}
    runs = job.get("calibration") or {}
    fetch_extra = []
    for key, run in runs.items():
        if run.get("placement") == "local" or "update_us" not in run:
            continue
        transport, placement = run["transport"], run["placement"]
        try:
            node = _node(job, transport, placement)
        except ModelError:
            continue
        actor.append(run["free_step_us"] - (ref.inference + ref.env) / n
                     - max(0.0, node["insert_rtt_us"] - node["node"].get("insert_us", 0.0)) / chunk)
        own = ref.learn + node["priorities_send_us"] + node["publish_send_us"] / every
        learner[placement].append(run["update_us"] - own - _learner_comm(node, placement, own, 0.0, every))
        bound = runs.get(f"{key}/actors") or {}
        if "actor_learning_us" in bound:  # a FETCH in a working run costs more than alone: the excess
            fetches = min(1.0, chunk / (bound["train_every"] * every))
            per_fetch = (bound["actor_learning_us"] - run["free_step_us"]) * chunk / fetches
            fetch_extra.append(max(0.0, per_fetch - node["fetch_rtt_us"]))
    overheads = {"actor": statistics.median(actor) if actor else 0.0,
                 "fetch": statistics.median(fetch_extra) if fetch_extra else 0.0}
    for placement, values in learner.items():
        overheads[f"learner/{placement}"] = statistics.median(values) if values else 0.0
    overheads["calibrated"] = float(bool(actor))
    return overheads


# --------------------------------------------------------------------------------- prediction
def predict(mapping: Mapping, job: dict[str, Any], host: dict[str, Any], schedule: Schedule,
            power: Power) -> Prediction:
    if job["kind"] == "tabular-offline":
        return power.apply(predict_tabular(mapping, job, schedule))
    if mapping.placement == "local":
        return power.apply(predict_local(mapping, job, schedule))
    return power.apply(predict_distributed(mapping, job, host, schedule))


def _largest(parts: dict[str, float]) -> str:
    total = sum(parts.values())
    name = max(parts, key=parts.get)
    return f"{name} {parts[name] / total:.0%}" if total > 0 else name


def predict_local(mapping: Mapping, job: dict[str, Any], schedule: Schedule) -> Prediction:
    p = _parts(job, mapping.replay, mapping.compute)
    o_step, o_update = local_overheads(job, mapping.compute)
    n, k, every = job["num_envs"], schedule.train_every, schedule.publish_every
    step_parts = {"actor inference": p.inference / n, "env step": p.env / n, "replay add": p.add_step / n,
                  "actor loop": o_step}
    update_parts = {"learner update": p.learn, "replay sample+priorities": p.sample + p.prio,
                    "weights publish": p.publish / every, "learner loop": o_update}
    # a calibration can say the loop costs less than its parts measured alone; never below half of them
    micro_step = sum(v for name, v in step_parts.items() if name != "actor loop")
    micro_update = sum(v for name, v in update_parts.items() if name != "learner loop")
    warm_step = max(0.5 * micro_step, sum(step_parts.values()))
    per_step = warm_step + max(0.5 * micro_update, sum(update_parts.values())) / k
    x = 1e6 / per_step
    shares = {**step_parts, **{name: v / k for name, v in update_parts.items()}}
    shares = {name: max(0.0, v) for name, v in shares.items()}
    busy = 1.0 + max(0.0, p.learn_share - 1.0) * (p.learn / k) / per_step  # torch's extra threads
    return Prediction(env_steps_per_s=x, updates_per_s=x / k, samples_per_s=x / k * schedule.batch_size,
                      bottleneck=f"one process: {_largest(shares)}", bounds={"one process": x}, busy_cores=busy,
                      warm_env_steps_per_s=1e6 / warm_step)


def predict_distributed(mapping: Mapping, job: dict[str, Any], host: dict[str, Any], schedule: Schedule) -> Prediction:
    p = _parts(job, mapping.replay, mapping.compute)
    node = _node(job, mapping.transport, mapping.placement)
    overheads = distributed_overheads(job)
    n, chunk = job["num_envs"], job["insert_transitions"]
    k, every, actors, cores = schedule.train_every, schedule.publish_every, mapping.actors, _cores(host)
    d = p.reference
    fetch_share = min(1.0, actors * chunk / (k * every))

    extra_step, extra_update = compute_excess(job, mapping.compute)

    def actor_step(fetches: float) -> float:
        sends = max(0.0, node["insert_rtt_us"] - node["node"].get("insert_us", 0.0)) + \
            fetches * (node["fetch_rtt_us"] + overheads["fetch"])
        return (p.inference + p.env) / n + overheads["actor"] + extra_step + sends / chunk

    a, a_warm = actor_step(fetch_share), actor_step(0.0)
    own = p.learn + overheads[f"learner/{mapping.placement}"] + extra_update + node["priorities_send_us"] + \
        node["publish_send_us"] / every
    d_sample = p.sample - d["sample"]
    comm = _learner_comm(node, mapping.placement, own, d_sample, every)
    learner = own + comm
    batch = _batch_cost(job, mapping.transport, node)
    node_prio = node["node"].get("priorities_us", 0.0) + (p.prio - d["prio"] if p.prioritized else -d["prio"])
    v_insert = (node["node"].get("insert_us", 0.0) + p.add_insert - d["add_insert"]) / chunk
    v = v_insert + fetch_share * node["node"].get("fetch_us", 0.0) / chunk + \
        (batch + d_sample + max(0.0, node_prio) + node["node"].get("publish_us", 0.0) / every) / k
    # The learner's CPU: its own work and the receive; not the time the node spends on its batch.
    learner_cpu = own + (node["push_ready_us"] if mapping.placement == "in-network" else
                         max(0.0, node["sample_rtt_us"] - batch)) + max(0.0, p.learn_share - 1.0) * p.learn
    bounds = {f"actors ({actors})": 1e6 * actors / a, "learner": 1e6 * k / learner, "replay node": 1e6 / v,
              f"CPU ({cores:g} cores)": 1e6 * cores / (a + learner_cpu / k + v)}
    name = min(bounds, key=bounds.get)
    x = bounds[name]
    detail = name
    if name == "learner":
        detail = "learner: " + _largest({"update": p.learn, "replay node": comm,
                                         "sends": node["priorities_send_us"] + node["publish_send_us"] / every,
                                         "loop": max(0.0, overheads[f"learner/{mapping.placement}"])})
    warm = min(1e6 * actors / a_warm, 1e6 / max(v_insert, 1e-9), 1e6 * cores / (a_warm + v_insert))
    busy = min(cores, x * (a + learner_cpu / k + v) / 1e6)
    return Prediction(env_steps_per_s=x, updates_per_s=x / k, samples_per_s=x / k * schedule.batch_size,
                      bottleneck=detail, bounds=bounds, busy_cores=busy, warm_env_steps_per_s=warm)


def predict_tabular(mapping: Mapping, job: dict[str, Any], schedule: Schedule) -> Prediction:
    setting = tabular_setting(job, mapping.compute, mapping.options)
    if not setting.get("available"):
        raise ModelError(f"compute {mapping.compute}: {setting.get('reason') or 'unavailable when profiled'}")
    updates = (mapping.dataset or 0) * schedule.epochs
    seconds = setting["fixed_s"] + setting["per_update_s"] * updates
    rate = updates / seconds if seconds > 0 else 0.0
    breakdown = setting.get("breakdown") or {}
    bottleneck = ("emulator: " + _largest(breakdown)) if breakdown else "TD updates on the " + setting["device"]
    if setting["fixed_s"] > setting["per_update_s"] * updates:
        bottleneck += " (fixed costs dominate at this size)"
    modelled = None
    if setting.get("modelled"):
        m = setting["modelled"]
        m_seconds = m["fixed_s"] + m["per_update_s"] * updates
        modelled = {"kind": "modelled", "what": m["what"], "seconds": m_seconds,
                    "updates_per_s": updates / m_seconds if m_seconds > 0 else None,
                    "bottleneck": _largest(m["breakdown"]) if m.get("breakdown") else ""}
    return Prediction(env_steps_per_s=None, updates_per_s=rate, samples_per_s=rate, bottleneck=bottleneck,
                      bounds={"fit_offline": rate}, busy_cores=1.0, modelled=modelled, seconds=seconds)


def tabular_setting(job: dict[str, Any], compute: str, options: tuple[tuple[str, str, Any], ...]) -> dict[str, Any]:
    wanted = {param: value for _, param, value in options}
    for setting in job.get("settings", []):
        if setting["compute"] == compute and setting["options"] == wanted:
            return setting
    raise ModelError(f"compute {compute} with {wanted or 'its defaults'} is not in the profile")


def run_average(prediction: Prediction, steps: int, learning_starts: int, insert_lead: float = 0.0) -> float | None:
    """The env steps/s a run of `steps` would average: the warm-up before learning starts, and the
    rate limiter's slack (`insert_lead` transitions actors may run ahead of the learner, which a short
    run fills at the actors' pace), both at the actors' supply rate, then the steady rate."""
    if prediction.env_steps_per_s is None:
        return None
    warm = min(steps, learning_starts + insert_lead)
    if warm <= 0 or not prediction.warm_env_steps_per_s:
        return prediction.env_steps_per_s
    seconds = warm / prediction.warm_env_steps_per_s + (steps - warm) / prediction.env_steps_per_s
    return steps / seconds


def insert_lead(mapping: "Mapping", schedule: Schedule) -> float:
    """The transitions a distributed run's rate limiter lets actors run ahead (none locally)."""
    if mapping.placement == "local":
        return 0.0
    from rlbench.runtime.distributed.roles import rate_limiter_for

    return rate_limiter_for(schedule, mapping.actors).insert_lead


def knee(rates: list[tuple[int, float]], gain: float = KNEE_GAIN) -> int | None:
    """The actor count beyond which one more actor adds less than `gain` of throughput (None: it
    still grows at the largest count given)."""
    for (count, rate), (_, following) in itertools.pairwise(sorted(rates)):
        if following < rate * (1 + gain):
            return count
    return None


def with_actors(mapping: Mapping, actors: int) -> Mapping:
    return replace(mapping, actors=actors)
