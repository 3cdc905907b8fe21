"""`rlbench bench weights`: what publishing weights costs on the wire (issue #24).

The same distributed DQN CartPole-v1 job (placement server, 2 actors) twice: the learner publishing
its policy after every update (publish_every=1, the old default) and at the algorithm's default
(every 50 updates). Per run, from the result: the learner's link bytes sent and bytes per update,
and each actor's bytes received; then the ratio of bytes per update, new / old, beside the issue's
target (<= 5 %). The learner's bytes split into the weights message and everything else per update
(SAMPLE requests, priority updates), derived from the two runs: bytes = a x updates + W x publishes.

By default (root) the runs go across three hosts, network namespaces with a Ray node each
(rlbench/cluster/netns.py): the replay node on host a (with the driver), the learner alone on b, both
actors on c, so the veth counters of each host are an independent check of the bytes (they add TCP/IP
headers, ACKs and Ray's own control traffic, whose idle rate is measured first). `--local` runs the
same job on this host (the local launcher, loopback: no veth counters).

All figures are measured. Only click is imported at module level.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

import click

TARGET_RATIO = 0.05  # issue #24: learner bytes per update <= 5 % of publish_every=1's
DEFAULT_STEPS = 30_000
IDLE_SECONDS = 5.0  # the namespace cluster's idle veth traffic (Ray's control plane) is measured this long
HOSTS = ("replay", "learner", "actors")  # host a, b, c of the namespace cluster
MIN_FORCED_UPDATES = 100  # fewer, and the first and last weights messages dominate bytes per update


def run_config(publish_every: int, steps: int, actors: int, transport: str, seed: int, **extra: Any) -> Any:
    from rlbench.config import RunConfig

    return RunConfig(placement="server", transport=transport, actors=actors, steps=steps, seed=seed,
                     eval_episodes=1, hyperparameters={"publish_every": publish_every}, out=None, **extra)


def summarise(publish_every: int, result: dict[str, Any]) -> dict[str, Any]:
    """One row: the learner's link bytes sent, per update, and each actor's bytes received."""
    roles = result["loop"]["roles"]
    learner = roles["learner"]
    updates = int(result["throughput"]["updates"])
    sent = int(learner["link"]["bytes_sent"])
    actors = {name: int(role["link"]["bytes_received"]) for name, role in sorted(roles.items())
              if name.startswith("actor-")}
    return {"publish_every": publish_every, "status": result["status"], "updates": updates,
            "env_steps": int(result["throughput"]["env_steps"]), "wall_s": result["timing"]["wall_s"],
            "learner_bytes_sent": sent, "learner_bytes_per_update": sent / updates if updates else None,
            "learner_messages_sent": int(learner["link"]["messages_sent"]), "actor_bytes_received": actors,
            "hosts": {name: role.get("host") for name, role in sorted(roles.items())},
            "weights_staleness": result["loop"].get("weights_staleness")}


def forced_updates(steps: int, actors: int) -> int:
    """The updates the learner must have made before the bench's run of `steps` can end (DQN's
    defaults): a run no longer than the actors' lead may end with no update, whatever publish_every is."""
    from rlbench.algorithms.dqn import DQNConfig
    from rlbench.runtime.distributed import roles

    return roles.forced_updates(DQNConfig(), steps, actors)


def minimum_steps(actors: int) -> int:
    """The fewest env steps that hold the learner to MIN_FORCED_UPDATES updates."""
    from rlbench.algorithms.dqn import DQNConfig
    from rlbench.runtime.distributed.roles import actors_lead

    hp = DQNConfig()
    return math.ceil(actors_lead(hp, actors) + MIN_FORCED_UPDATES * hp.train_every)


def publishes(publish_every: int, updates: int) -> int:
    """Weights messages learner 0 sends: the initial weights, one every publish_every updates, the final."""
    return 2 + updates // publish_every


