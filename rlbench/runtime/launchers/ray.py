"""`--launcher ray`: a distributed run's roles on the nodes of a Ray cluster.

Ray is the control plane only: it places each role's process on a node (a Ray actor pinned there),
tells the launcher where it landed, reports liveness (a role's call returns its report, or fails when
its process or node is lost) and stops it. Transitions, batches and weights move over rlbench's
transports between the roles, never through Ray's object store. The per-run secret reaches a role
inside its RoleSpec, an argument of the actor call that starts it (never a command line, an
environment variable or a log line).

Before anything runs (`RayLauncher.prepare`): the cluster's alive nodes are read, each role is given
a node (`--place ROLE=NODE`, NODE an IP, a node id or its prefix, a host name, a custom resource or a
label KEY=VALUE; otherwise spread: the learner where a GPU is when its compute needs one, then the
replay node, then the actors, each on the least loaded node with CPUs left), impossible placements
are refused naming the node and what it lacks (CPUs, a GPU, a component its own probe says is
missing), and a transport that cannot link the hosts involved is refused (`validate.check_hosts`).
Each role's actor is started and answers where it is before any role starts.

Ray is imported here only, so `import rlbench`, `rlbench list` and local runs never load it.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import secrets
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from rlbench.cluster.ray import Node, alive_nodes, connect, import_ray, match_nodes, unknown_node
from rlbench.errors import InvalidCombinationError, RlbenchError
from rlbench.kit.framing import AddressError
from rlbench.machine_state import thread_environment
from rlbench.runtime.distributed.messages import role_name
from rlbench.runtime.distributed.roles import RoleSpec
from rlbench.runtime.launchers import (
    GRACE_S,
    POLL_S,
    ROLE_FUNCTIONS,
    START_TIMEOUT_S,
    RoleFailedError,
    RoleHandle,
    called,
    listen_address,
    one_line,
    run_role,
)
from rlbench.runtime.policies import policy_of

ROLE_CPUS = 1.0  # logical CPUs each role asks of its node
PLACE_TIMEOUT_S = 60.0  # for a role's actor to start on its node
STOP_CONFIRM_S = 10.0  # after ray.kill, how long to wait for each actor's process to be gone
LOST_EXIT = -int(signal.SIGKILL)  # a role whose process or node was lost has no exit code of its own


# ----------------------------------------------------------------------------------- placement
@dataclass
class Demand:
    """What a role asks of its node."""

    cpus: float = ROLE_CPUS
    gpus: float = 0.0
    needs_gpu_node: bool = False


def role_demands(config: Any, plan: Any) -> dict[str, Demand]:
    """The run's roles in start order, and what each needs: a CPU each; a learner a GPU when its
    compute runs on CUDA (actors then need a GPU node, sharing its device). The learners are the
    run's distribution policy's (learner, learner-1, ...)."""
    on_gpu = plan.compute.capabilities.device == "cuda"
    demands = {"replay": Demand(needs_gpu_node=plan.replay.capabilities.device == "cuda")}
    demands.update({role_name("learner", rank): Demand(gpus=1.0 if on_gpu else 0.0, needs_gpu_node=on_gpu)
                    for rank in range(policy_of(config).learners(config))})
    demands.update({role_name("actor", i): Demand(needs_gpu_node=on_gpu) for i in range(config.actors)})
    return demands


def plan_placement(config: Any, plan: Any, nodes: list[Node]) -> dict[str, Node]:
    """Each role's node, or InvalidCombinationError naming the node and what it lacks."""
    if not nodes:
        raise RlbenchError("the Ray cluster has no alive node")
    demands = role_demands(config, plan)
    wanted: dict[str, list[Node]] = {}
    for key, value in (config.place or {}).items():
        names = value if isinstance(value, (list, tuple)) else [value]
        # several roles share a key: actors (actor-i), and a policy's learners (learner, learner-i) go
        # round the listed nodes in order: one node packs them, several spread them
        roles = ([r for r in demands if r.startswith("actor-")] if key == "actors" else
                 [r for r in demands if r == "learner" or r.startswith("learner-")] if key == "learner" else [key])
        pools = []
        for name in names:
            pool = match_nodes(name, nodes)
            if not pool:
                raise unknown_node(f"--place {key}={name}", name, nodes)
            pools.append(pool)
        for i, role in enumerate(roles):
            wanted[role] = pools[i % len(pools)]
    # Roles placed by --place first (others then avoid their nodes' used CPUs), then GPU roles.
    order = sorted(demands, key=lambda r: (r not in wanted, not demands[r].gpus, r != "replay"))
    load: dict[str, int] = {n.node_id: 0 for n in nodes}
    cpus_left: dict[str, float] = {n.node_id: n.cpus for n in nodes}
    placement: dict[str, Node] = {}
    for role in order:
        demand = demands[role]
        pool = wanted.get(role, nodes)
        fit = [n for n in pool if n.gpus >= max(demand.gpus, 1.0 if demand.needs_gpu_node else 0.0)]
        if not fit:
            where = ", ".join(str(n) for n in pool)
            raise InvalidCombinationError(f"{role} needs a node with a GPU (compute {plan.compute.name} runs on CUDA) "
                                          f"and {where} has none" + ("" if role in wanted else
                                                                     "; add a GPU node or use --compute cpu"))
        chosen = min(fit, key=lambda n: (cpus_left[n.node_id] < demand.cpus, load[n.node_id], -cpus_left[n.node_id]))
        placement[role] = chosen
        load[chosen.node_id] += 1
        cpus_left[chosen.node_id] -= demand.cpus
    _check_capacity(placement, demands)
    return {role: placement[role] for role in demands}


