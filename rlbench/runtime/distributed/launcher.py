"""Start the roles of a distributed run, watch them, stop them, and merge what they measured.

`LocalLauncher` runs each role as a spawned process on this machine. A launcher only needs
`start(function, spec)` and handles that report liveness and a result; a cluster-engine launcher
(Ray) implements the same two things. Roles never share objects with the launcher: they get a
RoleSpec of plain data and find each other through the replay node's address.
"""

from __future__ import annotations

import ctypes
import dataclasses
import multiprocessing
import platform
import queue
import secrets
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import numpy as np

from rlbench.metrics import Histogram, Recorder
from rlbench.registry import load_object
from rlbench.runtime.context import Accounting, Budget, LearningCurve, LoopStats
from rlbench.runtime.distributed import messages, roles
from rlbench.runtime.distributed.channel import Channel
from rlbench.runtime.distributed.messages import Op
from rlbench.runtime.distributed.roles import NODE_LOST, REQUEST_TIMEOUT_S, RoleSpec
from rlbench.runtime.policies import policy_of

ROLE_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "replay": roles.replay_node_main,
    "learner": roles.learner_main,
    "actor": roles.actor_main,
}
POLL_S = 0.25
GRACE_S = 10.0  # after the run ended, how long roles get to flush, report and leave before they are killed
START_TIMEOUT_S = 120.0
ROLE_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # the launcher stops roles, in order


def role_process_name(role: str, index: int) -> str:
    """The name a role process shows in /proc/PID/comm, ps and top (15 characters at most)."""
    return f"rlb-{roles.role_name(role, index)}"


