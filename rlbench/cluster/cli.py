"""`rlbench ray nodes` and `rlbench bench launchers`. Only click is imported at module level (the CLI
imports this module to list its commands); Ray when a command runs."""

from __future__ import annotations

import json as json_module
import os
import threading
from typing import Any

import click

DEFAULT_BENCH_STEPS = 6000


def _connect(address: str | None) -> Any:
    from rlbench.errors import RlbenchError
    from rlbench.cluster.ray import connect, import_ray

    try:
        ray = import_ray()
        connect(ray, address, 1)
    except RlbenchError as exc:
        raise click.UsageError(str(exc)) from None
    return ray


def node_inventory() -> dict[str, Any]:
    """Run on a node: every registered component and whether it can run there (its own probe)."""
    import platform

    from rlbench.plugins import get_registry
    from rlbench.protocols import KINDS

    registry = get_registry()
    components: dict[str, Any] = {}
    for kind in KINDS:
        for component in registry.components(kind):
            probe = component.probe()
            components.setdefault(kind, {})[component.name] = {"available": bool(probe.available),
                                                               "reason": "" if probe.available else probe.reason,
                                                               "plugin": component.plugin}
    return {"hostname": platform.node(), "components": components}


def cluster_inventory(ray: Any) -> list[dict[str, Any]]:
    """Each alive node: id, IP, resources, labels, and its components as it probes them."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from rlbench.cluster.ray import alive_nodes

    nodes = alive_nodes(ray)
    probe = ray.remote(num_cpus=0, max_retries=0)(node_inventory)
    refs = [probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n.node_id, soft=False)).remote()
            for n in nodes]
    listing = []
    for node, ref in zip(nodes, refs):
        try:
            found = ray.get(ref, timeout=120)
        except ray.exceptions.RayError as exc:
            found = {"hostname": node.hostname, "components": {}, "error": str(exc).splitlines()[0]}
        listing.append({"node_id": node.node_id, "ip": node.ip, "resources": node.resources, "labels": node.labels,
                        **found})
    return listing


def format_nodes(listing: list[dict[str, Any]]) -> str:
    lines = []
    for node in listing:
        resources = node["resources"]
        custom = sorted(k for k in resources if k not in ("CPU", "GPU", "memory", "object_store_memory")
                        and not k.startswith("node:"))
        lines.append(f"node {node['ip']}  id {node['node_id'][:12]}  host {node.get('hostname') or '-'}  "
                     f"CPU {resources.get('CPU', 0):g}  GPU {resources.get('GPU', 0):g}  "
                     f"resources {','.join(custom) or '-'}" + (f"  labels {node['labels']}" if node["labels"] else ""))
        if node.get("error"):
            lines.append(f"    cannot probe: {node['error']}")
        for kind, components in node["components"].items():
            ready = [name for name, c in components.items() if c["available"]]
            missing = [f"{name} ({c['reason']})" for name, c in components.items() if not c["available"]]
            lines.append(f"    {kind:<12} {', '.join(ready) or '-'}" + (f"   unavailable: {'; '.join(missing)}" if missing else ""))
    return "\n".join(lines)


@click.group("ray")
def ray_group() -> None:
    """A Ray cluster as rlbench sees it (for --launcher ray)."""


@ray_group.command("nodes")
@click.option("--ray-address", default="auto", show_default=True, metavar="auto|HOST:PORT",
              help="the cluster to look at")
@click.option("--json", "as_json", is_flag=True, help="print the nodes as JSON")
def nodes_command(ray_address: str, as_json: bool) -> None:
    """Every alive node: IP, id, resources (the names --place takes), and which rlbench components
    are available there (each node probes its own plugins)."""
    ray = _connect(ray_address)
    listing = cluster_inventory(ray)
    click.echo(json_module.dumps(listing, indent=2) if as_json else format_nodes(listing))


# --------------------------------------------------------------------------------- bench launchers
def _job(steps: int, actors: int, transport: str, **launcher: Any) -> Any:
    from rlbench.config import RunConfig

    return RunConfig(placement="server", transport=transport, actors=actors, steps=steps, eval_episodes=1, seed=0,
                     **launcher)


def _actor_call_round_trip(ray: Any, sizes: tuple[int, ...], seconds: float) -> dict[int, float]:
    """p50 microseconds of ray.get(actor.echo.remote(payload)): a direct actor call, as an RLlib
    replay actor is called (the ray transport relays through an inbox, about two such calls)."""
    import time

    import numpy as np

    echo = ray.remote(num_cpus=0)(_Echo).remote()
    p50 = {}
    try:
        for size in sizes:
            payload = bytes(size)
            for _ in range(50):
                ray.get(echo.echo.remote(payload))
            samples = []
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                started = time.perf_counter_ns()
                ray.get(echo.echo.remote(payload))
                samples.append(time.perf_counter_ns() - started)
            p50[size] = float(np.percentile(samples, 50)) / 1e3
    finally:
        ray.kill(echo)
    return p50


class _Echo:
    def echo(self, payload: bytes) -> bytes:
        return payload


def benchmark_launchers(steps: int, actors: int, transport: str, ray_address: str | None) -> dict[str, Any]:
    """The same DQN job under the local launcher, then under Ray (started for the run unless an
    address is given), one thread per process; steady env steps/s, Ray's start-up."""
    from rlbench.kit.bench import pin_one_thread
    from rlbench.runner import run, stop_series_if_signalled

    pin_one_thread()
    os.environ["OMP_NUM_THREADS"] = "1"  # the role processes too (Ray's workers inherit it)
    results: dict[str, Any] = {"steps": steps, "actors": actors, "transport": transport, "launchers": {}}
    for name, extra in (("local", {}), ("ray", {"launcher": "ray", "ray_address": ray_address})):
        result = stop_series_if_signalled(run(_job(steps, actors, transport, **extra)))
        loop = result["loop"]
        results["launchers"][name] = {
            "status": result["status"], "reason": result["status_reason"],
            "steady_env_steps_per_s": loop.get("steady_env_steps_per_s"),
            "env_steps_per_s": result["throughput"]["env_steps_per_s"], "wall_s": result["timing"]["wall_s"],
            "startup_s": loop["launcher"].get("startup_s"), "ray_version": loop["launcher"].get("ray_version"),
            "hosts": loop["launcher"].get("hosts")}
    local, ray_run = results["launchers"]["local"], results["launchers"]["ray"]
    if local["steady_env_steps_per_s"] and ray_run["steady_env_steps_per_s"]:
        results["ray_vs_local"] = ray_run["steady_env_steps_per_s"] / local["steady_env_steps_per_s"]
    return results