def _check_capacity(placement: dict[str, Node], demands: dict[str, Demand]) -> None:
    by_node: dict[str, list[str]] = {}
    for role, node in placement.items():
        by_node.setdefault(node.node_id, []).append(role)
    nodes = {node.node_id: node for node in placement.values()}
    for node_id, roles in by_node.items():
        node = nodes[node_id]
        for resource, have, need in (("CPU", node.cpus, sum(demands[r].cpus for r in roles)),
                                     ("GPU", node.gpus, sum(demands[r].gpus for r in roles))):
            if need > have:
                raise InvalidCombinationError(
                    f"{node} has {have:g} {resource}s, but the roles placed there need {need:g} ({', '.join(roles)}, "
                    f"{ROLE_CPUS:g} CPU each{', the learner 1 GPU' if resource == 'GPU' else ''}): place some "
                    "elsewhere with --place, or add nodes")


# ----------------------------------------------------------------------------- in the role's process
class RoleProcess:
    """A role's Ray actor: says where it is, runs the role (`run`'s return value is its report), and
    tells the address the replay node announced. Threaded (two calls at once), so `announced`
    answers while `run` runs."""

    def __init__(self) -> None:
        self._address = ""
        self._listening = threading.Event()

    def where(self, components: list[tuple[str, str]], fingerprint: bool) -> dict[str, Any]:
        """This node: id, IP, host name, pid; each component's probe here; the machine fingerprint."""
        import ray

        from rlbench.plugins import get_registry

        registry = get_registry()
        probes = {}
        for kind, name in components:
            try:
                probe = registry.get(kind, name).probe()
                probes[f"{kind} {name}"] = [bool(probe.available), probe.reason]
            except RlbenchError as exc:  # not registered on this node (a plugin not installed there)
                probes[f"{kind} {name}"] = [False, one_line(exc)]
        facts = {"node_id": ray.get_runtime_context().get_node_id(), "ip": ray.util.get_node_ip_address(),
                 "hostname": platform.node(), "pid": os.getpid(), "probes": probes}
        if fingerprint:
            from rlbench.fingerprint import machine_fingerprint

            facts["fingerprint"] = machine_fingerprint()
        return facts

    def run(self, function: str, spec: RoleSpec) -> Any:
        return run_role(function, spec, self._announce)

    def _announce(self, address: str) -> None:
        self._address = address
        self._listening.set()

    def announced(self, timeout: float) -> str | None:
        """The replay node's listening address, once it listens (None until then)."""
        return self._address if self._listening.wait(timeout) else None


