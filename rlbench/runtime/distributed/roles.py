"""The three roles of a distributed run, each a plain function of picklable arguments.

Roles meet only through the replay node's transport address: nothing is inherited from the
launcher, so any launcher (local processes, a cluster engine) can start them anywhere. Each role
rebuilds its components by name from the registry and returns a JSON-able report.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlbench.algorithms.common import beta_at
from rlbench.arrays import as_float32, to_host
from rlbench.config import ACTOR_COMPUTE, RunConfig, actor_compute_of, run_hyperparameters
from rlbench.errors import RlbenchError
from rlbench.machine_state import threads_in_use
from rlbench.metrics import CPU_SAMPLE_EVERY, CpuMeter, Recorder, time_split
from rlbench.plugins import get_registry
from rlbench.runtime import checkpoint, patience, transitions
from rlbench.runtime.distributed.channel import Channel, RemoteError
from rlbench.runtime.distributed.messages import WireError, role_name
from rlbench.runtime.distributed.rate_limiter import RateLimiter
from rlbench.runtime.distributed.replay_client import ReplayClient
from rlbench.runtime.distributed.replay_node import NodeSettings, ReplayNode
from rlbench.runtime.distributed.shards import ShardedReplayClient, shard_of_actor
from rlbench.runtime.policies.data_parallel import GroupEnded

ACTOR_INSERT_TRANSITIONS = 128  # transitions per INSERT message (amortises a round trip and the node's work)
PUSH_CREDIT = 2  # batches an in-network replay node may stream ahead of the learner
RATE_SLACK_BATCHES = 16  # the rate limiter's slack is at least this many learner batches
REQUEST_TIMEOUT_S = 60.0  # before a peer is taken for lost; rlbench.runtime.patience scales it on a loaded machine
# What a role's own histograms say about where its time went (its replay client adds the time it was
# blocked in replay and weights calls; the rest of its loop is rlbench's bookkeeping).
ACTOR_TIMES = {"env.step": "env", "actor.inference": "inference"}
LEARNER_TIMES = {"learner.update": "learner"}  # (a learner group's collectives are taken out of it: "allreduce")
NODE_LOST = (RemoteError, ConnectionError, OSError, WireError)  # what talking to a replay node that is gone raises
GROUP_LOST = (RuntimeError,)  # what a torch.distributed collective raises when a learner of the group is gone


@dataclass
class RoleSpec:
    """Everything a role needs, all plain data."""

    role: str  # "replay", "learner", "actor"
    config: dict[str, Any]
    address: str = ""
    index: int = 0
    total_steps: int = 0
    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The replay node's: the run's secret; every other role's: its own key (messages.role_key), so it
    # can act as itself only. Travels with the spec, never on a command line.
    secret: bytes | None = field(default=None, repr=False)
    layout: dict[str, Any] | None = None  # the run's transitions (transitions.transition_layout), for the node
    frames: int = 0  # an image run's frames per observation (transitions.frames_of), for the node's memory
    # A learner's group, when the run's distribution policy has several (index = its rank): how many
    # learners, where learner 0's rendezvous is (learner 0: ""), and the host learner 0 listens on.
    learners: int = 1
    rendezvous: str = ""
    host: str = "127.0.0.1"
    cpus: int = 1  # the CPUs the role is given: its thread pools' size
    # --resume: the checkpoint folder the replay node and the learners continue from, and how many
    # times the run was resumed before (actors explore with new seeds each time)
    resume_from: str = ""
    resumes: int = 0
    # --replay-shards: every shard's address, for the learner (shard i's at i); a replay node's shard
    # is its index; an actor's budget share scales its node's count to the run's step (exploration)
    shard_addresses: tuple[str, ...] = ()
    step_scale: float = 1.0

    @property
    def name(self) -> str:
        return role_name(self.role, self.index)

    @property
    def run_config(self) -> RunConfig:
        return RunConfig(**self.config)


def _components(spec: RoleSpec):
    registry = get_registry()
    config = spec.run_config
    algorithm = registry.get("algorithm", config.algo).create()
    hp = run_hyperparameters(algorithm, config, registry)
    return registry, config, algorithm, hp


def actors_compute(registry, spec: RoleSpec):
    """The compute backend an actor infers on (--actor-compute, else --compute), built with its options."""
    config = spec.run_config
    backend = registry.get("compute", actor_compute_of(config))
    own = backend is not registry.get("compute", config.compute)  # its options are kept apart (validate.py)
    return backend.create(**spec.options.get(ACTOR_COMPUTE if own else "compute", {}))


def _backend(name: str, compute: Any) -> dict[str, str]:
    """What a role's report says of its compute backend: the name chosen and the class that ran."""
    return {"name": name, "class": f"{type(compute).__module__}.{type(compute).__qualname__}"}