def benchmark_actor_calls(ray_address: str | None, seconds: float) -> dict[int, float]:
    from rlbench.cluster.ray import connect, import_ray

    ray = import_ray()
    here = connect(ray, ray_address, 1)
    try:
        return _actor_call_round_trip(ray, (64, 4096), seconds)
    finally:
        if here:
            ray.shutdown()


def format_launchers(results: dict[str, Any]) -> str:
    header = f"{'launcher':<10}{'steady env steps/s':>20}{'env steps/s':>13}{'wall s':>9}{'start-up s':>12}  status"
    lines = [f"DQN CartPole-v1, placement server over {results['transport']}, {results['actors']} actors, "
             f"{results['steps']} steps, one thread per process", header, "-" * len(header)]
    for name, entry in results["launchers"].items():
        startup = "-" if entry["startup_s"] is None else f"{entry['startup_s']:.2f}"
        steady = entry["steady_env_steps_per_s"]
        lines.append(f"{name:<10}{steady or 0:>20,.0f}{entry['env_steps_per_s']:>13,.0f}{entry['wall_s']:>9.1f}"
                     f"{startup:>12}  {entry['status']}" + (f" ({entry['reason']})" if entry["reason"] else ""))
    if "ray_vs_local" in results:
        lines.append(f"ray / local steady env steps/s: {results['ray_vs_local']:.3f} (Ray {results['launchers']['ray']['ray_version']}; "
                     "start-up = connect, place and start every role's process until all roles run)")
    calls = results.get("actor_call_p50_us")
    if calls:
        lines.append("direct Ray actor call round trip, ray.get(actor.echo.remote(x)), p50: "
                     + ", ".join(f"{size} B {us:.0f} us" for size, us in calls.items())
                     + "  (compare the `ray` row of `rlbench bench transport`, which relays through an inbox actor)")
    return "\n".join(lines)