class RayRole:
    """A role's Ray actor seen as a process (what RoleHandle asks of one): is_alive, join, exitcode,
    kill. Its outcome is the run call's: a report, the role's error, or lost (process or node gone)."""

    def __init__(self, ray: Any, actor: Any, node: Node) -> None:
        self.ray = ray
        self.actor = actor
        self.node = node
        self.facts: dict[str, Any] = {}
        self.run_ref: Any = None
        self.outcome: tuple[str, Any] | None = None
        self.exitcode: int | None = None
        self.killed = False  # by the launcher, still running after the run ended

    def is_alive(self) -> bool:
        if self.outcome is not None:
            return False
        if self.run_ref is None:
            return True
        ready, _ = self.ray.wait([self.run_ref], timeout=0)
        if ready:
            self._settle()
        return not ready

    def _settle(self) -> None:
        exceptions = self.ray.exceptions
        try:
            self.outcome, self.exitcode = ("ok", self.ray.get(self.run_ref)), 0
        except exceptions.RayTaskError as exc:  # the role raised: its own error, not Ray's wrapping
            cause = getattr(exc, "cause", None) or exc
            self.outcome, self.exitcode = ("error", one_line(f"{type(cause).__name__}: {cause}")), 1
        except (exceptions.RayActorError, exceptions.WorkerCrashedError, exceptions.NodeDiedError) as exc:
            what = ("killed by the launcher: still running after the run ended" if self.killed else
                    f"its process or its {self.node} was lost (Ray: {type(exc).__name__})")
            self.outcome, self.exitcode = ("error", what), LOST_EXIT

    def join(self, timeout: float) -> None:
        if self.run_ref is not None and self.outcome is None:
            self.ray.wait([self.run_ref], timeout=timeout)
            self.is_alive()

    def kill(self, node_alive: bool = True) -> None:
        self.killed = node_alive and self.outcome is None and self.run_ref is not None
        try:
            self.ray.kill(self.actor, no_restart=True)
        except Exception:  # already gone with its node
            pass