def compare(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The ratio of bytes per update (new / old) against the target, and the split of the learner's
    bytes into the weights message W and the other bytes a per update (two equations, two unknowns)."""
    ratio = (new["learner_bytes_per_update"] / old["learner_bytes_per_update"]
             if new["learner_bytes_per_update"] and old["learner_bytes_per_update"] else None)
    split = None
    u1, u2 = old["updates"], new["updates"]
    n1, n2 = publishes(old["publish_every"], u1), publishes(new["publish_every"], u2)
    determinant = u1 * n2 - u2 * n1
    if determinant:
        b1, b2 = old["learner_bytes_sent"], new["learner_bytes_sent"]
        split = {"weights_message_bytes": (u1 * b2 - u2 * b1) / determinant,
                 "other_bytes_per_update": (b1 * n2 - b2 * n1) / determinant}
    return {"ratio": ratio, "target": TARGET_RATIO, "met": ratio is not None and ratio <= TARGET_RATIO,
            "derived": split}


def run_local(settings: tuple[int, int], steps: int, actors: int, transport: str, seed: int) -> list[dict[str, Any]]:
    from rlbench.runner import run, stop_series_if_signalled

    return [summarise(every, stop_series_if_signalled(run(run_config(every, steps, actors, transport, seed))))
            for every in settings]


def veth_counters(cluster: Any) -> dict[str, dict[str, int]]:
    """Each host's bytes and packets onto and off the bridge, read on its veth end in the root
    namespace (what the host transmits, that end receives)."""
    from pathlib import Path

    def read(end: str, name: str) -> int:
        return int(Path(f"/sys/class/net/{end}/statistics/{name}").read_text())

    return {host: {"tx_bytes": read(end, "rx_bytes"), "rx_bytes": read(end, "tx_bytes"),
                   "tx_packets": read(end, "rx_packets"), "rx_packets": read(end, "tx_packets")}
            for host, end in zip(HOSTS, cluster.host_ends)}


def _delta(after: dict[str, dict[str, int]], before: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    return {host: {key: after[host][key] - before[host][key] for key in after[host]} for host in after}


def run_netns(settings: tuple[int, int], steps: int, actors: int, transport: str,
              seed: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Both runs on one namespace cluster of three Ray nodes: replay on a (the head, with the driver),
    the learner on b, the actors on c; each host's veth counters around each run."""
    from rlbench.cluster.netns import namespace_cluster

    rows = []
    with namespace_cluster(nodes=3) as cluster:
        before = veth_counters(cluster)
        time.sleep(IDLE_SECONDS)
        idle = {host: {key: value / IDLE_SECONDS for key, value in counters.items()}
                for host, counters in _delta(veth_counters(cluster), before).items()}
        for every in settings:
            before = veth_counters(cluster)
            started = time.monotonic()
            done = cluster.rlbench(0, "run", "--launcher", "ray", "--ray-address", cluster.address,
                                   "--placement", "server", "--transport", transport, "--actors", str(actors),
                                   "--steps", str(steps), "--seed", str(seed), "--eval-episodes", "1",
                                   "--hp", f"publish_every={every}", "--place", "replay=rlb_a",
                                   "--place", "learner=rlb_b", "--place", "actors=rlb_c", "--no-out", "--json",
                                   timeout=1800)
            seconds = time.monotonic() - started
            veth = _delta(veth_counters(cluster), before)
            if done.returncode != 0:
                raise click.ClickException(f"publish_every={every} on the namespace cluster failed "
                                           f"({done.returncode}): {(done.stderr or done.stdout)[-2000:]}")
            row = summarise(every, json.loads(done.stdout))
            row["veth"] = veth
            row["veth_seconds"] = seconds
            rows.append(row)
        hosts = dict(zip(HOSTS, cluster.ips))
    return rows, {"hosts": hosts, "idle_veth_per_s": idle}


def _mb(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e6:,.2f}"


def format_rows(results: dict[str, Any]) -> str:
    rows, judged = results["rows"], results["comparison"]
    lines = [results["header"],
             f"{'publish_every':>13} {'updates':>8} {'learner MB sent':>16} {'B/update':>10} "
             f"{'msgs sent':>10} {'actor MB received':>22} {'wall s':>7}  status"]
    for r in rows:
        actors = " / ".join(_mb(v) for v in r["actor_bytes_received"].values())
        lines.append(f"{r['publish_every']:>13} {r['updates']:>8,} {_mb(r['learner_bytes_sent']):>16} "
                     f"{r['learner_bytes_per_update'] or 0:>10,.0f} {r['learner_messages_sent']:>10,} {actors:>22} "
                     f"{r['wall_s']:>7.1f}  {r['status']}")
    netns = results.get("netns")
    if netns:
        hosts = netns["hosts"]
        lines.append("veth counters of each host during each run (MB transmitted / received onto the bridge; "
                     "TCP/IP headers, ACKs and Ray's control traffic included):")
        for r in rows:
            cells = "  ".join(f"{host} {hosts[host]} {_mb(c['tx_bytes'])} / {_mb(c['rx_bytes'])}"
                              for host, c in r["veth"].items())
            learner_tx = r["veth"]["learner"]["tx_bytes"]
            lines.append(f"  publish_every={r['publish_every']:<3} {cells}   learner host tx / link bytes_sent "
                         f"{learner_tx / r['learner_bytes_sent']:.3f}")
        idle = "  ".join(f"{host} {c['tx_bytes'] / 1e3:,.1f} / {c['rx_bytes'] / 1e3:,.1f}"
                         for host, c in netns["idle_veth_per_s"].items())
        lines.append(f"  idle cluster, kB/s tx / rx over {IDLE_SECONDS:g} s: {idle}")
        per_update = [r["veth"]["learner"]["tx_bytes"] / r["updates"] if r["updates"] else None for r in (rows[0], rows[-1])]
        if all(per_update):
            lines.append(f"  learner host tx per update: {per_update[0]:,.0f} B and {per_update[1]:,.0f} B, "
                         f"ratio {per_update[1] / per_update[0]:.2%}")
    derived = judged["derived"]
    if derived:
        lines.append(f"derived from the two runs (bytes = a x updates + W x publishes): weights message "
                     f"W = {derived['weights_message_bytes']:,.0f} B, other learner bytes a = "
                     f"{derived['other_bytes_per_update']:,.0f} B per update")
    old, new = rows[0], rows[-1]
    ratio = judged["ratio"]
    lines.append(f"learner bytes per update, publish_every={new['publish_every']} / publish_every="
                 f"{old['publish_every']}: " + ("-" if ratio is None else f"{ratio:.2%}")
                 + f"   target <= {TARGET_RATIO:.0%} (issue #24): " + ("met" if judged["met"] else "NOT met"))
    lines.append(results["machine"] + (" (the namespace hosts' Ray processes are not this command's children: "
                                       "they count as other processes)" if netns else ""))
    return "\n".join(lines)


@click.command("weights")
@click.option("--steps", type=click.IntRange(min=1), default=DEFAULT_STEPS, show_default=True,
              help="env steps per run (at least enough that the rate limiter holds the learner to "
                   f"{MIN_FORCED_UPDATES} updates)")
@click.option("--old", "old_every", type=click.IntRange(min=1), default=1, show_default=True,
              help="publish_every of the baseline (the old default)")
@click.option("--publish-every", "new_every", type=click.IntRange(min=1), default=None,
              help="publish_every measured against it [default: DQN's default]")
@click.option("--actors", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--transport", default="tcp", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--local", is_flag=True, help="on this host (local launcher, loopback) instead of three namespace hosts")
@click.option("--json", "as_json", is_flag=True)
def command(steps: int, old_every: int, new_every: int | None, actors: int, transport: str, seed: int, local: bool,
            as_json: bool) -> None:
    """Learner bytes per update with weights published every update and at the default, each actor's
    bytes received, each host's veth counters (three network-namespace hosts; root) or --local, and
    the ratio beside issue #24's target."""
    from rlbench.algorithms.dqn import DQNConfig
    from rlbench.machine_state import summary_line, watch

    settings = (old_every, new_every or DQNConfig.publish_every)
    shortest = minimum_steps(actors)
    if steps < shortest:
        from rlbench.runtime.distributed.roles import actors_lead

        raise click.BadParameter(
            f"{steps:,} env steps: with {actors} actor(s) the rate limiter lets actors run "
            f"{actors_lead(DQNConfig(), actors):,.0f} env steps ahead of the learner, so the learner could end with "
            f"almost no update and the first and last weights messages would decide bytes per update; use at least "
            f"{shortest:,}", param_hint="--steps")
    if not local:
        from rlbench.cluster.netns import namespaces_unavailable

        reason = namespaces_unavailable()
        if reason:
            raise click.UsageError(f"three namespace hosts: {reason}; --local measures on this host")
    netns = None
    with watch(busy_processes=2 + actors) as machine:
        if local:
            rows = run_local(settings, steps, actors, transport, seed)
        else:
            rows, netns = run_netns(settings, steps, actors, transport, seed)
    where = ("this host (local launcher)" if local else
             "three hosts (network namespaces, Ray nodes): replay on a, learner on b, actors on c")
    results = {"rows": rows, "comparison": compare(rows[0], rows[1]), "netns": netns,
               "machine_state": machine.report(),
               "header": f"DQN CartPole-v1, placement server over {transport}, {actors} actors, {steps:,} env steps, "
                         f"seed {seed}, on {where}; all measured"}
    results["machine"] = summary_line(results["machine_state"])
    click.echo(json.dumps(results, indent=1, default=str) if as_json else format_rows(results))
