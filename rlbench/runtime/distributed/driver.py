"""The driver of a distributed run: start its roles in order through a launcher, watch them, stop
them in order, and merge what they measured into the run's figures and accounting.

Roles: the replay node first (it announces its address), then the learners the run's distribution
policy asks for (learner 0 announces its group's rendezvous when there are several), then the
actors. The launcher (rlbench.runtime.launchers) only starts, watches and stops processes.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlbench.metrics import Histogram, Recorder
from rlbench.registry import load_object
from rlbench.runtime.context import Accounting, Budget, LearningCurve, LoopStats
from rlbench.runtime import patience, transitions
from rlbench.runtime.distributed import messages
from rlbench.runtime.distributed.channel import Channel
from rlbench.runtime.distributed.messages import Op
from rlbench.runtime.distributed.messages import role_name
from rlbench.runtime.distributed.roles import NODE_LOST, REQUEST_TIMEOUT_S, RoleSpec
from rlbench.runtime.distributed.shards import budgets, shard_of_actor
from rlbench.runtime.launchers import (
    GRACE_S,
    POLL_S,
    Launcher,
    RoleFailedError,
    RoleHandle,
    listen_address,
    one_line,
)
from rlbench.runtime.policies import policy_of


@dataclass
class DistributedOutcome:
    stats: LoopStats
    recorder: Recorder
    accounting: Accounting
    curve: LearningCurve
    final_weights: list[np.ndarray] | None
    weights_version: int
    failures: list[str] = field(default_factory=list)
    stop_reason: str = ""
    roles: dict[str, Any] = field(default_factory=dict)


def run_distributed(config: Any, plan: Any, hp: Any, budget: Budget,
                    launcher: Launcher | None = None) -> DistributedOutcome:
    """Start replay node, learner and actors; return when the run is over and every role has stopped.

    The run ends when the node counts the budget, or on a stop reason (a signal, a dead role the
    run cannot do without). Either way roles stop in order: the node is told to finish (actors then
    flush and report, the learner gets END and reports), the launcher waits for them, then takes the
    final weights and the node's report and shuts it down. Only what is still running after that is
    killed. When the node itself is gone, accounting uses what the launcher last polled.
    """
    secret = secrets.token_bytes(32)  # the run's: the node's; every other role gets its own key; never printed or stored
    resume_from, resumes = _checkpoints(config, budget)
    base = RoleSpec(role="", config=dataclasses.asdict(config), total_steps=budget.total_steps, options=plan.options,
                    resume_from=resume_from, resumes=resumes)
    base.config["replay"] = plan.replay.name

    def role(name: str, address: str, index: int = 0, **group: Any) -> RoleSpec:
        return dataclasses.replace(base, role=name, address=address, index=index,
                                   secret=messages.role_key(secret, name, index), **group)

    n_learners = policy_of(config).learners(config)

    transport = plan.transport.create(**plan.options.get("transport", {}))
    launcher = launcher or make_launcher(config, plan, transport)  # a cluster's pre-flight refuses here
    started, first_progress = time.perf_counter(), None
    failures: list[str] = []
    incarnations: list[dict[str, Any]] = []  # actors replaced after they died (--actor-restarts)
    stop_reason = ""
    left_early = None  # a learner that left with exit code 0 before the run was over (its group lost one)
    at_once = False
    shards = config.replay_shards
    final_weights, weights_version = None, -1
    node_reports: list[dict[str, Any] | None] = [None] * shards
    last_states: list[dict[str, Any] | None] = [None] * shards
    controls: list[Channel] = []
    try:
        bound = listen_address(transport, plan.transport.name, config.bind) if config.bind else None
        layout, frames = run_layout(config, plan)
        shares = budgets(budget.total_steps, config.actors, shards)
        nodes = [launcher.start(dataclasses.replace(base, role="replay", index=shard, address=bound or "",
                                                    secret=secret, layout=layout, frames=frames,
                                                    total_steps=shares[shard]))
                 for shard in range(shards)]
        addresses = tuple(launcher.wait_address(node) for node in nodes)
        address = addresses[0]
        learners = [launcher.start(role("learner", address, 0, learners=n_learners, shard_addresses=addresses))]
        if n_learners > 1:  # learner 0 announces its group's rendezvous; the others join it there
            rendezvous = launcher.wait_address(learners[0])
            learners += [launcher.start(role("learner", address, rank, learners=n_learners, rendezvous=rendezvous,
                                             shard_addresses=addresses))
                         for rank in range(1, n_learners)]

        def start_actor(index: int, slot: int) -> RoleHandle:  # on its slot's shard (a replacement keeps it)
            shard = shard_of_actor(slot, shards)
            return launcher.start(role("actor", addresses[shard], index,
                                       step_scale=budget.total_steps / max(1, shares[shard])))

        actors = [start_actor(i, i) for i in range(config.actors)]
        for shard_address in addresses:
            control = Channel(transport.connect(shard_address, timeout=patience(REQUEST_TIMEOUT_S)),
                              reliable=plan.transport.capabilities.reliable, timeout=patience(REQUEST_TIMEOUT_S))
            controls.append(control)
            control.authenticate("launcher", 0, messages.role_key(secret, "launcher", 0))
        reported_dead: set[str] = set()
        restarts_left = {actor.name: config.actor_restarts for actor in actors}  # per original actor slot
        slot_of = {handle.name: index for index, handle in enumerate(actors)}
        next_index = config.actors
        while True:
            launcher.wait(launcher.handles, POLL_S)  # reads role outcomes while it waits
            if budget.interrupted:
                stop_reason = budget.interrupted
                break
            dead = next((node for node in nodes if not node.alive()), None)
            if dead is not None:
                stop_reason = f"{_node_name(dead)} died ({launcher.failure_of(dead)})"
                break
            try:
                for shard, control in enumerate(controls):
                    last_states[shard] = messages.state_of(control.request(Op.STATUS)[1])
            except NODE_LOST as exc:
                stop_reason = _lost_node(launcher, nodes[shard], exc)
                break
            produced = sum(state["produced"] for state in last_states)
            budget.progress(produced)
            if first_progress is None and produced:
                first_progress = time.perf_counter() - started  # start-up, on this host's clock (within a poll)
            if all(state["finished"] for state in last_states):
                break
            # one that died is the cause: the others of its group leave cleanly when it does, maybe
            # before this poll sees it (roles forked from the fork server start and stop quickly)
            stopped = min((learner for learner in learners if not learner.alive()),
                          key=lambda learner: learner.exitcode == 0, default=None)
            if stopped is not None:  # before the run is over: nothing would sample, the actors would stall
                stop_reason = (f"{stopped.name} died ({launcher.failure_of(stopped)})" if stopped.exitcode != 0
                               else f"{stopped.name} stopped before the run was over (exit code 0)")
                left_early = stopped.name if stopped.exitcode == 0 else None
                break
            for actor in list(actors):
                if not actor.alive() and actor.exitcode != 0 and actor.name not in reported_dead:
                    reported_dead.add(actor.name)
                    why = launcher.failure_of(actor)
                    failures.append(f"{actor.name} died ({why})")
                    slot = slot_of[actor.name]
                    slot_name = role_name("actor", slot)
                    if restarts_left[slot_name] > 0:  # a new incarnation, under a new identity (its own key)
                        restarts_left[slot_name] -= 1
                        replacement = start_actor(next_index, slot)
                        next_index += 1
                        slot_of[replacement.name] = slot
                        actors.append(replacement)
                        incarnations.append({"slot": slot_name, "died": actor.name, "why": one_line(why),
                                             "replaced_by": replacement.name})
                    elif config.on_actor_failure == "stop":
                        stop_reason = f"{actor.name} died and --on-actor-failure is stop"
            if stop_reason:
                break
            if all(actor.name in reported_dead for actor in actors):
                stop_reason = "every actor died"
                break
        if stop_reason:  # every node finishes, so every role hears the run is over
            for shard, control in enumerate(controls):
                if nodes[shard].alive():
                    try:
                        control.request(Op.FINISH, {"reason": messages.text(one_line(stop_reason))})
                    except NODE_LOST:
                        pass
        launcher.wait([h for h in launcher.handles if h.role != "replay"], GRACE_S)
        for shard, control in enumerate(controls):
            if not nodes[shard].alive():
                continue
            try:
                if shard == 0:
                    op, arrays = control.request(Op.FETCH_PARAMS, {"have_version": np.int64(-1)})
                    if op == Op.PARAMS:
                        weights_version, final_weights = messages.read_weights(arrays)
                node_reports[shard] = messages.read_json(control.request(Op.STATS)[1]["json"])
                control.request(Op.SHUTDOWN)
            except NODE_LOST as exc:
                stop_reason = stop_reason or _lost_node(launcher, nodes[shard], exc)
    except RoleFailedError as exc:
        stop_reason = one_line(exc)
    except KeyboardInterrupt:  # a second stop signal (errors.SignalInterrupt): at once, no grace for the roles
        at_once = True
        raise
    finally:
        for control in controls:
            control.close()
        launcher.stop_all(grace=0.0 if at_once else GRACE_S)
    outcomes = launcher.collect()
    if left_early is not None:
        stop_reason = _learner_left_early(left_early, [learner.name for learner in learners], outcomes)
    where = launcher.describe()
    launcher.close()
    for shard in range(shards):
        name = role_name("replay", shard)
        if node_reports[shard] is None and outcomes.get(name, ("", None))[0] == "ok":
            node_reports[shard] = outcomes[name][1]
    failed = _node_failure(node_reports)
    if failed and not budget.interrupted:  # the cause: the roles that stopped after it (a learner that found
        stop_reason = failed                # nothing to sample, actors refused) are its consequences
    for name, (status, payload) in outcomes.items():
        if status == "error" and not any(f.startswith(name) for f in failures):
            failures.append(f"{name} failed: {one_line(payload)}")
    outcome = _merge(outcomes, node_reports, last_states, final_weights, weights_version, failures, stop_reason)
    outcome.stats.startup_s = first_progress
    if incarnations:
        outcome.stats.extra["actor_incarnations"] = incarnations
    _record_where(outcome, where)
    return outcome


def _checkpoints(config: Any, budget: Budget) -> tuple[str, int]:
    """(the checkpoint folder a --resume continues from or "", the run's resumes so far); a run that
    checkpoints writes its manifest first, so a run killed before its first checkpoint is known too."""
    from rlbench.runtime import checkpoint

    resume_from, resumes = "", 0
    if config.resume:
        resume_from = checkpoint.latest(config.resume)["path"]
        resumes = checkpoint.read_manifest(config.resume).get("resumes", 0) + 1
    if config.checkpoint_every:
        run = {k: v for k, v in dataclasses.asdict(config).items() if k not in RESUME_OWN}
        checkpoint.write_manifest(config.checkpoint_dir, run, budget.total_steps, resumes)
    return resume_from, resumes


# What a resumed run takes from its own command line, not from the run it continues.
RESUME_OWN = ("resume", "launcher", "ray_address", "place", "placement_strategy", "bind", "out")


def run_layout(config: Any, plan: Any) -> tuple[transitions.Layout, int]:
    """The transitions this run's actors produce, from its environment's spec (one environment built
    here, as the launcher's pre-flight does): the replay node refuses any other layout; and the frames
    per observation of an image run (transitions.frames_of), how the node's memory stores them."""
    env = plan.environment.create(num_envs=1, seed=config.seed, **plan.options.get("environment", {}))
    try:
        return transitions.transition_layout(env.spec), transitions.frames_of(env.spec)
    finally:
        env.close()


def _record_where(outcome: DistributedOutcome, where: dict[str, Any]) -> None:
    """Each role's host (and node, on a cluster) in its role entry; the launcher's own facts beside."""
    for name, place in where.get("roles", {}).items():
        if name in outcome.roles:
            outcome.roles[name].update(place)
        else:  # started, but it never reported (its node was lost): where it was is still known
            outcome.roles[name] = dict(place, reported=False)
    outcome.stats.extra["launcher"] = {k: v for k, v in where.items() if k != "roles"}


def _resumed(shard_reports: list[dict[str, Any]]) -> dict[str, Any] | None:
    """What the run continued: shard 0's record, with every shard's env steps and stored counts."""
    resumed = [r["resumed_from"] for r in shard_reports if r.get("resumed_from")]
    if not resumed:
        return None
    return {**resumed[0], "env_steps": sum(r["env_steps"] for r in resumed),
            "stored": sum(r["stored"] for r in resumed)}


def _learner_left_early(name: str, group: list[str], outcomes: dict[str, tuple[str, Any]]) -> str:
    """Why a learner left before the run was over with exit code 0. When its data-parallel group lost a
    learner (its report says so), the headline names the one that was lost: the learner that never
    reported. A learner whose Ray node died is still alive to Ray for its health checks' time after its
    group noticed, so the first learner seen to stop is the survivor, not the cause."""
    status, report = outcomes.get(name, ("", None))
    lost = report.get("lost") if status == "ok" and isinstance(report, dict) else ""
    if not lost:
        return f"{name} stopped before the run was over (exit code 0)"
    gone = [other for other in group if other != name and outcomes.get(other, ("", None))[0] != "ok"]
    if not gone:
        return f"{name} {lost}"
    return f"{', '.join(gone)} of the data-parallel group {'was' if len(gone) == 1 else 'were'} lost ({name} {lost})"


def _node_failure(node_reports: list[dict[str, Any] | None]) -> str:
    """The first replay node's own failure (its memory's, ReplayNode._memory_call) that ended the run, or ""."""
    for shard, report in enumerate(node_reports):
        if report and report.get("failure"):
            return f"{'the replay node' if shard == 0 else f'replay node {shard} (a shard)'}: {report['failure']}"
    return ""


def _node_name(node: RoleHandle) -> str:
    return "the replay node" if node.index == 0 else f"replay node {node.index} (a shard)"


def _lost_node(launcher: Launcher, node: RoleHandle, exc: Exception) -> str:
    node.join(2)
    return (f"lost {_node_name(node)} ({one_line(exc)})" if node.alive()
            else f"{_node_name(node)} died ({launcher.failure_of(node)})")


def _merge(outcomes: dict[str, tuple[str, Any]], node_reports: list[dict[str, Any] | None],
           last_states: list[dict[str, Any] | None], final_weights: list[np.ndarray] | None, weights_version: int,
           failures: list[str], stop_reason: str) -> DistributedOutcome:
    recorder = Recorder()
    accounting = Accounting()
    curve = LearningCurve()
    roles: dict[str, Any] = {}
    # What each role reported to the launcher; where that is missing, what it told a node in its BYE.
    reports: dict[str, Any] = {}
    for node_report in node_reports:
        reports.update((node_report or {}).get("reports", {}))
    reports.update({name: payload for name, (status, payload) in outcomes.items() if status == "ok"})
    shard_reports = {role_name("replay", shard): {k: v for k, v in report.items() if k != "reports"}
                     for shard, report in enumerate(node_reports) if report is not None}
    reports.update(shard_reports)
    all_reported = len(shard_reports) == len(node_reports)
    node_report = shard_reports.get("replay")  # shard 0's (the only one, unsharded)
    for name, report in sorted(reports.items()):
        prefix = "replay_node." if name in shard_reports else ""
        for op, data in report.get("histograms", {}).items():
            recorder.histogram(prefix + op).merge(Histogram.from_dict(data))
        for counter, value in report.get("counters", {}).items():
            recorder.count(f"{name}.{counter}", value)
        roles[name] = {k: v for k, v in report.items() if k not in ("histograms", "curve")}
    actor_reports = [r for name, r in reports.items() if name.startswith("actor-")]
    for report in actor_reports:
        for point in report.get("curve", []):
            curve.points.append(point)
        for cause, n in report.get("dropped", {}).items():
            accounting.drop(cause, n)
    curve.points.sort(key=lambda p: (p["time_s"], p["step"]))
    # each node's own count, else the launcher's last poll of it
    counts = [report or state or {"stored": 0, "produced": 0} for report, state in zip(node_reports, last_states)]
    counted = {key: sum(count[key] for count in counts) for key in ("stored", "produced")}
    accounting.stored = counted["stored"]
    # Produced counts what actors reported: their own tallies where they reported, and for an actor
    # that died, what the node received from it; what a dead actor never sent is unknowable.
    reported_produced = sum(r["produced"] for r in actor_reports)
    reported_sent = sum(r["sent"] for r in actor_reports)
    accounting.produced = reported_produced + max(0, accounting.stored - reported_sent)
    unaccounted = accounting.produced - accounting.stored - sum(accounting.dropped.values())
    if unaccounted > 0:
        accounting.drop("sent by an actor, never stored by the replay node" if all_reported else
                        "acknowledged after the launcher's last status poll (the node's final count died with it)",
                        unaccounted)
    learner = reports.get("learner", {})  # learner 0's: every learner of a group makes the same updates
    learner_reports = [r for name, r in reports.items() if name == "learner" or name.startswith("learner-")]
    resumed = _resumed(list(shard_reports.values()))
    before = resumed["env_steps"] if resumed else 0  # a resumed run's own work starts at its checkpoint's step
    stats = LoopStats(env_steps=counted["produced"] - before, updates=learner.get("updates", 0),
                      samples=sum(r.get("samples", 0) for r in learner_reports))
    groups = [r["group"] for r in learner_reports if "group" in r]
    if groups:  # several learners: whether they stayed identical is measured, not assumed
        verdicts = [g["parameters_identical"] for g in groups]
        world = groups[0]["world"]
        # a learner that never reported (lost) had its last parameters compared by no one: not checked, unless
        # the others already saw a difference
        identical = False if False in verdicts else (True if len(groups) == world and all(verdicts) else None)
        checked_at = [g["last_checked_update"] for g in groups]
        stats.extra["learner_group"] = {
            "learners": world, "reported": len(groups), "backend": groups[0]["backend"],
            "parameters_identical": identical, "digest_every": groups[0]["digest_every"],
            "digests_compared": min(g["digests_compared"] for g in groups),
            "last_checked_update": min(checked_at) if identical is not None and None not in checked_at else None,
            "diverged_at_update": min((g["diverged_at_update"] for g in groups if g["diverged_at_update"] is not None),
                                      default=None),
            "allreduce_s": {r["role"]: r["group"]["allreduce_s"] + r["group"]["agreement_wait_s"] for r in learner_reports
                            if "group" in r},
            # what the collectives put on each learner's link, beside the replay traffic `links` holds
            "collective_bytes": {r["role"]: r["group"]["collective_bytes"] for r in learner_reports
                                 if "collective_bytes" in r.get("group", {})},
            "collective_bytes_basis": groups[0].get("collective_bytes_basis")}
    if node_report:
        shards = list(shard_reports.values())
        firsts = [r["first_insert_t"] for r in shards if r.get("first_insert_t") is not None]
        lasts = [r["last_insert_t"] for r in shards if r.get("last_insert_t") is not None]
        stats.first_step_t, stats.last_step_t = min(firsts, default=None), max(lasts, default=None)
        rates = [r["steady_env_steps_per_s"] for r in shards if r["steady_env_steps_per_s"] is not None]
        stats.extra["steady_env_steps_per_s"] = sum(rates) if rates else None
        limiters = [r["rate_limiter"] for r in shards]
        inserts, samples = sum(lim["inserts"] for lim in limiters), sum(lim["samples"] for lim in limiters)
        stats.extra["rate_limiter"] = {**node_report["rate_limiter"], "inserts": inserts, "samples": samples,
                                       "samples_per_insert_achieved": samples / inserts if inserts else 0.0}
        stats.extra["queue_depths"] = node_report["queue_depths"]
        stats.extra["replay_memory"] = node_report["memory"]
        if len(node_reports) > 1:  # --replay-shards: each shard's own figures
            stats.extra["replay_shards"] = {
                name: {"produced": r["produced"], "stored": r["stored"], "size": r["size"],
                       "steady_env_steps_per_s": r["steady_env_steps_per_s"], "rate_limiter": r["rate_limiter"],
                       "memory": r["memory"], "stored_by": r["stored_by"]} for name, r in shard_reports.items()}
    stats.extra["checkpoints"] = learner.get("checkpoints", [])
    if resumed:
        stats.extra["resumed_from"] = resumed
    if learner.get("checkpoint_failed"):
        failures.append(learner["checkpoint_failed"])
    stats.extra["roles"] = roles
    stats.extra["time_split"] = {name: r["time_split"] for name, r in reports.items() if "time_split" in r}
    stats.extra["weights_staleness"] = {name: r.get("staleness") for name, r in reports.items() if name.startswith("actor-")}
    stats.extra["links"] = {name: r.get("link") for name, r in reports.items()}
    stats.extra["weights"] = weights_traffic(reports, stats.updates)
    return DistributedOutcome(stats, recorder, accounting, curve, final_weights, weights_version, failures,
                              stop_reason, roles)


def weights_traffic(reports: dict[str, Any], updates: int) -> dict[str, Any]:
    """The policy's weights on the wire, per link and per learner update: the learner's PUBLISH_PARAMS
    to the replay node, each actor's PARAMS from it (a CNN's are 6.7 MB a message, so how often they
    move is a cost of the job, not a detail). Counted by each role's replay client in bytes of whole
    messages; this run's own (a resumed run's updates and messages since it resumed)."""
    links: dict[str, dict[str, Any]] = {}
    for name, report in sorted(reports.items()):
        traffic = report.get("weights")
        if not isinstance(traffic, dict):
            continue
        direction = "published" if traffic.get("published") else "fetched" if traffic.get("fetched") else None
        if direction is None:
            continue
        links[name] = {"direction": direction, "messages": traffic[direction], "bytes": traffic[f"{direction}_bytes"],
                       "bytes_per_update": traffic[f"{direction}_bytes"] / updates if updates else None}
    moved = {direction: sum(link["bytes"] for link in links.values() if link["direction"] == direction)
             for direction in ("published", "fetched")}
    moved["total"] = moved["published"] + moved["fetched"]
    count = {direction: sum(link["messages"] for link in links.values() if link["direction"] == direction)
             for direction in ("published", "fetched")}
    messages_moved = count["published"] + count["fetched"]
    return {"learner_updates": updates,
            "params_bytes": moved["total"] // messages_moved if messages_moved else None,  # one message's
            **count, "bytes": moved,
            "bytes_per_update": {direction: total / updates if updates else None for direction, total in moved.items()},
            "links": links}


# Launchers other than local, as lazy references (a cluster engine is imported only when chosen):
# each is called with (config, plan, transport) and runs its pre-flight before returning.
CLUSTER_LAUNCHERS = {"ray": "rlbench.runtime.launchers.ray:RayLauncher.prepare"}


def make_launcher(config: Any, plan: Any, transport: Any) -> Launcher:
    """The launcher `config.launcher` names."""
    if config.launcher == "local":
        from rlbench.runtime.launchers.local import LocalLauncher

        return LocalLauncher()
    return load_object(CLUSTER_LAUNCHERS[config.launcher])(config, plan, transport)
