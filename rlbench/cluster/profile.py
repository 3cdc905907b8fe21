"""`rlbench profile --ray-address`: the profile of every host of a Ray cluster, each measured on the
host itself by a Ray task pinned to one of its nodes, merged into one document for `rlbench plan`.

A host is known by its key (`profile.host_key`: its name and what it is), so Ray nodes sharing one
machine (several raylets, or namespaces of one host) are profiled once: each node first reports its
host key, then one node per host measures. Hosts are measured at the same time (each task uses only
its own host's cores); nodes of one host never are, which would make them measure each other. Ray is
imported by the caller, never by this module at import.
"""

from __future__ import annotations

import time
from typing import Any, Callable

PROBE_TIMEOUT_S = 120.0
PROFILE_TIMEOUT_S = 1800.0  # the default jobs take about a minute; a slow or loaded host, much more


def host_of_this_node() -> str:
    """Run on a node: the key its host's profile is filed under."""
    from rlbench.plan.profile import this_host_key

    return this_host_key()


def profile_this_node(jobs: list[Any], settings: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Run on a node: its host's profile (`profile.profile_host`), marked with the Ray node that measured it."""
    import ray

    from rlbench.plan.profile import profile_host

    key, entry = profile_host(jobs, **settings)
    entry["measured_on"] = {"launcher": "ray", "node_id": ray.get_runtime_context().get_node_id(),
                            "ray_version": ray.__version__}
    return key, entry


def chosen_nodes(names: tuple[str, ...], nodes: list[Any]) -> list[Any]:
    """The alive nodes `--nodes` names (each an id, IP, host name, resource or label), or all of them."""
    from rlbench.cluster.ray import match_nodes, unknown_node

    if not names:
        return nodes
    chosen: dict[str, Any] = {}
    for name in names:
        found = match_nodes(name, nodes)
        if not found:
            raise unknown_node(f"--nodes {name}", name, nodes)
        chosen.update((n.node_id, n) for n in found)
    return list(chosen.values())


def profile_cluster(ray: Any, jobs: list[Any], settings: dict[str, Any], *, node_names: tuple[str, ...] = (),
                    progress: Callable[[str], None] = lambda line: None) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """({host key: entry} for each host that was measured, [why each host that could not be, failed]).
    Each entry also lists the Ray nodes of its host (`ray_nodes`)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy as pinned

    from rlbench.cluster.ray import alive_nodes

    nodes = chosen_nodes(node_names, alive_nodes(ray))
    probe = ray.remote(num_cpus=0, max_retries=0)(host_of_this_node)
    probes = [probe.options(scheduling_strategy=pinned(n.node_id, soft=False)).remote() for n in nodes]
    hosts: dict[str, list[Any]] = {}
    failed: list[str] = []
    for node, ref in zip(nodes, probes):
        try:
            hosts.setdefault(ray.get(ref, timeout=PROBE_TIMEOUT_S), []).append(node)
        except (ray.exceptions.RayError, TimeoutError) as exc:
            failed.append(f"{node}: cannot run rlbench there ({str(exc).strip().splitlines()[0]})")
    measure = ray.remote(num_cpus=0, max_retries=0)(profile_this_node)
    started = time.perf_counter()
    running = {}
    for key, members in hosts.items():
        progress(f"host {key}: measuring on {members[0]}" + (f" (also its nodes {', '.join(str(n) for n in members[1:])})"
                                                             if members[1:] else ""))
        running[key] = measure.options(scheduling_strategy=pinned(members[0].node_id, soft=False)).remote(jobs, settings)
    measured: dict[str, dict[str, Any]] = {}
    for key, ref in running.items():
        try:
            got_key, entry = ray.get(ref, timeout=max(1.0, PROFILE_TIMEOUT_S - (time.perf_counter() - started)))
        except (ray.exceptions.RayError, TimeoutError) as exc:
            ray.cancel(ref, force=True)
            failed.append(f"host {key} (on {hosts[key][0]}): {str(exc).strip().splitlines()[0]}")
            continue
        entry["ray_nodes"] = [{"node_id": n.node_id, "ip": n.ip} for n in hosts[key]]
        measured[got_key] = entry
        progress(f"host {key}: measured in {entry['profiling_s']:.1f} s")
    return measured, failed