NETNS_TRANSPORTS = ("tcp", "udp", "dpdk", "ray")
NETNS_REQUESTS = 500
ACCESS_BATCH = 32  # CartPole transitions per INSERT and per SAMPLE (the DPDK paper's access pattern)
# The port each transport uses: across hosts a wire port on every namespace's eth0; on one host
# dpdk's one-host port (af_packet does not loop a host's own frames back to it). udp trusts the
# network path, accepted here: the links are this machine's own virtual ones, with nobody else on them.
NETNS_OPTIONS = {"dpdk": {"across": {"port": "af_packet:eth0"}, "one host": {"port": "memif"}},
                 "udp": {"across": {"trust_network": True}}}


class AccessNode:
    """A Ray actor serving the runtime's real replay node (prioritized memory, never rate-limited, as
    rlbench.kit.access does on one host) on this node's routable address."""

    def __init__(self) -> None:
        self.address = ""
        self.ready = threading.Event()

    def serve(self, transport: str, options: dict[str, Any], secret: bytes, across: bool) -> None:
        import ray

        from rlbench.plugins import get_registry
        from rlbench.runtime.launchers import listen_address
        from rlbench.runtime.distributed.rate_limiter import RateLimiter
        from rlbench.runtime.distributed.replay_node import NodeSettings, ReplayNode

        registry = get_registry()
        component = registry.get("transport", transport)
        created = component.create(**options)
        host = ray.util.get_node_ip_address() if across else None  # one host: the transport's own default (loopback)
        listener = created.listen(listen_address(created, transport, host) if host else None)
        memory = registry.get("replay", "prioritized").create(capacity=1 << 16, alpha=0.6, seed=0)
        settings = NodeSettings(placement="server", total_steps=1 << 62, batch_size=ACCESS_BATCH, secret=secret,
                                max_message_bytes=component.capabilities.max_message_bytes)
        node = ReplayNode(listener, memory, RateLimiter(1.0, min_size_to_sample=1, error_buffer=1e18), settings,
                          prioritized=True)
        self.address = listener.address
        self.ready.set()
        try:
            node.serve()
        finally:
            listener.close()

    def listening(self, timeout: float) -> str:
        return self.address if self.ready.wait(timeout) else ""


class AccessClient:
    """A Ray actor on the client's node holding one connection to the replay node, as the actor
    (INSERTs) or the learner (SAMPLEs). One connection per process: a DPDK wire port serves one link
    per process; both clients stay connected until both have measured."""

    def __init__(self, transport: str, options: dict[str, Any], address: str, secret: bytes, role: str) -> None:
        import numpy as np

        from rlbench.kit.bench import cartpole_batch
        from rlbench.plugins import get_registry
        from rlbench.runtime.distributed import messages
        from rlbench.runtime.distributed.channel import Channel
        from rlbench.runtime.distributed.replay_client import ReplayClient

        component = get_registry().get("transport", transport)
        self.channel = Channel(component.create(**options).connect(address, timeout=30), timeout=30,
                               reliable=component.capabilities.reliable)
        self.channel.authenticate(role, 0, messages.role_key(secret, role, 0))
        self.client = ReplayClient(self.channel)
        self.role = role
        self.rng = np.random.default_rng(0)
        self.batch = cartpole_batch(self.rng, ACCESS_BATCH)
        if role == "actor":
            for _ in range(32):  # enough items to sample from, in inserts of an actor's size
                self.client.add(cartpole_batch(self.rng, 128))

    def measure(self, requests: int) -> dict[str, float]:
        """INSERT (actor) or SAMPLE (learner) round trips of ACCESS_BATCH transitions: p50/p99 us."""
        import time

        import numpy as np

        client, batch = self.client, self.batch
        call = (lambda: client.add(batch)) if self.role == "actor" else (lambda: client.sample(ACCESS_BATCH, 0.4))
        times = []
        for i in range(requests + 20):
            started = time.perf_counter_ns()
            call()
            if i >= 20:  # warm-up
                times.append(time.perf_counter_ns() - started)
        array = np.asarray(times, dtype=np.float64) / 1e3
        return {"p50": float(np.percentile(array, 50)), "p99": float(np.percentile(array, 99))}

    def close(self) -> None:
        self.channel.close()