def _transport(registry, spec: RoleSpec):
    component = registry.get("transport", spec.run_config.transport)
    return component.create(**spec.options.get("transport", {})), component.capabilities


def _times(t0: float, cpu0: os.times_result) -> dict[str, float]:
    cpu1 = os.times()
    return {"wall_s": time.perf_counter() - t0, "cpu_s": (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)}


def _histograms(recorder: Recorder) -> dict[str, Any]:
    return {name: h.to_dict() for name, h in recorder.histograms.items() if h.count}


def connect(spec: RoleSpec, transport: Any, capabilities: Any, recorder: Recorder, role: str,
            frames: int = 0) -> ReplayClient:
    """A role's authenticated channel to the replay node, and the replay client over it (`frames`: an
    image run's actor's, whose INSERTs carry each frame once)."""
    connection = transport.connect(spec.address, timeout=patience(REQUEST_TIMEOUT_S))
    channel = Channel(connection, reliable=capabilities.reliable, timeout=patience(REQUEST_TIMEOUT_S), recorder=recorder)
    channel.authenticate(role, spec.index, spec.secret)
    return ReplayClient(channel, frames=frames)


# ------------------------------------------------------------------------------------- replay
def rate_limiter_for(hp: Any, actors: int, shards: int = 1) -> RateLimiter:
    """The run's samples-per-insert limiter: the ratio batch_size / train_every, sampling from
    learning_starts on, and slack around the ratio: two rounds of inserts from every actor, and at
    least RATE_SLACK_BATCHES learner batches, so actors and learner are not forced into lock-step (each
    waiting on the other) when the learner does little per insert; the achieved ratio still converges.
    One shard of several (`actors`: those hashed to it) samples from its share of learning_starts on."""
    samples_per_insert = hp.batch_size / hp.train_every
    chunk = ACTOR_INSERT_TRANSITIONS * max(1, actors)
    error_buffer = max(samples_per_insert * 2 * chunk, RATE_SLACK_BATCHES * hp.batch_size)
    return RateLimiter(samples_per_insert, max(1, -(-max(hp.learning_starts, hp.batch_size) // shards)),
                       error_buffer=error_buffer + hp.batch_size * PUSH_CREDIT)


def actors_lead(hp: Any, actors: int) -> float:
    """Env steps the actors may run ahead of the learner before the rate limiter holds them: its
    min_size_to_sample (learning_starts) and slack, and one INSERT in flight per actor. A run no
    longer than this may end before the learner had to make a single update."""
    limiter = rate_limiter_for(hp, actors)
    return limiter.min_size_to_sample + limiter.insert_lead + actors * ACTOR_INSERT_TRANSITIONS


def forced_updates(hp: Any, steps: int, actors: int) -> int:
    """The updates the learner must have made before a run of `steps` env steps can end: one per
    train_every env steps past the actors' lead."""
    return max(0, math.floor((steps - actors_lead(hp, actors)) / hp.train_every))


def replay_node_main(spec: RoleSpec, announce) -> dict[str, Any]:
    """Listens, announces its address through `announce(address)`, serves until SHUTDOWN."""
    registry, config, algorithm, hp = _components(spec)
    transport, capabilities = _transport(registry, spec)
    memory_component = registry.get("replay", config.replay)
    shards, shard = config.replay_shards, spec.index
    # an image run's memory stores each frame once where it can (transitions.make_memory's rule)
    frames = spec.frames if memory_component.capabilities.frames else 0
    memory = memory_component.create(capacity=-(-hp.buffer_size // shards), alpha=hp.per_alpha,
                                     seed=config.seed + 15485863 * shard, **({"frames": frames} if frames else {}),
                                     **spec.options.get("replay", {}))
    saved = checkpoint.load_replay(spec.resume_from, memory, shard) if spec.resume_from else None
    listener = transport.listen(spec.address or None)
    actors = sum(1 for i in range(config.actors) if shard_of_actor(i, shards) == shard)
    limiter = rate_limiter_for(hp, actors, shards)
    limit = min(capabilities.max_message_bytes, getattr(transport, "max_message_bytes", capabilities.max_message_bytes))
    settings = NodeSettings(placement=config.placement, total_steps=spec.total_steps, batch_size=hp.batch_size,
                            seconds=config.seconds, max_message_bytes=limit, secret=spec.secret, layout=spec.layout,
                            frames=spec.frames,
                            checkpoint_dir=config.checkpoint_dir if config.checkpoint_every else None,
                            shard=shard, shards=shards)
    node = ReplayNode(listener, memory, limiter, settings, prioritized=memory_component.capabilities.prioritized)
    if saved is not None:
        node.restore(saved, spec.resume_from)
    announce(listener.address)  # (once it is ready: a role that fails to start says why, not a closed connection)
    try:
        return node.serve()
    finally:
        listener.close()


# -------------------------------------------------------------------------------------- actor
def actor_main(spec: RoleSpec, announce=None) -> dict[str, Any]:
    t0, cpu0 = time.perf_counter(), os.times()
    registry, config, algorithm, hp = _components(spec)
    transport, capabilities = _transport(registry, spec)
    seed = config.seed + 7919 * (spec.index + 1) + 104729 * spec.resumes  # actors explore differently
    env = registry.get("environment", config.env).create(num_envs=config.num_envs, seed=seed,
                                                         **spec.options.get("environment", {}))
    compute = actors_compute(registry, spec)
    actor = algorithm.make_actor(env.spec, compute, hp, seed)
    prioritized = registry.get("replay", config.replay).capabilities.prioritized
    priorities_of = getattr(actor, "initial_priorities", None) if prioritized else None
    recorder = Recorder()
    staleness = Recorder()
    client = connect(spec, transport, capabilities, recorder, "actor", frames=transitions.frames_of(env.spec))
    version = -1

    n = env.spec.num_envs
    rows = max(1, ACTOR_INSERT_TRANSITIONS // n)
    layout = transitions.transition_layout(env.spec)
    chunk: dict[str, list] = {name: [] for name in layout}
    produced = stored_sent = 0
    dropped: dict[str, int] = {}
    episode_return = np.zeros(n)
    episode_length = np.zeros(n, dtype=np.int64)
    curve = []
    obs = env.reset(seed=seed)
    in_flight, in_flight_rows = None, 0
    h_act, h_env = recorder.histogram("actor.inference"), recorder.histogram("env.step")
    clock, cpu_clock = time.perf_counter_ns, time.thread_time_ns
    feedback = client.feedback
    lost = ""
    loop_t0 = time.perf_counter()
    cpu = CpuMeter()
    steps = started_at_step = 0
    try:
        # The run's step so far (0 unless it was resumed or this actor replaces one): exploration,
        # the curve's steps and the schedules go on from there.
        client.status()
        started_at_step = int(feedback["produced"] * spec.step_scale)
        version = _fetch_weights(client, actor, version, wait=True)  # a node lost while we wait is lost like any other time
        while not client.finished:
            global_step = int((feedback["produced"] + produced - stored_sent) * spec.step_scale)
            sampled = not steps % CPU_SAMPLE_EVERY  # this step's work is also timed on the CPU clock
            steps += 1
            if sampled:
                c_a = cpu_clock()
            t_a = clock()
            actions = actor.act(obs, global_step)
            t_b = clock()
            if sampled:
                c_b = cpu_clock()
            result = env.step(actions)
            t_c = clock()
            if sampled:
                c_c = cpu_clock()
                cpu.add("inference", (c_b - c_a) * CPU_SAMPLE_EVERY)
                cpu.add("env", (c_c - c_b) * CPU_SAMPLE_EVERY)
            h_act.record(t_b - t_a)
            h_env.record(t_c - t_b)
            rewards = to_host(result.rewards)  # the wire carries numpy: device tensors come to the host here
            for name, value in transitions.transition(obs, actions, rewards, result.final_observations,
                                                      as_float32(result.terminated)).items():
                chunk[name].append(to_host(value))
            produced += n
            episode_return += rewards
            episode_length += 1
            ended = to_host(result.terminated | result.truncated)
            for i in np.flatnonzero(ended):
                curve.append({"step": int(global_step + n), "time_s": round(time.perf_counter() - t0, 4),
                              "return": float(episode_return[i]), "length": int(episode_length[i])})
            episode_return[ended] = 0.0
            episode_length[ended] = 0
            obs = result.observations
            if len(chunk["obs"]) >= rows:
                if in_flight is not None:  # the previous INSERT's reply: one stays in flight while we step
                    client.add_finish(in_flight)
                    stored_sent += in_flight_rows
                in_flight, in_flight_rows = _flush(client, chunk, layout, priorities_of)
                staleness.histogram("weights_staleness").record(feedback["learner_updates"] - version)
                if feedback["params_version"] > version:
                    version = _fetch_weights(client, actor, version, wait=False)
        if in_flight is not None:
            client.add_finish(in_flight)
            stored_sent += in_flight_rows
        if chunk["obs"]:  # the run is over, but what was produced is still stored
            pending, rows_sent = _flush(client, chunk, layout, priorities_of)
            client.add_finish(pending)
            stored_sent += rows_sent
    except NODE_LOST as exc:  # the run goes on without us: report what we produced and what was acknowledged
        lost = f"lost the replay node: {type(exc).__name__}: {exc}"
    finally:
        env.close()
    cpu.add_seconds(client.cpu_s())
    split = time_split(recorder, time.perf_counter() - loop_t0, ACTOR_TIMES, client.blocked_s(), cpu)
    if produced > stored_sent:
        dropped["lost with the replay node (never acknowledged)" if lost else "never sent"] = produced - stored_sent
    report = {"role": f"actor-{spec.index}", "compute": _backend(actor_compute_of(config), compute),
              "produced": produced, "started_at_step": started_at_step, "sent": stored_sent, "dropped": dropped,
              "weights": client.weights_traffic,
              "weights_version": version, "curve": curve, "histograms": _histograms(recorder),
              "staleness": staleness.histograms["weights_staleness"].summary(unit="updates", scale=1)
              if "weights_staleness" in staleness.histograms else {"count": 0},
              "counters": dict(recorder.counters), "link": client.link_stats(), "lost": lost, "time_split": split,
              "threads": threads_in_use(), **_times(t0, cpu0)}
    _leave(client, {k: v for k, v in report.items() if k != "curve"}, lost)
    return report


class Checkpoints:
    """Learner 0's checkpoint clock (--checkpoint-every): every so many seconds, between two updates,
    its half of the next checkpoint, then the node's (rlbench/runtime/checkpoint.py)."""

    def __init__(self, config: RunConfig, spec: RoleSpec) -> None:
        on = bool(config.checkpoint_every) and spec.index == 0 and spec.role == "learner"
        self.every = config.checkpoint_every if on else None
        self.directory = config.checkpoint_dir
        self.number = int(os.path.basename(spec.resume_from).removeprefix("ckpt-")) if spec.resume_from else 0
        self.at = time.monotonic() + self.every if self.every else math.inf
        self.seconds = 0.0  # the learner's time in checkpoints, all their parts
        self.failed = ""  # why checkpoints stopped (the run goes on without them)
        self.shards = config.replay_shards
        self.written: list[dict[str, Any]] = []  # the complete ones: number, env steps, updates, seconds

    def due(self) -> bool:
        return time.monotonic() >= self.at

    def write(self, client: ReplayClient, learner: Any, cpu: CpuMeter) -> None:
        started, cpu_started = time.perf_counter_ns(), time.thread_time_ns()
        self.number += 1
        try:
            checkpoint.save_learner(self.directory, self.number, learner)
            env_steps = client.checkpoint(self.number)  # every replay node's part
            record = {"env_steps": env_steps, "learner_updates": learner.updates, "written_at": time.time()}
            checkpoint.commit(self.directory, self.number, self.shards, record)
            self.written.append({"number": self.number, "env_steps": env_steps, "learner_updates": learner.updates,
                                 "seconds": round((time.perf_counter_ns() - started) / 1e9, 4)})
            self.at = time.monotonic() + self.every
        except (OSError, RlbenchError) as exc:  # a full disk, a directory a node cannot see: said, not fatal
            self.failed = f"checkpoint {self.number} failed: {type(exc).__name__}: {exc}"
            self.at = math.inf
        self.seconds += (time.perf_counter_ns() - started) / 1e9
        cpu.add("checkpoint", time.thread_time_ns() - cpu_started)


def _leave(client: ReplayClient | ShardedReplayClient, report: dict[str, Any], lost: str) -> None:
    """Say goodbye with the final counters, unless the node is gone."""
    try:
        if not lost:
            client.bye(report)
    except NODE_LOST:
        pass
    finally:
        client.close()


def _flush(client: ReplayClient, chunk: dict[str, list], layout: transitions.Layout, priorities_of=None):
    """Send the chunk as one INSERT in the run's layout; returns (the pending request, how many
    transitions it holds)."""
    batch = transitions.as_layout(layout, {name: np.concatenate(values) if np.ndim(values[0]) else values
                                           for name, values in chunk.items()})
    rows = len(batch["obs"])
    pending = client.add_begin(batch, priorities_of(batch) if priorities_of else None, produced=rows)
    for values in chunk.values():
        values.clear()
    return pending, rows


def _fetch_weights(client: ReplayClient, actor: Any, have: int, *, wait: bool) -> int:
    """Pick up newer weights from the replay node; at start, wait until the learner published."""
    deadline = time.monotonic() + patience(REQUEST_TIMEOUT_S)
    while True:
        got = client.fetch_params(have)
        if got is not None:
            version, weights = got
            actor.load_weights(weights, version)
            return version
        if not wait or client.finished:
            return have
        if time.monotonic() > deadline:
            raise TimeoutError("the learner never published weights")
        time.sleep(0.01)


# ------------------------------------------------------------------------------------ learner
def learner_main(spec: RoleSpec, announce=None) -> dict[str, Any]:
    """The learner loop: draw a batch (SAMPLE, or the node's push), update, send the new priorities,
    publish weights every publish_every updates. Under a policy with several learners (the run's
    distribution policy gives this learner its group), it draws its share of every batch, trains in
    step with the others, and only learner 0 publishes."""
    t0, cpu0 = time.perf_counter(), os.times()
    registry, config, algorithm, hp = _components(spec)
    transport, capabilities = _transport(registry, spec)
    probe_env = registry.get("environment", config.env).create(num_envs=1, seed=config.seed,
                                                               **spec.options.get("environment", {}))
    env_spec = probe_env.spec
    probe_env.close()
    compute = registry.get("compute", config.compute).create(**spec.options.get("compute", {}))
    learner = algorithm.make_learner(env_spec, compute, hp, config.seed)
    if spec.resume_from:  # every learner of a group loads the same state: they stay identical
        checkpoint.load_learner(spec.resume_from, learner)
    checkpoints = Checkpoints(config, spec)
    group = None
    if spec.learners > 1:
        policy = registry.get("policy", config.policy).create()
        group = policy.learner_group(spec.index, spec.learners, spec.rendezvous, spec.host, announce)
        group.attach(learner)
    batch_size = group.share(hp.batch_size) if group is not None else hp.batch_size
    publishes = spec.index == 0
    prioritized = registry.get("replay", config.replay).capabilities.prioritized
    recorder = Recorder()
    if len(spec.shard_addresses) > 1:  # --replay-shards: one client per shard, batches drawn across them
        client = ShardedReplayClient([connect(dataclasses.replace(spec, address=address), transport, capabilities,
                                              recorder, "learner") for address in spec.shard_addresses],
                                     seed=config.seed + spec.index)
    else:
        client = connect(spec, transport, capabilities, recorder, "learner")
    in_network = config.placement == "in-network"
    if publishes:
        client.publish_params(learner.weights(), learner.updates)
    beta = beta_at(hp, 0, spec.total_steps)
    if in_network:
        client.credit(PUSH_CREDIT, beta)
    h_learn = recorder.histogram("learner.update")
    updates = samples = 0
    nothing = (np.empty(0, np.int64), np.empty(0))  # a uniform memory takes no priorities
    lost = ""
    loop_t0 = time.perf_counter()
    cpu = CpuMeter()
    push_timeout = patience(REQUEST_TIMEOUT_S)
    try:
        while True:
            sample = client.wait_pushed(push_timeout) if in_network else client.sample(batch_size, beta)
            if group is not None:
                group.begin_step(alive=sample is not None)
            if sample is None:
                if group is not None:
                    group.leave()
                break
            t_a, c_a = time.perf_counter_ns(), time.thread_time_ns()
            try:
                priorities, _ = learner.update(sample)
            except GroupEnded:  # another learner reached the end: all stop at this step
                break
            h_learn.record(time.perf_counter_ns() - t_a)
            cpu.add("learner", time.thread_time_ns() - c_a)
            updates += 1
            samples += len(sample.indices)
            beta = beta_at(hp, client.step, spec.total_steps)
            indices, priorities = (sample.indices, to_host(priorities)) if prioritized else nothing
            client.update_priorities(indices, priorities, learner_updates=learner.updates,
                                     credit=1 if in_network else None, beta=beta)
            if publishes and updates % hp.publish_every == 0:
                client.publish_params(learner.weights(), learner.updates)
            if checkpoints.due():
                checkpoints.write(client, learner, cpu)
        if publishes:
            client.publish_params(learner.weights(), learner.updates)  # final weights, for evaluation
    except NODE_LOST as exc:
        lost = f"lost the replay node: {type(exc).__name__}: {exc}"
    except GROUP_LOST as exc:  # a learner of the group is gone: its collective failed here
        if group is None:
            raise
        lost = f"lost a learner of its group: {type(exc).__name__}: {exc}"
    measured = client.blocked_s()
    measured["checkpoint"] = checkpoints.seconds
    if group is not None:  # the group's collectives ran inside the algorithm's update: their own line
        measured["allreduce"] = (group.allreduce_ns + group.agreement_ns) / 1e9
        measured["learner"] = -measured["allreduce"]
    cpu.add_seconds(client.cpu_s())
    split = time_split(recorder, time.perf_counter() - loop_t0, LEARNER_TIMES, measured, cpu)
    report = {"role": spec.name, "compute": _backend(config.compute, compute), "updates": updates,
              "updates_total": learner.updates, "samples": samples, "weights": client.weights_traffic,
              "histograms": _histograms(recorder), "checkpoints": checkpoints.written,
              "counters": dict(recorder.counters), "link": client.link_stats(), "lost": lost, "time_split": split,
              "threads": threads_in_use(), **_times(t0, cpu0)}
    if checkpoints.failed:
        report["checkpoint_failed"] = checkpoints.failed
    if group is not None:
        report["group"] = group.report()
        group.close()
    _leave(client, report, lost)
    return report