def _linux_process_setup(name: str) -> None:
    """Name the process for ps/top, and have the kernel kill it if the launcher dies, so no role
    is ever orphaned (PR_SET_PDEATHSIG; SIGKILL, since roles leave the polite signals to the launcher)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def run_role(function: Callable[..., Any] | str, spec: RoleSpec, announce: Callable[[str], None]) -> Any:
    """What every launcher does in a role's process: signals left to the launcher (a scheduler's
    SIGTERM to the process group, or Ctrl-C, reaches the launcher, which stops roles in order), the
    process named, then the role. A cluster engine may run the role off the main thread (a Ray
    actor's); its processes are not in the launcher's process group, so they keep their handlers."""
    if threading.current_thread() is threading.main_thread():
        for signum in ROLE_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)
    _linux_process_setup(role_process_name(spec.role, spec.index))
    target = load_object(function) if isinstance(function, str) else function
    return target(spec, announce=announce)


def _role_entry(function: Callable[..., Any] | str, spec: RoleSpec, results: Any, announcements: Any) -> None:
    try:
        report = run_role(function, spec, announcements.put)
    except BaseException as exc:
        results.put((spec.role, spec.index, "error", one_line(f"{type(exc).__name__}: {exc}")))
        raise SystemExit(1) from None
    results.put((spec.role, spec.index, "ok", report))


def called(handle: RoleHandle) -> str:
    """A role as a sentence names it: the replay node, learner-1."""
    return "the replay node" if handle.role == "replay" else handle.name


def listen_address(transport: Any, name: str, host: str) -> str | None:
    """Where a server role listens so that peers reach it at `host` (an IP or host name, `--bind` or
    its node's routable address). The rule for every transport: its own `listen_address(host)` when it
    defines one (returning None for "my default listener": e.g. dpdk's wire ports, placed by the
    --dpdk-port interface; raising AddressError when, as configured, it cannot be reached from another
    host); otherwise NAME://HOST:0 (any free port) for a transport that crosses hosts, whose addresses
    are HOST:PORT; otherwise None: a one-host transport listens where it always does."""
    own = getattr(transport, "listen_address", None)
    if own is not None:
        return own(host)
    if not transport.capabilities.crosses_hosts:
        return None
    return f"{name}://{f'[{host}]' if ':' in host else host}:0"


def one_line(text: str, limit: int = 300) -> str:
    """A reason for a human: one line, bounded."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[:limit - 3] + "..."


class RoleFailedError(RuntimeError):
    """A started role failed before the run could go on: the run stops (exit 1, its result says
    why). Not an RlbenchError: those are refusals before anything starts (exit 2)."""


@dataclass
class RoleHandle:
    role: str
    index: int
    process: Any

    @property
    def name(self) -> str:
        return roles.role_name(self.role, self.index)

    def alive(self) -> bool:
        return self.process.is_alive()

    def join(self, timeout: float) -> None:
        self.process.join(timeout=timeout)

    @property
    def exitcode(self) -> int | None:
        return self.process.exitcode


class Launcher(Protocol):
    """What a distributed run needs from whatever starts its roles. `LocalLauncher` spawns local
    processes; a cluster-engine launcher (Ray actors) implements the same calls."""

    handles: list[RoleHandle]  # every role started, for liveness and joins

    def start(self, spec: RoleSpec) -> RoleHandle: ...

    def wait_address(self, node: RoleHandle) -> str: ...

    def collect(self) -> dict[str, tuple[str, Any]]: ...

    def wait(self, handles: list[RoleHandle], timeout: float) -> None: ...

    def failure_of(self, handle: RoleHandle) -> str: ...

    def stop_all(self, grace: float = GRACE_S) -> None: ...

    def close(self) -> None: ...

    def describe(self) -> dict[str, Any]:
        """For the result: the launcher, and where each role ran ({"roles": {name: {"host": ...}}})."""
        ...


class LocalLauncher:
    """Each role a spawned process on this machine."""

    def __init__(self, functions: dict[str, Callable[..., Any] | str] | None = None) -> None:
        self.functions = {**ROLE_FUNCTIONS, **(functions or {})}  # role -> function (or "module:function")
        self.context = multiprocessing.get_context("spawn")  # never fork: DPDK/CUDA/torch state must not be copied
        self.results = self.context.Queue()
        self.announcements = self.context.Queue()
        self.handles: list[RoleHandle] = []
        self.outcomes: dict[str, tuple[str, Any]] = {}

    def start(self, spec: RoleSpec) -> RoleHandle:
        process = self.context.Process(target=_role_entry, name=f"rlbench-{spec.role}-{spec.index}", daemon=True,
                                       args=(self.functions[spec.role], spec, self.results, self.announcements))
        process.start()
        handle = RoleHandle(spec.role, spec.index, process)
        self.handles.append(handle)
        return handle

    def wait_address(self, node: RoleHandle) -> str:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                return self.announcements.get(timeout=POLL_S)
            except queue.Empty:
                if not node.alive():
                    raise RoleFailedError(f"{called(node)} exited before it listened: {self.failure_of(node)}")
        raise RoleFailedError(f"{called(node)} did not start listening within 2 minutes")

    def _drain(self, timeout: float) -> None:
        """Read finished roles' outcomes. Roles block on a large report until it is read, so the
        launcher reads while it waits for them (joining without reading deadlocks, and terminating a
        role mid-write would leave half a message in the pipe)."""
        try:
            role, index, status, payload = self.results.get(timeout=timeout)
        except queue.Empty:
            return
        self.outcomes[roles.role_name(role, index)] = (status, payload)

    def collect(self) -> dict[str, tuple[str, Any]]:
        self._drain(timeout=0.05)
        while not self.results.empty():
            self._drain(timeout=0.05)
        return dict(self.outcomes)

    def wait(self, handles: list[RoleHandle], timeout: float) -> None:
        """Until these roles have exited or the timeout passes, reading outcomes meanwhile."""
        deadline = time.monotonic() + timeout
        while any(h.alive() for h in handles) and time.monotonic() < deadline:
            self._drain(timeout=0.05)

    def failure_of(self, handle: RoleHandle) -> str:
        """One line: the role's error, or how its process ended."""
        status, payload = self.collect().get(handle.name, ("", None))
        if status == "error":
            return one_line(payload)
        return f"exit code {handle.exitcode}" + (" after it reported" if status == "ok" else "")

    def describe(self) -> dict[str, Any]:
        return {"name": "local", "roles": {h.name: {"host": platform.node()} for h in self.handles}}

    def close(self) -> None:
        """Release the queues' pipes and semaphores (after `collect`)."""
        for channel in (self.results, self.announcements):
            channel.close()
            channel.join_thread()

    def stop_all(self, grace: float = GRACE_S) -> None:
        """Roles still running after `grace` are killed (they ignore the polite signals: stopping
        them in order is the launcher's job, done before this)."""
        self.wait(self.handles, grace)
        for handle in self.handles:
            if handle.alive():
                handle.process.kill()
                handle.process.join(timeout=5)


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
    base = RoleSpec(role="", config=dataclasses.asdict(config), total_steps=budget.total_steps, options=plan.options)
    base.config["replay"] = plan.replay.name

    def role(name: str, address: str, index: int = 0, **group: Any) -> RoleSpec:
        return dataclasses.replace(base, role=name, address=address, index=index,
                                   secret=messages.role_key(secret, name, index), **group)

    n_learners = policy_of(config).learners(config)

    transport = plan.transport.create(**plan.options.get("transport", {}))
    launcher = launcher or make_launcher(config, plan, transport)  # a cluster's pre-flight refuses here
    started, first_progress = time.perf_counter(), None
    failures: list[str] = []
    stop_reason = ""
    final_weights, weights_version, node_report, last_state = None, -1, None, None
    control = None
    try:
        bound = listen_address(transport, plan.transport.name, config.bind) if config.bind else None
        node = launcher.start(dataclasses.replace(base, role="replay", address=bound or "", secret=secret,
                                                  layout=run_layout(config, plan)))
        address = launcher.wait_address(node)
        learners = [launcher.start(role("learner", address, 0, learners=n_learners))]
        if n_learners > 1:  # learner 0 announces its group's rendezvous; the others join it there
            rendezvous = launcher.wait_address(learners[0])
            learners += [launcher.start(role("learner", address, rank, learners=n_learners, rendezvous=rendezvous))
                         for rank in range(1, n_learners)]
        actors = [launcher.start(role("actor", address, i)) for i in range(config.actors)]
        control = Channel(transport.connect(address, timeout=REQUEST_TIMEOUT_S),
                          reliable=plan.transport.capabilities.reliable, timeout=REQUEST_TIMEOUT_S)
        control.authenticate("launcher", 0, messages.role_key(secret, "launcher", 0))
        reported_dead: set[str] = set()
        while True:
            launcher.wait(launcher.handles, POLL_S)  # reads role outcomes while it waits
            if budget.interrupted:
                stop_reason = budget.interrupted
                break
            if not node.alive():
                stop_reason = f"the replay node died ({launcher.failure_of(node)})"
                break
            try:
                last_state = messages.state_of(control.request(Op.STATUS)[1])
            except NODE_LOST as exc:
                stop_reason = _lost_node(launcher, node, exc)
                break
            budget.progress(last_state["produced"])
            if first_progress is None and last_state["produced"]:
                first_progress = time.perf_counter() - started  # start-up, on this host's clock (within a poll)
            if last_state["finished"]:
                break
            stopped = next((learner for learner in learners if not learner.alive()), None)
            if stopped is not None:  # before the run is over: nothing would sample, the actors would stall
                stop_reason = (f"{stopped.name} died ({launcher.failure_of(stopped)})" if stopped.exitcode != 0
                               else f"{stopped.name} stopped before the run was over (exit code 0)")
                break
            for actor in actors:
                if not actor.alive() and actor.exitcode != 0 and actor.name not in reported_dead:
                    reported_dead.add(actor.name)
                    failures.append(f"{actor.name} died ({launcher.failure_of(actor)})")
                    if config.on_actor_failure == "stop":
                        stop_reason = f"{actor.name} died and --on-actor-failure is stop"
            if stop_reason:
                break
            if len(reported_dead) == len(actors):
                stop_reason = "every actor died"
                break
        if node.alive():
            try:
                if stop_reason:
                    control.request(Op.FINISH, {"reason": messages.text(one_line(stop_reason))})
                launcher.wait([h for h in launcher.handles if h.role != "replay"], GRACE_S)
                op, arrays = control.request(Op.FETCH_PARAMS, {"have_version": np.int64(-1)})
                if op == Op.PARAMS:
                    weights_version, final_weights = messages.read_weights(arrays)
                node_report = messages.read_json(control.request(Op.STATS)[1]["json"])
                control.request(Op.SHUTDOWN)
            except NODE_LOST as exc:
                stop_reason = stop_reason or _lost_node(launcher, node, exc)
    except RoleFailedError as exc:
        stop_reason = one_line(exc)
    finally:
        if control is not None:
            control.close()
        launcher.stop_all()
    outcomes = launcher.collect()
    where = launcher.describe()
    launcher.close()
    if node_report is None and outcomes.get("replay", ("", None))[0] == "ok":
        node_report = outcomes["replay"][1]
    for name, (status, payload) in outcomes.items():
        if status == "error" and not any(f.startswith(name) for f in failures):
            failures.append(f"{name} failed: {one_line(payload)}")
    outcome = _merge(outcomes, node_report, last_state, final_weights, weights_version, failures, stop_reason)
    outcome.stats.startup_s = first_progress
    _record_where(outcome, where)
    return outcome


def run_layout(config: Any, plan: Any) -> messages.Layout:
    """The transitions this run's actors produce, from its environment's spec (one environment built
    here, as the launcher's pre-flight does): the replay node refuses any other layout."""
    env = plan.environment.create(num_envs=1, seed=config.seed, **plan.options.get("environment", {}))
    try:
        return messages.transition_layout(env.spec)
    finally:
        env.close()


# Launchers other than local, as lazy references (a cluster engine is imported only when chosen):
# each is called with (config, plan, transport) and runs its pre-flight before returning.
CLUSTER_LAUNCHERS = {"ray": "rlbench.runtime.distributed.ray_launcher:RayLauncher.prepare"}


def make_launcher(config: Any, plan: Any, transport: Any) -> Launcher:
    """The launcher `config.launcher` names."""
    if config.launcher == "local":
        return LocalLauncher()
    return load_object(CLUSTER_LAUNCHERS[config.launcher])(config, plan, transport)


def _record_where(outcome: DistributedOutcome, where: dict[str, Any]) -> None:
    """Each role's host (and node, on a cluster) in its role entry; the launcher's own facts beside."""
    for name, place in where.get("roles", {}).items():
        if name in outcome.roles:
            outcome.roles[name].update(place)
        else:  # started, but it never reported (its node was lost): where it was is still known
            outcome.roles[name] = dict(place, reported=False)
    outcome.stats.extra["launcher"] = {k: v for k, v in where.items() if k != "roles"}


def _lost_node(launcher: Launcher, node: RoleHandle, exc: Exception) -> str:
    node.join(2)
    return (f"lost the replay node ({one_line(exc)})" if node.alive()
            else f"the replay node died ({launcher.failure_of(node)})")


def _merge(outcomes: dict[str, tuple[str, Any]], node_report: dict[str, Any] | None,
           last_state: dict[str, Any] | None, final_weights: list[np.ndarray] | None, weights_version: int,
           failures: list[str], stop_reason: str) -> DistributedOutcome:
    recorder = Recorder()
    accounting = Accounting()
    curve = LearningCurve()
    roles: dict[str, Any] = {}
    # What each role reported to the launcher; where that is missing, what it told the node in its BYE.
    reports = dict((node_report or {}).get("reports", {}))
    reports.update({name: payload for name, (status, payload) in outcomes.items() if status == "ok"})
    if node_report is not None:
        reports["replay"] = {k: v for k, v in node_report.items() if k != "reports"}
    for name, report in sorted(reports.items()):
        prefix = "replay_node." if name == "replay" else ""
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
    counted = node_report or last_state or {"stored": 0, "produced": 0}  # the node's own count, else the last poll
    accounting.stored = counted["stored"]
    # Produced counts what actors reported: their own tallies where they reported, and for an actor
    # that died, what the node received from it; what a dead actor never sent is unknowable.
    reported_produced = sum(r["produced"] for r in actor_reports)
    reported_sent = sum(r["sent"] for r in actor_reports)
    accounting.produced = reported_produced + max(0, accounting.stored - reported_sent)
    unaccounted = accounting.produced - accounting.stored - sum(accounting.dropped.values())
    if unaccounted > 0:
        accounting.drop("sent by an actor, never stored by the replay node" if node_report is not None else
                        "acknowledged after the launcher's last status poll (the node's final count died with it)",
                        unaccounted)
    learner = reports.get("learner", {})  # learner 0's: every learner of a group makes the same updates
    learner_reports = [r for name, r in reports.items() if name == "learner" or name.startswith("learner-")]
    stats = LoopStats(env_steps=counted["produced"], updates=learner.get("updates", 0),
                      samples=sum(r.get("samples", 0) for r in learner_reports))
    groups = [r["group"] for r in learner_reports if "group" in r]
    if groups:  # several learners: whether they stayed identical is measured, not assumed
        stats.extra["learner_group"] = {
            "learners": len(groups), "backend": groups[0]["backend"],
            "parameters_identical": all(g["parameters_identical"] for g in groups),
            "max_parameter_spread": max(g["max_parameter_spread"] for g in groups),
            "checked_updates": min(g["checked_updates"] for g in groups),
            "allreduce_s": {r["role"]: r["group"]["allreduce_s"] + r["group"]["agreement_wait_s"] for r in learner_reports
                            if "group" in r}}
    if node_report:
        stats.first_step_t, stats.last_step_t = node_report.get("first_insert_t"), node_report.get("last_insert_t")
        stats.extra["steady_env_steps_per_s"] = node_report["steady_env_steps_per_s"]
        stats.extra["rate_limiter"] = node_report["rate_limiter"]
        stats.extra["queue_depths"] = node_report["queue_depths"]
        stats.extra["replay_memory"] = node_report["memory"]
    stats.extra["roles"] = roles
    stats.extra["time_split"] = {name: r["time_split"] for name, r in reports.items() if "time_split" in r}
    stats.extra["weights_staleness"] = {name: r.get("staleness") for name, r in reports.items() if name.startswith("actor-")}
    stats.extra["links"] = {name: r.get("link") for name, r in reports.items()}
    return DistributedOutcome(stats, recorder, accounting, curve, final_weights, weights_version, failures,
                              stop_reason, roles)