def _measure_access(ray: Any, transport: str, options: dict[str, Any], server_node: str, client_node: str,
                    requests: int) -> dict[str, Any]:
    """The replay node on `server_node`; on `client_node` an actor's INSERTs, then the learner's
    SAMPLEs, each client its own process."""
    import secrets

    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy as on

    secret = secrets.token_bytes(32)
    node = ray.remote(num_cpus=0, max_concurrency=2)(AccessNode).options(
        scheduling_strategy=on(server_node, soft=False)).remote()
    clients = []
    try:
        serving = node.serve.remote(transport, options, secret, server_node != client_node)
        address = ray.get(node.listening.remote(120), timeout=150)
        if not address:
            ray.get(serving, timeout=10)  # its error, if it failed
            raise RuntimeError("the replay node did not listen within 120 s")
        client_class = ray.remote(num_cpus=0)(AccessClient).options(scheduling_strategy=on(client_node, soft=False))
        for role in ("actor", "learner"):  # one after the other: the learner samples what the actor stored
            clients.append(client_class.remote(transport, options, address, secret, role))
            ray.get(clients[-1].__ray_ready__.remote(), timeout=120)
        measured = {op: ray.get(client.measure.remote(requests), timeout=600)
                    for op, client in zip(("INSERT", "SAMPLE"), clients)}
        ray.get([client.close.remote() for client in clients], timeout=60)
        return measured
    finally:
        for actor in (*clients, node):
            ray.kill(actor)


def benchmark_netns(transports: tuple[str, ...], requests: int) -> dict[str, Any]:
    """Replay INSERT and SAMPLE latency per transport between two hosts (network namespaces, Ray
    nodes on a bridge) beside the same between two processes of one host. The node and the client
    are placed by Ray; one cluster for all."""
    import subprocess
    import sys

    from rlbench.plugins import get_registry
    from rlbench.cluster.netns import namespace_cluster

    registry = get_registry()
    results: dict[str, Any] = {"requests": requests, "batch": ACCESS_BATCH, "transports": {}}
    with namespace_cluster(nodes=2) as cluster:
        env = {**os.environ, **cluster.env, "RAY_USAGE_STATS_ENABLED": "0"}
        script = ("import json, sys; from rlbench.cluster.cli import _netns_driver; "
                  "print(json.dumps(_netns_driver(sys.argv[1], sys.argv[2:])))")
        for transport in transports:
            probe = registry.get("transport", transport).probe()
            if not probe.available:
                results["transports"][transport] = {"available": False, "reason": probe.reason}
                continue
            done = subprocess.run(cluster.exec_args(0, sys.executable, "-c", script, cluster.address, transport,
                                                    *cluster.ips), capture_output=True, text=True, env=env,
                                  timeout=900, check=False)
            if done.returncode != 0:
                results["transports"][transport] = {"available": True,
                                                    "error": (done.stderr.strip().splitlines() or ["?"])[-1]}
                continue
            results["transports"][transport] = {"available": True, **json_module.loads(done.stdout.strip().splitlines()[-1])}
    return results