# ---------------------------------------------------------------------------------- the launcher
@dataclass
class RayLauncher:
    """The Launcher protocol (rlbench.runtime.launchers) over Ray actors. Build it with `prepare`."""

    ray: Any
    config: Any
    transport: Any
    transport_name: str
    placement: dict[str, Node]
    roles: dict[str, RayRole]
    connected_here: bool
    driver: dict[str, str]
    started: float
    functions: dict[str, Callable[..., Any] | str] = field(default_factory=dict)
    handles: list[RoleHandle] = field(default_factory=list)
    ready_s: float | None = None  # from connecting until every role's process answered
    running_s: float | None = None  # ... until every role had been started
    run_tag: str = ""  # the run's role actors are named rlbench-<tag>-<role>

    @classmethod
    def prepare(cls, config: Any, plan: Any, transport: Any,
                functions: dict[str, Callable[..., Any] | str] | None = None) -> "RayLauncher":
        """Connect, place every role, refuse what cannot work, and start each role's actor (not the
        role): nothing of the run has started when this raises."""
        from rlbench.plugins import get_registry
        from rlbench.validate import check_hosts

        ray = import_ray()
        started = time.perf_counter()
        demands = role_demands(config, plan)
        connected_here = connect(ray, config.ray_address, len(demands))
        roles: dict[str, RayRole] = {}
        try:
            placement = plan_placement(config, plan, alive_nodes(ray))
            driver = {"node_id": ray.get_runtime_context().get_node_id(), "ip": ray.util.get_node_ip_address()}
            hosts = [node.ip for node in placement.values()] + [driver["ip"]]
            unreachable = ""
            if len(set(hosts)) > 1:
                try:
                    listen_address(transport, plan.transport.name, config.bind or placement["replay"].ip)
                except AddressError as exc:
                    unreachable = one_line(exc)
            check_hosts(plan, get_registry(), hosts, unreachable)
            run_tag = secrets.token_hex(4)
            for role, node in placement.items():
                roles[role] = _role_actor(ray, run_tag, role, node, demands[role])
            launcher = cls(ray, config, transport, plan.transport.name, placement, roles, connected_here, driver,
                           started, {**ROLE_FUNCTIONS, **(functions or {})}, run_tag=run_tag)
            launcher._locate(plan)
            return launcher
        except BaseException:
            for role in roles.values():
                role.kill()
            if connected_here:
                ray.shutdown()
            raise

    def _locate(self, plan: Any) -> None:
        """Every role's actor says where it is and probes the run's components there (one fingerprint
        per node); a node that lacks one is refused."""
        components = [(kind, c.name) for kind, c in plan.selected().items()]
        first_on_node: set[str] = set()
        refs = {}
        for name, role in self.roles.items():
            refs[name] = role.actor.where.remote(components, role.node.node_id not in first_on_node)
            first_on_node.add(role.node.node_id)
        deadline = time.monotonic() + PLACE_TIMEOUT_S
        for name, ref in refs.items():
            role = self.roles[name]
            try:
                role.facts = self.ray.get(ref, timeout=max(0.1, deadline - time.monotonic()))
            except self.ray.exceptions.GetTimeoutError:
                raise RlbenchError(f"{name} did not start on {role.node} within {PLACE_TIMEOUT_S:.0f} s: its "
                                   f"resources ({ROLE_CPUS:g} CPU) may be taken by other jobs") from None
            except self.ray.exceptions.RayError as exc:
                raise RlbenchError(f"{name} could not start on {role.node}: {one_line(exc)}") from None
            missing = [f"{what} ({reason})" if reason else what
                       for what, (available, reason) in role.facts["probes"].items() if not available]
            if missing:
                raise InvalidCombinationError(f"{role.node} lacks {'; '.join(missing)}, which {name} needs "
                                              "(each node probes its own plugins)")
        self.ready_s = time.perf_counter() - self.started

    # -- the Launcher protocol ---------------------------------------------------------------------
    def _replacement(self, name: str) -> RayRole:
        """An actor's next incarnation (--actor-restarts), not placed before the run: on the alive node
        with the most CPUs its running roles leave free (its old node may be gone)."""
        nodes = alive_nodes(self.ray)
        if not nodes:
            raise RoleFailedError(f"{name}: no alive node left to run it on")
        used: dict[str, float] = {}
        for role in self.roles.values():
            if role.outcome is None:
                used[role.node.node_id] = used.get(role.node.node_id, 0.0) + ROLE_CPUS
        node = max(nodes, key=lambda n: n.cpus - used.get(n.node_id, 0.0))
        role = self.roles[name] = _role_actor(self.ray, self.run_tag, name, node, Demand())
        self.placement[name] = node
        return role

    def start(self, spec: RoleSpec) -> RoleHandle:
        name = role_name(spec.role, spec.index)
        role = self.roles[name] if name in self.roles else self._replacement(name)
        if spec.role == "replay" and not spec.address:  # its node's routable address (or --bind)
            bound = listen_address(self.transport, self.transport_name, self.config.bind or role.node.ip)
            spec = dataclasses.replace(spec, address=bound or "")
        if spec.role == "learner" and spec.learners > 1 and spec.index == 0:  # its group's rendezvous, on its node
            spec = dataclasses.replace(spec, host=role.node.ip)
        function = self.functions[spec.role]
        reference = function if isinstance(function, str) else f"{function.__module__}:{function.__qualname__}"
        role.run_ref = role.actor.run.remote(reference, spec)
        handle = RoleHandle(spec.role, spec.index, role)
        self.handles.append(handle)
        if len(self.handles) == len(self.roles):
            self.running_s = time.perf_counter() - self.started
        return handle

    def wait_address(self, node: RoleHandle) -> str:
        role: RayRole = node.process
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                address = self.ray.get(role.actor.announced.remote(POLL_S), timeout=POLL_S + 30)
            except self.ray.exceptions.RayError:
                address = None
            if address:
                return reachable(address, role.node.ip)
            if not node.alive():
                raise RoleFailedError(f"{called(node)} exited before it listened: {self.failure_of(node)}")
        raise RoleFailedError(f"{called(node)} did not start listening within 2 minutes")

    def collect(self) -> dict[str, tuple[str, Any]]:
        outcomes = {}
        for handle in self.handles:
            role: RayRole = handle.process
            role.is_alive()
            if role.outcome is not None:
                outcomes[handle.name] = role.outcome
        return outcomes

    def wait(self, handles: list[RoleHandle], timeout: float) -> None:
        pending = [h.process.run_ref for h in handles if h.process.outcome is None and h.process.run_ref is not None]
        if pending:
            self.ray.wait(pending, num_returns=len(pending), timeout=timeout)
        else:
            time.sleep(min(timeout, POLL_S))
        for handle in handles:
            handle.process.is_alive()

    def failure_of(self, handle: RoleHandle) -> str:
        role: RayRole = handle.process
        role.is_alive()
        status, payload = role.outcome or ("", None)
        if status == "error":
            return one_line(payload)
        return f"exit code {role.exitcode}" + (" after it reported" if status == "ok" else "")

    def stop_all(self, grace: float = GRACE_S) -> None:
        """Roles still running after `grace` are killed; then every role's actor (a finished role's
        process lives on until its actor goes), and each is confirmed gone."""
        self.wait(self.handles, grace)
        alive = {node.node_id for node in alive_nodes(self.ray)}
        for role in self.roles.values():
            role.is_alive()
            role.kill(node_alive=role.node.node_id in alive)
        deadline = time.monotonic() + STOP_CONFIRM_S
        for role in self.roles.values():
            try:
                self.ray.get(role.actor.announced.remote(0), timeout=max(0.1, deadline - time.monotonic()))
            except self.ray.exceptions.RayActorError:
                continue  # gone, as it should be
            except Exception:
                continue  # unanswered until the deadline: Ray finishes the kill on its own

    def close(self) -> None:
        if self.connected_here:
            self.ray.shutdown()

    def describe(self) -> dict[str, Any]:
        nodes: dict[str, Any] = {}
        roles: dict[str, Any] = {}
        for name, role in self.roles.items():
            facts = role.facts
            node_id = facts.get("node_id", role.node.node_id)
            entry = nodes.setdefault(node_id, {"ip": role.node.ip, "hostname": facts.get("hostname", role.node.hostname),
                                               "resources": role.node.resources, "roles": []})
            entry["roles"].append(name)
            if "fingerprint" in facts:
                entry["fingerprint"] = facts["fingerprint"]
            roles[name] = {"host": role.node.ip, "node": node_id}
        return {"name": "ray", "ray_version": self.ray.__version__, "ray_address": self.config.ray_address,
                "started_ray": self.connected_here and self.config.ray_address is None,
                "driver": self.driver, "startup_s": self.running_s, "actors_ready_s": self.ready_s,
                "hosts": sorted({n["ip"] for n in nodes.values()}), "nodes": nodes, "roles": roles}


def _role_actor(ray: Any, run_tag: str, role: str, node: Node, demand: Demand) -> RayRole:
    """A role's Ray actor pinned to its node, its thread pools sized to its CPUs."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    actor_class = ray.remote(max_concurrency=2, max_restarts=0)(RoleProcess)
    actor = actor_class.options(name=f"rlbench-{run_tag}-{role}", num_cpus=demand.cpus, num_gpus=demand.gpus,
                                scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False),
                                runtime_env={"env_vars": thread_environment(demand.cpus)}).remote()
    return RayRole(ray, actor, node)


def reachable(address: str, node_ip: str) -> str:
    """An address peers can connect to: a wildcard host (--bind 0.0.0.0 or ::) becomes the node's IP."""
    scheme, sep, rest = address.partition("://")
    host, colon, port = rest.rpartition(":")
    if sep and colon and host.strip("[]") in ("0.0.0.0", "::", ""):
        shown = f"[{node_ip}]" if ":" in node_ip else node_ip
        return f"{scheme}://{shown}:{port}"
    return address
