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

With `--placement-strategy pack|spread|strict-pack|strict-spread` (`RoleGroup`) the roles are instead
bundles of one Ray placement group ({"CPU": 1} each, the learner's with its GPU), in start order
(replay, learners, actors), reserved at once with Ray's strategy of that name: a group the cluster
cannot hold is refused from its totals before it is created, and one not placed within
GROUP_TIMEOUT_S (CPUs taken by other jobs) is removed and refused naming each node's free CPUs. A
role named by `--place` (replay, learner; `--place actors` is refused with a strategy) keeps its
node: its bundle carries a label selector on that node's id. Each role's actor runs in its bundle; an
actor's replacement (--actor-restarts) goes into the dead actor's bundle; the group is removed when
the run ends, whatever ends it (and Ray removes it with the driver if the driver dies first).

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

from rlbench.cluster.ray import Node, alive_nodes, connect, import_ray, match_nodes, raylet_answers, unknown_node
from rlbench.config import component_kind
from rlbench.errors import InvalidCombinationError, RlbenchError
from rlbench.kit.framing import AddressError
from rlbench.machine_state import thread_environment
from rlbench.runtime import patience
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
PLACE_TIMEOUT_S = 60.0  # for a role's actor to start on its node (rlbench.runtime.patience scales it)
GROUP_TIMEOUT_S = 30.0  # for the run's placement group (--placement-strategy) to be reserved
RAY_STRATEGIES = {"pack": "PACK", "spread": "SPREAD", "strict-pack": "STRICT_PACK", "strict-spread": "STRICT_SPREAD"}
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
    run's distribution policy's (learner, learner-1, ...), the replay nodes its shards (replay, replay-1, ...)."""
    on_gpu = plan.compute.capabilities.device == "cuda"
    demands = {role_name("replay", shard): Demand(needs_gpu_node=plan.replay.capabilities.device == "cuda")
               for shard in range(config.replay_shards)}
    demands.update({role_name("learner", rank): Demand(gpus=1.0 if on_gpu else 0.0, needs_gpu_node=on_gpu)
                    for rank in range(policy_of(config).learners(config))})
    demands.update({role_name("actor", i): Demand(needs_gpu_node=on_gpu) for i in range(config.actors)})
    return demands


def roles_placed_by(key: str, demands: dict[str, Demand]) -> list[str]:
    """The roles `--place KEY=...` names: actors (actor-i), a policy's learners (learner, learner-i), the
    replay nodes (replay, replay-i: shards), or one."""
    return ([r for r in demands if r.startswith("actor-")] if key == "actors" else
            [r for r in demands if r == key or r.startswith(f"{key}-")] if key in ("learner", "replay") else [key])


def plan_placement(config: Any, plan: Any, nodes: list[Node], capacity: bool = True) -> dict[str, Node]:
    """Each role's node, or InvalidCombinationError naming the node and what it lacks (`capacity`:
    also each node's CPUs and GPUs against the roles put there; a placement group checks its own)."""
    if not nodes:
        raise RlbenchError("the Ray cluster has no alive node")
    demands = role_demands(config, plan)
    wanted: dict[str, list[Node]] = {}
    for key, value in (config.place or {}).items():
        names = value if isinstance(value, (list, tuple)) else [value]
        # several roles share a key: actors (actor-i), and a policy's learners (learner, learner-i) go
        # round the listed nodes in order: one node packs them, several spread them
        roles = roles_placed_by(key, demands)
        pools = []
        for name in names:
            pool = match_nodes(name, nodes)
            if not pool:
                raise unknown_node(f"--place {key}={name}", name, nodes)
            pools.append(pool)
        for i, role in enumerate(roles):
            wanted[role] = pools[i % len(pools)]
    # Roles placed by --place first (others then avoid their nodes' used CPUs), then GPU roles.
    order = sorted(demands, key=lambda r: (r not in wanted, not demands[r].gpus, not r.startswith("replay")))
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
    if capacity:
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


# ------------------------------------------------------------------- placement group (--placement-strategy)
def check_group(strategy: str, demands: dict[str, Demand], placement: dict[str, Node], pinned: list[str],
                nodes: list[Node]) -> None:
    """Refuse, from the cluster's totals, a placement group it can never hold (Ray would keep it
    pending): more CPUs or GPUs than the alive nodes have, roles --place pins beyond their node's
    CPUs, a strict-pack group no node holds, a strict-spread group with more bundles than nodes."""
    ray_strategy = RAY_STRATEGIES[strategy]
    cpus, gpus = sum(d.cpus for d in demands.values()), sum(d.gpus for d in demands.values())
    what = (f"the placement group ({ray_strategy}: {len(demands)} bundles, {ROLE_CPUS:g} CPU each for "
            f"{_listed(list(demands))}{', the learner 1 GPU' if gpus else ''})")
    have_cpus, have_gpus = sum(n.cpus for n in nodes), sum(n.gpus for n in nodes)
    if cpus > have_cpus:
        raise InvalidCombinationError(f"{what} needs {cpus:g} CPUs, but the cluster's {len(nodes)} alive node(s) "
                                      f"have {have_cpus:g}: run fewer --actors, or add nodes")
    if gpus > have_gpus:
        raise InvalidCombinationError(f"{what} needs {gpus:g} GPUs, but the cluster's {len(nodes)} alive node(s) "
                                      f"have {have_gpus:g}")
    _check_capacity({role: placement[role] for role in pinned}, demands)
    pinned_nodes = {placement[role].node_id for role in pinned}
    if strategy == "strict-pack":
        if len(pinned_nodes) > 1:
            raise InvalidCombinationError(f"{what} is on one node, but --place pins roles to {len(pinned_nodes)} nodes; "
                                          "use --placement-strategy pack")
        candidates = [n for n in nodes if not pinned_nodes or n.node_id in pinned_nodes]
        if not any(n.cpus >= cpus and n.gpus >= gpus for n in candidates):
            largest = max(candidates, key=lambda n: n.cpus)
            raise InvalidCombinationError(f"{what} needs one node with {cpus:g} CPUs{f' and {gpus:g} GPUs' if gpus else ''}, "
                                          f"and {'the one --place pins roles to' if pinned_nodes else 'the largest'}, "
                                          f"{largest}, has {largest.cpus:g}{f' and {largest.gpus:g} GPUs' if gpus else ''}: "
                                          "use --placement-strategy pack")
    if strategy == "strict-spread":
        usable = [n for n in nodes if n.cpus >= ROLE_CPUS]
        if len(demands) > len(usable):
            raise InvalidCombinationError(f"{what} needs {len(demands)} nodes, one per bundle, and the cluster has "
                                          f"{len(usable)} with a CPU: use --placement-strategy spread, or run fewer --actors")
        if len(pinned_nodes) < len(pinned):
            raise InvalidCombinationError(f"{what} puts each bundle on its own node, but --place pins "
                                          f"{_listed(pinned)} to {len(pinned_nodes)} node(s)")


def _listed(roles: list[str]) -> str:
    """replay, learner, actor-0..actor-7 (a run's many actors in one word)."""
    actors = [r for r in roles if r.startswith("actor-")]
    rest = [r for r in roles if not r.startswith("actor-")]
    if len(actors) > 2:
        rest.append(f"{actors[0]}..{actors[-1]}")
    else:
        rest += actors
    return ", ".join(rest)


class RoleGroup:
    """The run's roles as the bundles of one Ray placement group: bundle i is the i-th role in start
    order; a role pinned by --place (or an actor of a CUDA run, which needs a GPU node) carries a
    label selector on node ids. A replacement takes over its dead actor's bundle (RayLauncher._in_bundle)."""

    def __init__(self, ray: Any, strategy: str, name: str, demands: dict[str, Demand], selectors: dict[str, dict[str, str]]):
        from ray.util.placement_group import placement_group

        self.ray = ray
        self.strategy = strategy
        self.name = name
        self.bundles = [{"CPU": d.cpus, **({"GPU": d.gpus} if d.gpus else {})} for d in demands.values()]
        self.index: dict[str, int] = {role: i for i, role in enumerate(demands)}  # every role ever in a bundle
        self.selectors = [selectors.get(role, {}) for role in demands]
        self.landed: dict[int, Node] = {}  # where each bundle was reserved
        self.final: dict[int, str] = {}  # each bundle's node when the group was removed
        self.ready_s: float | None = None
        self.removed = False
        self.pg = placement_group(self.bundles, strategy=RAY_STRATEGIES[strategy], name=name,
                                  bundle_label_selector=self.selectors if any(self.selectors) else None)

    @classmethod
    def reserve(cls, ray: Any, config: Any, demands: dict[str, Demand], placement: dict[str, Node],
                nodes: list[Node], name: str) -> "RoleGroup":
        """Check, create and wait for the run's group; its roles' nodes are then `placement()`."""
        from ray.util.placement_group import NODE_ID_LABEL_KEY

        pinned = [role for key in (config.place or {}) for role in roles_placed_by(key, demands)]
        check_group(config.placement_strategy, demands, placement, pinned, nodes)
        gpu_nodes = sorted(n.node_id for n in nodes if n.gpus > 0)
        selectors = {role: {NODE_ID_LABEL_KEY: placement[role].node_id} for role in pinned}
        for role, demand in demands.items():  # a role that shares a GPU node's device without asking a GPU of it
            if role not in selectors and demand.needs_gpu_node and not demand.gpus:
                selectors[role] = {NODE_ID_LABEL_KEY: f"in({','.join(gpu_nodes)})"}
        started = time.perf_counter()
        group = cls(ray, config.placement_strategy, name, demands, selectors)
        try:
            if not group.pg.wait(GROUP_TIMEOUT_S):
                raise RlbenchError(group.unplaced(nodes))
            group.ready_s = time.perf_counter() - started
            by_id = {n.node_id: n for n in alive_nodes(ray)}
            for index, node_id in group.bundle_nodes().items():
                if node_id not in by_id:
                    raise RlbenchError(f"bundle {index} of {group.name} was reserved on node {node_id[:12]}, which is "
                                       "no longer alive")
                group.landed[index] = by_id[node_id]
        except BaseException:
            group.remove()
            raise
        return group

    def placement(self) -> dict[str, Node]:
        return {role: self.landed[index] for role, index in self.index.items()}

    def bundle_nodes(self) -> dict[int, str]:
        from ray.util.placement_group import placement_group_table

        table = placement_group_table(self.pg)
        return {int(index): node_id for index, node_id in (table.get("bundles_to_node_id") or {}).items() if node_id}

    def unplaced(self, nodes: list[Node]) -> str:
        """Why the group is still pending: the CPUs it needs against each node's free ones now."""
        cpus = sum(bundle["CPU"] for bundle in self.bundles)
        try:
            free = self.ray._private.state.state.available_resources_per_node()
        except Exception:  # a private API: without it, the cluster's totals
            free = {}
        per_node = "; ".join(f"{n}: {free.get(n.node_id, {}).get('CPU', 0.0):g} of {n.cpus:g} free" for n in nodes)
        total = self.ray.available_resources().get("CPU", 0.0)
        pinned = [f"bundle {i} on {s}" for i, s in enumerate(self.selectors) if s]
        return (f"the placement group {self.name} ({RAY_STRATEGIES[self.strategy]}: {len(self.bundles)} bundles, "
                f"{cpus:g} CPUs{'; pinned: ' + ', '.join(pinned) if pinned else ''}) was not placed within "
                f"{GROUP_TIMEOUT_S:.0f} s: {total:g} CPUs free in the cluster ({per_node or 'no alive node'}), "
                "other jobs hold the rest; nothing of the run was started")

    def free_bundle(self, roles: dict[str, "RayRole"], prefer: str | None) -> tuple[int, str] | None:
        """An actor's bundle whose latest holder has ended: `prefer`'s (the actor just reported dead)."""
        holder: dict[int, str] = {}
        for role, index in self.index.items():  # in order: a bundle's latest holder comes last
            holder[index] = role
        free = [(index, role) for index, role in holder.items()
                if role.startswith("actor-") and role in roles and not roles[role].is_alive()]
        return next((pair for pair in free if pair[1] == prefer), free[0] if free else None)

    def remove(self) -> None:
        """Remove the group (idempotent), noting where each bundle was last; Ray gone: nothing to do."""
        if self.removed:
            return
        from ray.util.placement_group import remove_placement_group

        try:
            self.final = self.bundle_nodes()
        except Exception:
            pass
        try:
            remove_placement_group(self.pg)
            self.removed = True
        except Exception:  # Ray already shut down: the group went with the driver
            pass

    def describe(self) -> dict[str, Any]:
        holders: dict[int, list[str]] = {}
        for role, index in self.index.items():
            holders.setdefault(index, []).append(role)
        bundles = []
        for index, resources in enumerate(self.bundles):
            node = self.landed.get(index)
            entry = {"index": index, "resources": resources, "roles": holders.get(index, []),
                     "node": node.node_id if node else None, "host": node.ip if node else None}
            if self.selectors[index]:
                entry["label_selector"] = self.selectors[index]
            if node is not None and self.final.get(index, node.node_id) != node.node_id:
                entry["rescheduled_to"] = self.final[index]  # its node was lost; Ray placed it again
            bundles.append(entry)
        return {"strategy": self.strategy, "ray_strategy": RAY_STRATEGIES[self.strategy], "name": self.name,
                "id": self.pg.id.hex(), "reserve_s": self.ready_s, "removed": self.removed,
                "nodes": len({b["node"] for b in bundles if b["node"]}), "bundles": bundles}


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


def replacement_node(nodes: list[Node], used: dict[str, float], named: set[str], dead: str | None) -> Node:
    """Where a replacement actor goes among `nodes` (alive; `used`: CPUs their running roles hold, by
    node id): a CPU free first (Ray would never start it on a full node), then a node `named` by
    --place for actors, then not the dead actor's node (its process may have died with a node Ray has
    not noticed yet), then the most CPUs free."""
    def free(node: Node) -> float:
        return node.cpus - used.get(node.node_id, 0.0)

    return max(nodes, key=lambda n: (free(n) >= ROLE_CPUS, n.node_id in named, n.node_id != dead, free(n)))


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
    group: RoleGroup | None = None  # --placement-strategy: the roles' placement group
    last_failed: str | None = None  # the role failure_of was last asked about (a replacement takes its bundle)

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
        group: RoleGroup | None = None
        run_tag = secrets.token_hex(4)
        try:
            nodes = alive_nodes(ray)
            placement = plan_placement(config, plan, nodes, capacity=not config.placement_strategy)
            if config.placement_strategy:  # reserved at once, before any role's actor starts
                group = RoleGroup.reserve(ray, config, demands, placement, nodes, f"rlbench-{run_tag}")
                placement = group.placement()
            driver = {"node_id": ray.get_runtime_context().get_node_id(), "ip": ray.util.get_node_ip_address()}
            hosts = [node.ip for node in placement.values()] + [driver["ip"]]
            unreachable = ""
            if len(set(hosts)) > 1:
                try:
                    listen_address(transport, plan.transport.name, config.bind or placement["replay"].ip)
                except AddressError as exc:
                    unreachable = one_line(exc)
            check_hosts(plan, get_registry(), hosts, unreachable)
            for role, node in placement.items():
                bundle = (group.pg, group.index[role]) if group is not None else None
                roles[role] = _role_actor(ray, run_tag, role, node, demands[role], bundle)
            launcher = cls(ray, config, transport, plan.transport.name, placement, roles, connected_here, driver,
                           started, {**ROLE_FUNCTIONS, **(functions or {})}, run_tag=run_tag, group=group)
            launcher._locate(plan)
            return launcher
        except BaseException:
            for role in roles.values():
                role.kill()
            if group is not None:
                group.remove()
            if connected_here:
                ray.shutdown()
            raise

    def _locate(self, plan: Any) -> None:
        """Every role's actor says where it is and probes the run's components there (one fingerprint
        per node); a node that lacks one is refused."""
        components = [(component_kind(kind), c.name) for kind, c in plan.selected().items()]
        first_on_node: set[str] = set()
        refs = {}
        for name, role in self.roles.items():
            refs[name] = role.actor.where.remote(components, role.node.node_id not in first_on_node)
            first_on_node.add(role.node.node_id)
        place_timeout = patience(PLACE_TIMEOUT_S)
        deadline = time.monotonic() + place_timeout
        for name, ref in refs.items():
            role = self.roles[name]
            try:
                role.facts = self.ray.get(ref, timeout=max(0.1, deadline - time.monotonic()))
            except self.ray.exceptions.GetTimeoutError:
                raise RlbenchError(f"{name} did not start on {role.node} within {place_timeout:.0f} s: its "
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
        """An actor's next incarnation (--actor-restarts), not placed before the run: on an alive node with
        a CPU its running roles leave free, one `--place actors=` (or the dead actor's own key) names where
        such a node has one, else the one with the most free; never the dead actor's node when its raylet
        no longer answers. In a placement group: in the bundle of the actor that died (Ray places a lost
        node's bundles again)."""
        if self.group is not None:
            return self._in_bundle(name)
        nodes = alive_nodes(self.ray)
        dead = self.roles[self.last_failed].node if self.last_failed in self.roles else None
        if dead is not None and not raylet_answers(dead):  # lost with its node, though Ray still lists it
            nodes = [n for n in nodes if n.node_id != dead.node_id]
        if not nodes:
            raise RoleFailedError(f"{name}: no alive node left to run it on")
        place = self.config.place or {}
        named = {node.node_id for key in ("actors", self.last_failed) if key in place
                 for value in (place[key] if isinstance(place[key], (list, tuple)) else [place[key]])
                 for node in match_nodes(value, nodes)}
        used: dict[str, float] = {}
        for role_name_, role in self.roles.items():
            if role.outcome is None and role_name_ != self.last_failed:
                used[role.node.node_id] = used.get(role.node.node_id, 0.0) + ROLE_CPUS
        node = replacement_node(nodes, used, named, dead.node_id if dead is not None else None)
        role = self.roles[name] = _role_actor(self.ray, self.run_tag, name, node, Demand())
        self.placement[name] = node
        return role

    def _in_bundle(self, name: str) -> RayRole:
        found = self.group.free_bundle(self.roles, self.last_failed)
        if found is None:
            raise RoleFailedError(f"{name}: no bundle of the placement group {self.group.name} is free")
        index, dead = found
        self.roles[dead].kill()  # a role that raised leaves its process, which holds the bundle's CPU
        by_id = {n.node_id: n for n in alive_nodes(self.ray)}
        node = by_id.get(self.group.bundle_nodes().get(index, ""), self.roles[dead].node)
        role = self.roles[name] = _role_actor(self.ray, self.run_tag, name, node, Demand(), (self.group.pg, index))
        self.group.index[name] = index
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
        start_timeout = patience(START_TIMEOUT_S)
        deadline = time.monotonic() + start_timeout
        while time.monotonic() < deadline:
            try:
                address = self.ray.get(role.actor.announced.remote(POLL_S), timeout=POLL_S + 30)
            except self.ray.exceptions.RayError:
                address = None
            if address:
                return reachable(address, role.node.ip)
            if not node.alive():
                raise RoleFailedError(f"{called(node)} exited before it listened: {self.failure_of(node)}")
        raise RoleFailedError(f"{called(node)} did not start listening within {start_timeout:.0f} s")

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
        self.last_failed = handle.name
        role: RayRole = handle.process
        role.is_alive()
        status, payload = role.outcome or ("", None)
        if status == "error":
            return one_line(payload)
        return f"exit code {role.exitcode}" + (" after it reported" if status == "ok" else "")

    def stop_all(self, grace: float = GRACE_S) -> None:
        """Roles still running after `grace` are killed; then every role's actor (a finished role's
        process lives on until its actor goes), and each is confirmed gone; then the placement group is
        removed, however this ends (a second Ctrl-C included)."""
        try:
            self._stop_roles(grace)
        finally:
            if self.group is not None:
                self.group.remove()
                self._replacements_where_their_bundles_were()

    def _replacements_where_their_bundles_were(self) -> None:
        """A replacement started in a bundle whose node was lost ran where Ray placed that bundle again."""
        moved = {name: self.group.final[index] for name, index in self.group.index.items()
                 if name in self.roles and not self.roles[name].facts and index in self.group.final
                 and self.group.final[index] != self.roles[name].node.node_id}
        if moved:
            try:
                by_id = {n.node_id: n for n in alive_nodes(self.ray)}
            except Exception:
                return
            for name, node_id in moved.items():
                if node_id in by_id:
                    self.roles[name].node = self.placement[name] = by_id[node_id]

    def _stop_roles(self, grace: float) -> None:
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
        if self.group is not None:
            self.group.remove()  # already, by stop_all
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
            if self.group is not None:
                roles[name]["bundle"] = self.group.index.get(name)
        described = {"name": "ray", "ray_version": self.ray.__version__, "ray_address": self.config.ray_address,
                     "started_ray": self.connected_here and self.config.ray_address is None,
                     "driver": self.driver, "startup_s": self.running_s, "actors_ready_s": self.ready_s,
                     "hosts": sorted({n["ip"] for n in nodes.values()}), "nodes": nodes, "roles": roles}
        if self.group is not None:
            described["placement_group"] = self.group.describe()
        return described


def _role_actor(ray: Any, run_tag: str, role: str, node: Node, demand: Demand,
                bundle: tuple[Any, int] | None = None) -> RayRole:
    """A role's Ray actor pinned to its node, or in its bundle of the run's placement group (which
    holds its node), its thread pools sized to its CPUs."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

    strategy = (PlacementGroupSchedulingStrategy(bundle[0], placement_group_bundle_index=bundle[1]) if bundle else
                NodeAffinitySchedulingStrategy(node.node_id, soft=False))
    actor_class = ray.remote(max_concurrency=2, max_restarts=0)(RoleProcess)
    actor = actor_class.options(name=f"rlbench-{run_tag}-{role}", num_cpus=demand.cpus, num_gpus=demand.gpus,
                                scheduling_strategy=strategy,
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