def _netns_driver(address: str, args: list[str]) -> dict[str, Any]:
    """In the head's namespace: the node on the second host; the client there too (one host) and on
    the head (across)."""
    transport, head_ip, other_ip = args
    ray = _connect(address)
    by_ip = {n["NodeManagerAddress"]: n["NodeID"] for n in ray.nodes() if n["Alive"]}
    measured = {}
    for layout, client_ip in (("across", head_ip), ("one host", other_ip)):
        options = NETNS_OPTIONS.get(transport, {}).get(layout, {})
        try:
            measured[layout] = {**_measure_access(ray, transport, options, by_ip[other_ip], by_ip[client_ip],
                                                  NETNS_REQUESTS), "options": options}
        except Exception as exc:  # one layout's failure is reported in its cell; the others still run
            cause = getattr(exc, "cause", None) or exc
            measured[layout] = {"error": f"{type(cause).__name__}: {cause}".splitlines()[0]}
    return measured


def format_netns(results: dict[str, Any]) -> str:
    header = f"{'transport':<10}{'layout':<10}{'options':<22}{'INSERT p50':>11}{'p99':>9}{'SAMPLE p50':>12}{'p99':>9}"
    lines = [f"replay INSERT / SAMPLE round trips (us) of {results['batch']} CartPole transitions, "
             f"{results['requests']} each; across = client and replay node on two hosts (network namespaces on a "
             "bridge, Ray nodes), one host = both on the same one", header, "-" * len(header)]
    for transport, entry in results["transports"].items():
        if not entry["available"]:
            lines.append(f"{transport:<10}unavailable: {entry['reason']}")
            continue
        if "error" in entry:
            lines.append(f"{transport:<10}failed: {entry['error']}")
            continue
        for layout in ("across", "one host"):
            cell = entry.get(layout, {})
            if "error" in cell:
                lines.append(f"{transport:<10}{layout:<10}failed: {cell['error']}")
                continue
            options = ",".join(f"{k}={v}" for k, v in cell["options"].items()) or "-"
            lines.append(f"{transport:<10}{layout:<10}{options:<22}{cell['INSERT']['p50']:>11.0f}"
                         f"{cell['INSERT']['p99']:>9.0f}{cell['SAMPLE']['p50']:>12.0f}{cell['SAMPLE']['p99']:>9.0f}")
    return "\n".join(lines)


@click.command("launchers")
@click.option("--steps", default=DEFAULT_BENCH_STEPS, show_default=True, type=click.IntRange(min=500),
              help="env steps of the job")
@click.option("--actors", default=2, show_default=True, type=click.IntRange(min=1))
@click.option("--transport", default="tcp", show_default=True)
@click.option("--ray-address", default=None, metavar="auto|HOST:PORT",
              help="the cluster for the Ray run [default: start Ray for it]")
@click.option("--netns", is_flag=True,
              help="instead: INSERT/SAMPLE latency per transport across a namespace cluster's links vs one host (root)")
@click.option("--netns-transport", "netns_transports", multiple=True, metavar="NAME",
              help=f"with --netns: a transport to measure (repeatable) [default: {', '.join(NETNS_TRANSPORTS)}]")
@click.option("--json", "as_json", is_flag=True, help="print the results as JSON")
def launchers_command(steps: int, actors: int, transport: str, ray_address: str | None, netns: bool,
                      netns_transports: tuple[str, ...], as_json: bool) -> None:
    """The same DQN job under the local and the Ray launcher on this host: steady env steps/s side by
    side, Ray's start-up, and a direct Ray actor call's round trip. With --netns: replay latency
    across the links of a Ray cluster of network namespaces, beside loopback, per transport."""
    from rlbench.errors import RlbenchError

    try:
        if netns:
            from rlbench.cluster.netns import namespaces_unavailable

            reason = namespaces_unavailable()
            if reason:
                raise RlbenchError(f"--netns: {reason}")
            results = benchmark_netns(netns_transports or NETNS_TRANSPORTS, NETNS_REQUESTS)
            click.echo(json_module.dumps(results, indent=2) if as_json else format_netns(results))
            return
        results = benchmark_launchers(steps, actors, transport, ray_address)
        results["actor_call_p50_us"] = benchmark_actor_calls(ray_address, 1.0)
    except RlbenchError as exc:
        raise click.UsageError(str(exc)) from None
    click.echo(json_module.dumps(results, indent=2) if as_json else format_launchers(results))
